"""A model's replicas scaled live on a real Ray Serve: Ray actors started as queries pile up and
drained, then ended, once they stop, every query answered exactly once; a shared pool's workers
the same way, down to none and back for the next query. The model is an emulated accelerator
(a python model whose batch sleeps 40 ms + 5 ms a query, releasing the interpreter as a GPU
kernel does), so that its workers, not the two cores, set the capacity."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from ray.serve.context import _get_global_client
from ray.serve.schema import ServeDeploySchema

from raysrv.testing import model_spec, spec
from tests.integration.conftest import RayCluster, until

EMULATED = {"delay_s": 0.04, "per_item_s": 0.005}


def _deploy(policy: str) -> None:
    scaling = {
        "policy": policy,
        "min": 1,
        "max": 3,
        "every_s": 0.5,
        "window_s": 3.0,
        "slo_ms": 150,
        "target_ongoing": 2.0,
        "look_back_s": 1.0,
        "down_after_s": 2.0,
    }
    model = model_spec(
        "gpu",
        init_kwargs=EMULATED,
        autoscaling=scaling,
        batching={"policy": "fixed", "params": {"max_batch_size": 4}},
        resources={"num_cpus": 0.1},
    )
    _deploy_app("scaled", model)


def _deploy_app(name: str, *models: dict[str, Any], **extra: Any) -> None:
    """Deploy ``models`` as the raysrv application ``name`` (route ``/name``), an app of each
    named after it; ``extra``: more fields of the spec (``pools``)."""
    apps = [{"name": m["name"], "models": [m["name"]]} for m in models]
    args = spec(list(models), apps, ingress={"num_cpus": 0.1}, **extra)
    app = {"name": name, "route_prefix": f"/{name}", "import_path": "raysrv.app:build_app",
           "args": args}  # fmt: skip
    _get_global_client().deploy_apps(
        ServeDeploySchema.model_validate({"applications": [app]}), _blocking=True
    )


def _ask_until_switched(handle: Any, model: str, knob: str, value: int) -> None:
    """One caller asks ``model`` (at least 51 queries, at most 400) until its pool's ``knob``
    is ``value`` with nothing draining; every answer is the right one."""
    answers = []
    for i in range(400):
        answers.append(handle.predict.remote(model, [float(i), 1.0, 0.0, 0.0]).result())
        if i >= 50 and (s := _scaling(handle, model))[knob] == value and not s["draining"]:
            break
    assert [a["output"] for a in answers] == [i + 1.0 for i in range(len(answers))]


def _scaling(handle: Any, name: str = "gpu") -> dict[str, Any]:
    (pool,) = [p for p in handle.pools.remote().result() if p["name"] == name]
    return pool["autoscaling"] | {"workers": pool["workers"]}


@pytest.mark.parametrize("policy", ["analytic", "reactive"])
def test_replicas_follow_the_load_and_every_query_is_answered(
    serve_session: RayCluster, policy: str
) -> None:
    from ray import serve

    _deploy(policy)
    handle = serve.get_app_handle("scaled")
    first = _scaling(handle)
    assert first["in_service"] == 1
    assert first["cold_start_s"] > 0.0  # what the first worker's start took, until one is added

    def ask(i: int) -> dict[str, Any]:
        return handle.predict.remote("gpu", [float(i), 0.0, 0.0, 0.0]).result()

    # 16 callers at once: four times what one replica's batches of four keep up with
    with concurrent.futures.ThreadPoolExecutor(16) as callers:
        answers = list(callers.map(ask, range(600)))
        grown = _scaling(handle)
    assert all("output" in a for a in answers), [a for a in answers if "output" not in a][:3]
    assert [a["output"]["sum"] for a in answers] == [float(i) for i in range(600)]
    assert grown["in_service"] + len(grown["starting"]) > 1, grown
    pids = {a["output"]["pid"] for a in answers}
    assert len(pids) > 1  # answered by more than one worker process

    shrunk = until(
        lambda: (s := _scaling(handle))["in_service"] == 1 and not s["draining"] and s,
        30.0,
        "the idle pool back at one worker",
    )
    assert len(shrunk["workers"]) == 1  # the others ended, not only out of service
    after = handle.predict.remote("gpu", [1.0, 2.0, 3.0, 4.0]).result()
    assert after["output"]["sum"] == 10.0


def test_a_shared_pool_grows_for_a_burst_stops_when_idle_and_starts_for_the_next_query(
    serve_session: RayCluster,
) -> None:
    """A shared pool with ``autoscaling`` (reactive, ``min: 0``): a burst on its two models adds
    worker actors, which load the models on demand; once idle the pool ends every worker, and
    the next query starts one and is answered by it."""
    from ray import serve

    scaling = {"policy": "reactive", "min": 0, "max": 3, "every_s": 0.5, "target_ongoing": 2.0,
               "look_back_s": 1.0, "down_after_s": 1.0, "idle_s": 2.0}  # fmt: skip
    fixed = {"policy": "fixed", "params": {"max_batch_size": 4}}
    models = [model_spec(n, pool="shared", init_kwargs=EMULATED, batching=fixed) for n in "ab"]
    pool = {"name": "shared", "workers": 1, "memory_mb": 64, "resources": {"num_cpus": 0.1},
            "autoscaling": scaling}  # fmt: skip
    _deploy_app("pooled", *models, pools=[pool])
    handle = serve.get_app_handle("pooled")

    def ask(i: int) -> dict[str, Any]:
        return handle.predict.remote("ab"[i % 2], [float(i), 0.0, 0.0, 0.0]).result()

    with concurrent.futures.ThreadPoolExecutor(16) as callers:
        answers = list(callers.map(ask, range(600)))
        grown = _scaling(handle, "shared")
    assert [a.get("output", {}).get("sum") for a in answers] == [float(i) for i in range(600)]
    assert grown["in_service"] + len(grown["starting"]) > 1, grown
    assert len({a["output"]["pid"] for a in answers}) > 1

    stopped = until(
        lambda: (s := _scaling(handle, "shared"))["in_service"] == 0 and not s["workers"] and s,
        60.0,
        "the idle pool down to no worker",
    )
    assert stopped["last"]["workers"] == 0
    after = handle.predict.remote("b", [1.0, 2.0, 3.0, 4.0]).result()
    assert after["output"]["sum"] == 10.0
    assert _scaling(handle, "shared")["in_service"] == 1


def test_serf_profiles_switches_threads_live_and_shows_its_table(serve_session: RayCluster) -> None:
    """``policy: serf`` on Ray: profiled before serving, its table in the plan view, and a
    switch from the deployed one-thread worker to the table's one of two threads (an emulated
    accelerator whose query takes 4 ms on one thread and 1.5 times less on two) while a caller
    keeps asking; every query is answered, and the old worker ends."""
    from ray import serve

    scaling = {"policy": "serf", "min": 1, "max": 2, "threads": [1, 2], "cores": 2,
               "every_s": 0.5, "window_s": 2.0, "down_after_s": 0.0}  # fmt: skip
    model = model_spec(
        "curve",
        source="raysrv.testing:CurveModel",
        init_kwargs={"base_s": 0.004, "scaling": 0.6, "interference": 0.15},
        autoscaling=scaling,
        resources={"num_cpus": 0.1},
    )
    _deploy_app("serf", model)
    handle = serve.get_app_handle("serf")
    _ask_until_switched(handle, "curve", "threads", 2)  # a light load: the faster worker wins
    switched = until(
        lambda: (s := _scaling(handle, "curve"))["threads"] == 2 and not s["draining"] and s,
        30.0,
        "the pool on one worker of two threads",
    )
    assert switched["in_service"] == 1
    assert len(switched["workers"]) == 1
    assert switched["last"]["threads"] == 2
    plan = handle.plan.remote("curve").result()
    configurations = plan["configurations"]
    assert configurations["in_force"] == {"workers": 1, "threads": 2, "lanes": 1}
    rates = {(r["threads"], r["lanes"]): r["mu"] for r in configurations["rates"]}
    assert sorted(rates) == [(1, 1), (2, 1)]
    assert (len(rates[1, 1]), len(rates[2, 1])) == (2, 1)
    assert configurations["table"][0]["best"]["threads"] == 2
    rows = [row["load"] for row in configurations["table"]]
    assert rows == sorted(rows)
    assert len(rows) == 20


def test_serf_switches_two_worker_processes_to_two_lanes_of_one_live(
    serve_session: RayCluster,
) -> None:
    """``lanes`` on Ray: a table of lanes only (SERF with ``lanes: [2]``, at least two
    workers) replaces the deployed two one-lane worker actors with two lanes of one actor
    while a caller keeps asking; every query is answered, the old actors end, and both
    workers then answer from one process."""
    from ray import serve

    scaling = {"policy": "serf", "min": 2, "max": 2, "threads": [1], "lanes": [2], "cores": 2,
               "every_s": 0.5, "window_s": 2.0, "down_after_s": 0.0}  # fmt: skip
    model = model_spec(
        "laned",
        source="raysrv.testing:CurveModel",
        init_kwargs={"base_s": 0.004, "interference": 0.0},
        autoscaling=scaling,
        resources={"num_cpus": 0.1},
    )
    _deploy_app("lanes", model)
    handle = serve.get_app_handle("lanes")
    _ask_until_switched(handle, "laned", "lanes", 2)
    switched = until(
        lambda: (s := _scaling(handle, "laned"))["lanes"] == 2 and not s["draining"] and s,
        30.0,
        "the pool on two lanes of one worker process",
    )
    assert switched["in_service"] == 2
    assert [w["worker"] for w in switched["workers"]] == [2, 3]  # workers 0 and 1 ended
    assert len({w["process"]["pid"] for w in switched["workers"]}) == 1
    plan = handle.plan.remote("laned").result()["configurations"]
    assert plan["in_force"] == {"workers": 2, "threads": 1, "lanes": 2}
    assert [(r["threads"], r["lanes"], len(r["mu"])) for r in plan["rates"]] == [(1, 2, 2)]


def test_replicas_in_lanes_start_as_one_process_that_runs_their_batches_side_by_side(
    serve_session: RayCluster,
) -> None:
    """``replicas: 2, lanes: 2`` without autoscaling: one worker actor whose two lanes each
    take batches; callers at once are answered from it, batches overlapping in time."""
    from ray import serve

    model = model_spec(
        "two-lanes",
        init_kwargs={"delay_s": 0.2},
        replicas=2,
        lanes=2,
        batching={"policy": "fixed", "params": {"max_batch_size": 1}},
        resources={"num_cpus": 0.1},
    )
    _deploy_app("laned", model)
    handle = serve.get_app_handle("laned")
    (pool,) = [p for p in handle.pools.remote().result() if p["name"] == "two-lanes"]
    assert [w["worker"] for w in pool["workers"]] == [0, 1]
    assert len({w["process"]["pid"] for w in pool["workers"]}) == 1
    with concurrent.futures.ThreadPoolExecutor(4) as callers:
        asked = [
            callers.submit(lambda i: handle.predict.remote("two-lanes", [i, 0, 0, 0]).result(), i)
            for i in range(4)
        ]
        answers = [a.result()["output"] for a in asked]
    assert [a["sum"] for a in answers] == [0.0, 1.0, 2.0, 3.0]
    assert len({a["pid"] for a in answers}) == 1
    columns = handle.timeline.remote("two-lanes").result()
    rows = [dict(zip(columns, r, strict=True)) for r in zip(*columns.values(), strict=True)]
    runs = {w: [(r["started"], r["ended"]) for r in rows if r["worker"] == w and r["size"]]
            for w in (0, 1)}  # fmt: skip
    assert any(s0 < e1 and s1 < e0 for s0, e0 in runs[0] for s1, e1 in runs[1])
