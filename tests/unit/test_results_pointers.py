"""Every pointer into the benchmark results names a section that is there: a docstring, a doc or
the results themselves citing ``bench/RESULTS.md, "Name"`` find a heading or a bold lead-in that
begins with Name, and ``bench/RESULTS_ARCHIVE.md, "Name"`` (in the results, ``archive, "Name"``)
one of the archive's headings holding Name. The archive's own pointers are history, as of their
day, and are not checked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
RESULTS = "bench/RESULTS.md"
ARCHIVE = "bench/RESULTS_ARCHIVE.md"
THIS = Path(__file__).relative_to(ROOT).as_posix()
# a file named, then what stands between it and the first quoted name: ``'s``, a comma, a colon,
# a bracket, "section"; more names may follow, each after a comma or "and"
POINTER = re.compile(
    r"(?P<file>RESULTS(?:_ARCHIVE)?\.md|\barchive)`*(?:'s)?[\s,:(]*(?:section\s+)?"
    r'(?P<names>"[^"]+"(?:(?:,\s*|\s+and\s+)"[^"]+")*)'
)


def _plain(text: str) -> str:
    """``text`` on one line, lower case, without a comment's ``#`` where it was wrapped."""
    return re.sub(r"\s+", " ", re.sub(r"\n\s*#", " ", text)).strip().rstrip(":.").lower()


def _labels(path: str) -> list[str]:
    text = (ROOT / path).read_text()
    headings = re.findall(r"(?m)^#+ (.*)$", text)
    leads = re.findall(r"\*\*([^*]+)\*\*", text)
    return [_plain(label) for label in headings + leads]


def _pointers() -> list[tuple[str, int, str, str]]:
    """(file, line, the file pointed at, the name) of every pointer outside the archive and
    this file."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for path in tracked:
        if path in (ARCHIVE, THIS):
            continue  # the archive's pointers are history; this file's, examples
        text = (ROOT / path).read_text()
        for match in POINTER.finditer(text):
            pointed = match["file"]
            if pointed == "archive" and path != RESULTS:
                continue  # "archive" names the results' archive in the results alone
            target = RESULTS if pointed == "RESULTS.md" else ARCHIVE
            line = text.count("\n", 0, match.start()) + 1
            for name in re.findall(r'"([^"]+)"', match["names"]):
                found.append((path, line, target, _plain(name)))
    return found


def test_every_pointer_into_the_results_names_a_section_there() -> None:
    pointers = _pointers()
    assert len(pointers) > 50  # the pattern still finds the project's pointers
    results, archive = _labels(RESULTS), _labels(ARCHIVE)
    missing = [
        f"{path}:{line}: {target}, {name!r}"
        for path, line, target, name in pointers
        if not (
            any(label.startswith(name) for label in results)
            if target == RESULTS
            else any(name in label for label in archive)
        )
    ]
    assert not missing, "pointers to no section:\n" + "\n".join(missing)


def test_a_pointer_to_a_section_that_is_not_there_is_found() -> None:
    quoted = 'see bench/RESULTS.md, "No such section", and `bench/RESULTS_ARCHIVE.md`, "x" and "y"'
    names = [m["names"] for m in POINTER.finditer(quoted)]
    assert names == ['"No such section"', '"x" and "y"']
    assert not any(label.startswith("no such section") for label in _labels(RESULTS))
