"""bench.ingress_cost: its requests are answered on the route it is told, app's or model's."""

from __future__ import annotations

import asyncio

import pytest

from bench.ingress_cost import MODEL_ROUTE, ROUTE, measure


@pytest.mark.parametrize("route", [ROUTE, MODEL_ROUTE])
def test_every_request_is_answered_on_the_route_measured(route: str) -> None:
    """``measure`` raises on any answer but a 200 (a 404 for a route it does not serve)."""
    (rate, cpu_us), *more = asyncio.run(measure(64, 1, clients=4, route=route))
    assert not more
    assert rate > 0.0
    assert cpu_us > 0.0


def test_a_route_the_ingress_does_not_serve_fails_the_measure() -> None:
    with pytest.raises(RuntimeError, match="answered 404"):
        asyncio.run(measure(8, 1, clients=2, route="/v1/models/nothing/predict"))
