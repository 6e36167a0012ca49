"""The README's code blocks, as tests run them: each command the README gives is run by a test
(or by `.ci/run`) as it is written there, with only its address or port made this test's."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["README", "blocks", "commands"]

README = Path(__file__).parents[1] / "README.md"


def blocks(heading: str, language: str) -> list[str]:
    """The ``language`` code blocks of the README's section ``heading`` (a heading line, such
    as ``### Calling from Python``), up to the next heading of its level or above."""
    text = README.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    rest = text[start + len(heading) + 2 :]
    prose = re.sub(r"```.*?```", lambda m: " " * len(m.group()), rest, flags=re.S)
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", prose, re.M)]
    section = rest[: ends[0]] if ends else rest
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def commands() -> list[str]:
    """Every command of the README's bash blocks (continued lines joined, comments and shell
    variables' assignments of output kept as written), in order."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                found.append(re.sub(r"\s+", " ", line))
    return found
