"""raysrv's Grafana dashboard: the copy kept in the repository is what `raysrv dashboard`
prints, its panels are well formed, and `raysrv dashboard push` sends it to Grafana's API.

No Grafana server can run here, so the push goes to a stand-in HTTP server that answers as
Grafana's dashboard API does and records what it got; the queries themselves are checked
against a real Prometheus in ``tests/integration/test_monitoring.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from raysrv import dashboard
from raysrv.cli import main

SHIPPED = Path(__file__).parents[2] / "clusters" / "monitoring" / "raysrv-dashboard.json"


def test_the_shipped_dashboard_is_what_raysrv_dashboard_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["dashboard"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == dashboard.dashboard() == json.loads(SHIPPED.read_text())


def test_every_panel_has_queries_on_raysrv_series_and_a_place_of_its_own() -> None:
    board = dashboard.dashboard()
    panels = board["panels"]
    assert len(panels) == len(dashboard.PANELS)
    assert len({p["id"] for p in panels}) == len(panels)
    places = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}
    assert len(places) == len(panels)
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert "ray_raysrv_" in target["expr"]
            assert target["datasource"]["uid"] == "${datasource}"
    exprs = dashboard.queries(rate_interval="1m")
    assert len(exprs) == sum(len(p["targets"]) for p in panels)
    assert not any("$__rate_interval" in e for e in exprs)


class _Grafana(BaseHTTPRequestHandler):
    """Answers ``POST /api/dashboards/db`` as Grafana does, keeping each request."""

    got: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - the handler's name is http.server's
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.got.append({"path": self.path, "auth": self.headers["Authorization"], "body": body})
        uid = body["dashboard"]["uid"]
        answer = json.dumps({"id": 1, "uid": uid, "url": f"/d/{uid}/raysrv", "status": "success"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def grafana() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Grafana)
    _Grafana.got = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Grafana.got
    finally:
        server.shutdown()
        server.server_close()


def test_raysrv_dashboard_push_creates_or_replaces_it_through_grafanas_api(
    grafana: tuple[str, list[dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, got = grafana
    assert main(["dashboard", "push", "--url", url, "--token", "glsa_secret"]) == 0
    assert f"success at {url}/d/raysrv/raysrv" in capsys.readouterr().out
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_from_env")
    assert main(["dashboard", "push", "--url", url, "--folder-uid", "ops"]) == 0
    first, second = got
    assert first["path"] == second["path"] == "/api/dashboards/db"
    assert first["auth"] == "Bearer glsa_secret"
    assert second["auth"] == "Bearer glsa_from_env"
    assert first["body"]["dashboard"] == dashboard.dashboard()
    assert first["body"]["overwrite"] is True
    assert "folderUid" not in first["body"]
    assert second["body"]["folderUid"] == "ops"


def test_a_push_without_a_token_says_what_it_needs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert main(["dashboard", "push", "--url", "http://127.0.0.1:1"]) == 2
    assert "--token" in capsys.readouterr().out
