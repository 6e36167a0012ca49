"""The ``raysrv`` command line: ``raysrv validate config.yaml [...]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _validate(files: Sequence[str]) -> int:
    from raysrv.validate import validate_file

    failed = 0
    for name in files:
        problems = validate_file(name)
        if problems:
            failed += 1
            print(f"{name}: {len(problems)} problem(s)")
            for problem in problems:
                print(f"  {problem}")
        else:
            print(f"{name}: ok")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raysrv", description="raysrv model serving tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("validate", help="Check config files without starting Ray.")
    check.add_argument("files", nargs="+", help="Serve config or raysrv spec YAML files.")
    args = parser.parse_args(argv)
    if args.command == "validate":
        return _validate(args.files)
    parser.error(f"unknown command {args.command}")  # pragma: no cover - argparse exits first
    return 2


if __name__ == "__main__":
    sys.exit(main())
