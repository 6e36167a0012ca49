"""Every command the README gives is run by a test or by `.ci/run`: the commands of its shell
blocks, and those of its prose that name a shipped file, each listed here with what runs it.
A command added to the README without a test fails here until one runs it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.readme import README, commands

ROOT = Path(__file__).parents[2]
QUICKSTART_QUERIES = ("tests/e2e/test_digits.py", "test_the_readmes_quickstart_queries_answer")
LONG_LIVED = "tests/e2e/test_long_lived.py"
# Each command, and (the file, a name defined or a text found in it) that runs it as written
# but for its port or address. `ray stop` alone is not run: it stops every Ray of the machine,
# this test session's own included; the long-lived test stops its head as Ctrl-C does.
RUN_BY: dict[str, tuple[str, str] | None] = {
    'pip install torch==2.13.0 -e ".[examples]" && raysrv run examples/digits/config.yaml': (
        "tests/e2e/test_digits.py",
        '"haproxy": ("raysrv", "run")',
    ),
    'pip install torch==2.13.0 -e ".[test]" && python -m pytest': (
        ".ci/run",
        'pip install -q torch==2.13.0 -e ".[test]" && python -m pytest',
    ),
    "answer=$(curl -s localhost:8000/v1/digits/predict": QUICKSTART_QUERIES,
    'echo "$answer"': QUICKSTART_QUERIES,
    'id=$(echo "$answer"': QUICKSTART_QUERIES,
    "curl -s localhost:8000/v1/digits/feedback": QUICKSTART_QUERIES,
    "export RAY_SERVE_ENABLE_HA_PROXY=1": (LONG_LIVED, "test_the_readme_runs_the_server_with"),
    "ray start --head --metrics-export-port=8080": (LONG_LIVED, "def head("),
    "raysrv deploy examples/digits/config.yaml": (LONG_LIVED, "def _deploy("),
    "ray stop": None,
    "curl -s localhost:8080/metrics | grep '^ray_raysrv_requests_total'": (LONG_LIVED, "METRICS"),
    "prometheus --config.file=clusters/monitoring/prometheus.yml": (
        "tests/integration/test_monitoring.py",
        'SHIPPED = ROOT / "clusters" / "monitoring" / "prometheus.yml"',
    ),
    "raysrv dashboard push --url http://localhost:3000": (
        "tests/unit/test_dashboard.py",
        'main(["dashboard", "push", "--url", url, "--token"',
    ),
    "raysrv run examples/text/config.yaml": ("tests/e2e/test_text.py", '"raysrv")), "run"'),
    "raysrv run examples/partitioned/config.yaml": (
        "tests/e2e/test_partitioned.py",
        '"raysrv")), "run"',
    ),
    "apt-get install redis-server": (".ci/run", "missing+=(redis-server)"),
    "apt-get install prometheus": (".ci/run", "missing+=(prometheus)"),
}


def _named_in_prose() -> list[str]:
    """The commands of the README's prose that name a shipped file or install a package."""
    prose = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    spans = re.findall(r"`((?:raysrv|serve|ray|python|curl|pip|apt-get) [^`]*)`", prose)
    return [s for s in spans if "examples/" in s or s.startswith("apt-get install")]


def test_every_readme_command_is_run_by_a_test_or_by_ci() -> None:
    given = commands() + _named_in_prose()
    unlisted = [c for c in given if not any(c.startswith(known) for known in RUN_BY)]
    assert unlisted == [], "README commands that no test runs"
    gone = [k for k in RUN_BY if not any(c.startswith(k) for c in given)]
    assert gone == [], "listed commands the README no longer gives"
    for command, runner in RUN_BY.items():
        if runner is None:
            continue
        path, text = runner
        assert text in (ROOT / path).read_text(), f"{path} does not run {command!r}"
