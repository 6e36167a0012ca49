"""A saved run of the many-model benchmark draws its plots again without being run again."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.loadgen import RequestLog
from bench.many_models import replot


def test_a_saved_run_draws_its_plots_again_from_its_request_logs(tmp_path: Path) -> None:
    log = RequestLog(scheduled=[0.0, 0.1, 0.2], sent=[0.0, 0.1, 0.2], done=[0.05, 0.3, 0.21])
    log.status.extend([200, 504, 429])
    saved = {
        "args": {"slo_ms": 100.0},
        "capacities": {"trace": 10.0},
        "logs": {"trace": {"raysrv": asdict(log), "multiplexed": asdict(log)}},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(saved))
    replot(path, tmp_path / "figures")
    for name in ("many_models_cdf.png", "many_models_goodput.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 0
    del saved["logs"]
    path.write_text(json.dumps(saved))
    with pytest.raises(SystemExit, match="no request logs"):
        replot(path, tmp_path / "older")
