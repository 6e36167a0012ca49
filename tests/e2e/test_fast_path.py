"""The serving and pool tests of the integration tier again, on a Ray started with Serve's fast
path (`raysrv run`'s environment: HAProxy ingress, gRPC between handles and replicas, user code
on the replica's main thread).

Serve reads that environment once per process, as it is imported, so the run is a separate
pytest process with its own Ray session. It covers handle calls from another application,
HTTP through the ingress, live `user_config` changes, the Ray metrics endpoint, redeploys and
shared pools.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from raysrv.cli import FAST_PATH
from tests.conftest import haproxy_ports
from tests.integration.conftest import SEPARATE_LOOP

ROOT = Path(__file__).parents[2]
SUITES = ["tests/integration/test_serving.py", "tests/integration/test_pools.py"]


def test_the_serving_and_pool_tests_pass_under_serves_fast_path() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | FAST_PATH | haproxy_ports()
    env[SEPARATE_LOOP] = "1"  # for the test process's own handles only: see its conftest
    # A deleted application's ingress stays reachable this long so that HAProxy stops sending
    # it requests first (30 s by default); HAProxy on this one machine reloads within it, and
    # the tier deletes its applications after every test.
    env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "2"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.fullmatch(r"\d+ passed(, \d+ warnings?)? in .*", summary), summary  # none skipped
