"""raysrv.partitioning is pure planning code: importing it must not pull in Ray."""

from __future__ import annotations

import subprocess
import sys


def test_partitioning_imports_without_ray() -> None:
    code = "import sys, raysrv.partitioning; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
