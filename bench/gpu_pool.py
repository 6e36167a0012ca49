"""A pool's worker on a GPU: LOAD, INFER and UNLOAD of torch models on CUDA, and a many-model
pool on one GPU live against its simulation. No Ray: the worker (:class:`PoolWorker`) and the
pool's live driver (:class:`Pool` over :class:`ColocatedWorkers`) run in this process, as a
colocated pool's do in the ingress.

Usage::

    python -m bench.gpu_pool [--device gpu] [--hosted] [--parts worker pool] [--out FILE]
    python -m bench.gpu_pool --device cpu --quick     # a check anywhere, in 20 s
    python -m bench.gpu_pool --resimulate FILE        # a saved run's points simulated again

Models: :func:`convnet`, a residual convolutional network of the kind Clockwork serves (a stem,
four stages of two residual blocks, a linear head) whose weights are drawn from its ``seed``, so
that each model of a set is distinct. What it measures:

* ``worker``: each LOAD's time, the weights it counts and what the device's memory grew by
  (:func:`raysrv._workers.device_bytes`), a LOAD past the capacity refused, the INFER run times
  of each batch size (the input's copy to the device and the output's back included) with their
  spread, and what each UNLOAD gives back. Clockwork (§2, Fig. 2) rests on a GPU running a batch
  in about the same time every time; the same model's runs on the CPU are measured beside.
* ``pool``: ``--models`` models on one worker whose capacity holds ``--resident`` of them, Zipf
  popularity, Poisson arrivals at ``--loads`` of the capacity measured just before (a closed
  loop of 32), a deadline ``--slo-ms`` after each arrival. Each point is then simulated
  (:func:`raysrv.analytics.poolsim.simulate_pool`) on the same arrivals from what the live
  pool measured (:func:`simulate_point`), and the attainments compared. Each point starts
  with a lead-in at its rate that neither side counts, so that both count from a pool
  already holding the popular models.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import platform
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import refusal_reason
from raysrv.batching import make_policy
from raysrv.batching.profile import interpolate_batches
from raysrv.config import ModelSpec, PoolSpec, ResolvedPool, resolve_pools

__all__ = ["convnet", "main"]

CONCURRENCY = 32  # the closed loop that measures a pool's capacity
ZIPF_S = 1.1
MIN_RUNS = 10  # batches of a size behind the simulated run time of that size


_HOST: dict[tuple[int, int, int], dict[str, Any]] = {}  # weights kept in host memory


def convnet(seed: int, width: int = 32, classes: int = 1000, hosted: bool = False) -> Any:
    """A residual network with weights drawn from ``seed`` (a ``torch.nn.Module``). With
    ``hosted``, the weights are drawn once and kept in this process's memory, and each call
    builds the network around them without drawing again: a LOAD is then mostly the copy to
    the device, as in Clockwork, which keeps every model's weights in host memory (§4.5, §5.1)."""
    import torch

    key = (seed, width, classes)
    if not hosted:
        return _drawn(seed, width, classes)
    if key not in _HOST:
        _HOST[key] = _drawn(seed, width, classes).state_dict()
    with torch.device("meta"):
        model = _network(width, classes)
    model.load_state_dict(_HOST[key], assign=True)  # ``to(device)`` copies, the host keeps them
    return model


def _drawn(seed: int, width: int, classes: int) -> Any:
    import torch

    model = _network(width, classes)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:  # He-scaled, so that activations keep their size through the depth
                scale = math.sqrt(2.0 / p[0].numel())
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
        model[-1].bias.zero_()  # the head's, which torch drew from its global generator
    return model


def _network(width: int, classes: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, inner: int, out: int, stride: int) -> None:
            super().__init__()
            self.a = nn.Conv2d(inner, out, 3, stride, 1, bias=False)
            self.na = nn.BatchNorm2d(out)
            self.b = nn.Conv2d(out, out, 3, 1, 1, bias=False)
            self.nb = nn.BatchNorm2d(out)
            self.skip: nn.Module = nn.Identity()
            if stride != 1 or inner != out:
                self.skip = nn.Conv2d(inner, out, 1, stride, bias=False)

        def forward(self, x: Any) -> Any:
            y = self.nb(self.b(torch.relu(self.na(self.a(x)))))
            return torch.relu(y + self.skip(x))

    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width)]
    layers += [nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    inner = width
    for i, out in enumerate((width, 2 * width, 4 * width, 8 * width)):
        layers += [Block(inner, out, 1 if i == 0 else 2), Block(out, out, 1)]
        inner = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inner, classes)]
    return nn.Sequential(*layers)


@cache
def weight_bytes(width: int) -> int:
    """What a :func:`convnet` of ``width`` takes: its parameters and buffers."""
    model = convnet(0, width)
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def one_worker_pool(
    args: argparse.Namespace, count: int, slots: int
) -> tuple[ResolvedPool, list[ModelSpec]]:
    """A colocated pool of one worker on ``args.device`` holding ``slots`` of ``count`` models."""
    weight = weight_bytes(args.width)
    gpu = args.device == "gpu"
    pool = PoolSpec(
        name="pool",
        workers=1,
        device=args.device,
        resources={"num_gpus": 1 if gpu else 0, "threads": 1},
        placement="colocated",
        memory_mb=(slots * weight + 1024) / (1 << 20),
    )
    kwargs = {"width": args.width, "hosted": args.hosted}
    template = {
        "runtime": "torch",
        "source": "bench.gpu_pool:convnet",  # importable by name, also under -m
        "input": {"shape": [3, args.side, args.side]},
        "pool": "pool",
        "group": "convnet",
        "weights_mb": weight / (1 << 20),
        "slo_ms": args.slo_ms,
        "warm_up": True,
    }
    models = [
        ModelSpec.model_validate(
            {**template, "name": f"m{i:04d}", "init_kwargs": {"seed": i, **kwargs}}
        )
        for i in range(count)
    ]
    return resolve_pools([pool], models)[0], models


def _spread(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000.0
    p50, p99 = np.percentile(ms, [50, 99])
    return {
        "runs": int(ms.size),
        "p50_ms": float(p50),
        "p99_ms": float(p99),
        "max_ms": float(ms.max()),
        "cv": float(ms.std() / ms.mean()),
        "within_5pct": float(np.mean(np.abs(ms - p50) <= 0.05 * p50)),
    }


def _image(args: argparse.Namespace, n: int = 1) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.random((n, 3, args.side, args.side), dtype=np.float32)


async def measure_worker(args: argparse.Namespace) -> dict[str, Any]:
    """LOADs (the third past a capacity of two), run times by batch size, UNLOADs."""
    from raysrv._workers import Call, PoolWorker, device_bytes

    resolved, models = one_worker_pool(args, 3, slots=2)
    worker = PoolWorker(resolved.capacity_bytes, [])
    loads = []
    for model in models:
        spec = resolved.worker_model(model).model_dump(mode="json")
        (report,) = await worker.run([Call("load", model.name, spec=spec)])
        loads.append(
            {
                "status": report.status,
                "ms": report.duration * 1000.0,
                "weight_bytes": report.weight_bytes,
                "device_growth": report.device_growth,
                "rss_growth": report.rss_growth,
                "device_bytes_after": device_bytes(),
            }
        )
        print(f"  LOAD {model.name}: {loads[-1]}", flush=True)
    runs = {}
    for size in args.sizes:
        batch = _image(args, size)
        seconds = []
        for i in range(args.warm + args.runs):
            (report,) = await worker.run([Call("infer", models[0].name, inputs=batch)])
            if i >= args.warm:
                seconds.append(report.duration)
        runs[size] = _spread(seconds)
        print(f"  {args.device} batch of {size}: {runs[size]}", flush=True)
    unloads = []
    for model in models[:2]:
        before = device_bytes()
        (report,) = await worker.run([Call("unload", model.name)])
        after = device_bytes()
        unloads.append({"ms": report.duration * 1000.0, "device_before": before, "after": after})
    print(f"  UNLOADs: {unloads}", flush=True)
    return {"loads": loads, "runs": runs, "unloads": unloads, "cpu_runs": _cpu_runs(args)}


def _cpu_runs(args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """The same model's run times on the CPU, one thread, as a CPU worker runs it."""
    from raysrv.runtimes import TorchRuntime

    runtime = TorchRuntime("bench.gpu_pool:convnet", "cpu", 1, seed=0, width=args.width)
    runs = {}
    for size in args.cpu_sizes:
        batch = _image(args, size)
        seconds = []
        for i in range(2 + args.cpu_runs):
            start = time.perf_counter()
            runtime.predict_batch(batch)
            if i >= 2:
                seconds.append(time.perf_counter() - start)
        runs[size] = _spread(seconds)
        print(f"  cpu batch of {size}: {runs[size]}", flush=True)
    return runs


class _Log:
    """Each query of a point: when it was submitted, its model and when and how it ended."""

    def __init__(self) -> None:
        self.sent: list[float] = []
        self.models: list[int] = []
        self.done: list[float] = []
        self.status: list[str] = []

    def add(self, pool: Any, model: int, name: str, x: np.ndarray, slo_s: float) -> Any:
        i, now = len(self.sent), time.monotonic()
        self.sent.append(now)
        self.models.append(model)
        self.done.append(math.nan)
        self.status.append("")
        try:
            future = pool.submit(name, x, deadline=now + slo_s)
        except Exception as exc:  # refused at once (a full queue)
            self._end(i, type(exc).__name__)
            return None
        future.add_done_callback(lambda f: self._end(i, _outcome(f)))
        return future

    def _end(self, i: int, status: str) -> None:
        self.done[i], self.status[i] = time.monotonic(), status


def _outcome(future: asyncio.Future[Any]) -> str:
    if future.cancelled():
        return "cancelled"
    error = future.exception()
    return "ok" if error is None else f"{type(error).__name__}: {refusal_reason(str(error))}"


async def closed_loop(
    pool: Any, names: list[str], p: np.ndarray, x: np.ndarray, args: Any
) -> float:
    """Answers per second to ``CONCURRENCY`` callers that each send again once answered."""
    rng = np.random.default_rng(3)
    log, end = _Log(), time.monotonic() + args.capacity_seconds

    async def caller() -> None:
        while time.monotonic() < end:
            m = int(rng.choice(len(names), p=p))
            future = log.add(pool, m, names[m], x, args.slo_ms / 1000.0)
            if future is not None:
                await asyncio.wait([future])
            else:
                await asyncio.sleep(0.001)

    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    return float(np.sum(np.asarray(log.status) == "ok") / args.capacity_seconds)


async def open_loop(
    pool: Any,
    names: list[str],
    p: np.ndarray,
    x: np.ndarray,
    rate: float,
    seconds: float,
    seed: int,
    slo_s: float,
) -> _Log:
    """Poisson arrivals at ``rate`` for ``seconds``, each of a model drawn from ``p``."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2) + 10))
    offsets = offsets[offsets < seconds]
    models = rng.choice(len(names), offsets.size, p=p)
    log, start, pending = _Log(), time.monotonic(), []
    i = 0
    while i < offsets.size:
        now = time.monotonic() - start
        while i < offsets.size and offsets[i] <= now:
            pending.append(log.add(pool, int(models[i]), names[models[i]], x, slo_s))
            i += 1
        if i < offsets.size:
            await asyncio.sleep(max(0.0, offsets[i] - (time.monotonic() - start)))
    futures = [f for f in pending if f is not None]
    if futures:
        await asyncio.wait(futures)
    return log


def _profile(pool: Any, names: list[str]) -> tuple[dict[int, float], float]:
    """The group's run time per batch size (the median over its models' medians, each counted
    as often as it ran, over sizes run at least ``MIN_RUNS`` times) and median LOAD time (s)."""
    medians: dict[int, list[float]] = collections.defaultdict(list)
    counts: dict[int, list[int]] = collections.defaultdict(list)
    loads = []
    for name in names:
        described = pool.describe_model(name)
        for k, v in described["batch_seconds"]["p50"].items():
            if v is not None:
                medians[int(k)].append(v)
                counts[int(k)].append(described["batch_counts"].get(k, 0))
        if described["load_ms"]["p50"] is not None:
            loads.append(described["load_ms"]["p50"] / 1000.0)
    table = {}
    for k in sorted(medians):
        if sum(counts[k]) >= MIN_RUNS:
            order = np.argsort(medians[k])
            weights = np.cumsum(np.asarray(counts[k])[order])
            middle = int(np.searchsorted(weights, weights[-1] / 2.0))
            table[k] = float(np.asarray(medians[k])[order][middle])
    return table, float(np.median(loads)) if loads else 0.0


def _service(table: dict[int, float]) -> Any:
    """Seconds a batch of k runs, from ``table``'s sizes as the scheduler reads its own."""
    sizes = sorted(table)
    seconds = [table[k] for k in sizes]
    return lambda k: float(interpolate_batches(sizes, seconds, k))


async def measure_pool(args: argparse.Namespace) -> dict[str, Any]:
    """The many-model points, live, each then simulated (:func:`simulate_point`)."""
    from raysrv._pool import Pool
    from raysrv._workers import ColocatedWorkers

    slo_s = args.slo_ms / 1000.0
    resolved, models = one_worker_pool(args, args.models, slots=args.resident)
    names = [m.name for m in models]
    if args.hosted:  # every model's weights in host memory before the first query
        for model in models:
            convnet(**model.init_kwargs)
    rank = np.arange(1, len(names) + 1, dtype=float) ** -ZIPF_S
    p = rank / rank.sum()
    x = _image(args)[0]
    pool = Pool(resolved, ColocatedWorkers(resolved, metrics=False))
    for model in models:
        pool.add_model(model, make_policy("deadline", _params(args), slo_s))
    await pool.profile()
    capacity = await closed_loop(pool, names, p, x, args)
    print(f"  capacity {capacity:.1f} answers/s", flush=True)
    t0 = time.time() - time.monotonic()  # the wall clock's time at the monotonic one's 0
    points = []
    for n, load in enumerate(args.loads):
        rate = load * capacity
        live = await open_loop(pool, names, p, x, rate, args.lead + args.seconds, n, slo_s)
        table, load_s = _profile(pool, names)
        point = {
            "load": load,
            "rate": rate,
            "sent": live.sent,
            "done": live.done,
            "status": live.status,
            "models": live.models,
            "t0": t0,
            "timeline": pool.timeline(since=t0 + live.sent[0] - 1.0),
            "table_ms": {k: v * 1000.0 for k, v in table.items()},
            "load_ms": load_s * 1000.0,
        }
        point.update(simulate_point(point, args, resolved))
        points.append(point)
    described = await pool.describe()
    await pool.close()
    return {
        "capacity": capacity,
        "points": points,
        "loads": described["loads"],
        "evictions": described["evictions"],
        "peak_bytes": [w["process"].get("peak_bytes") for w in described["workers"]],
        "planned_peak_bytes": [w.get("peak_bytes") for w in described["workers"]],
        "capacity_bytes": resolved.capacity_bytes,
    }


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_batch_size": args.max_batch}


def simulate_point(
    point: dict[str, Any], args: argparse.Namespace, resolved: ResolvedPool
) -> dict[str, Any]:
    """A live point's attainment and why its queries were refused, beside two simulations of
    its arrivals: ``simulated``, each batch's and LOAD's time drawn from the live ones
    (:class:`_Drawn`); ``replayed``, the
    live pool's timeline replayed as the weather
    (:func:`raysrv.analytics.poolsim.replayed_weather`), as ``bench.many_models`` does."""
    from raysrv.analytics.poolsim import replayed_weather

    slo_s = args.slo_ms / 1000.0
    sent = np.asarray(point["sent"])
    counted = sent >= sent[0] + args.lead
    status = np.asarray(point["status"])
    took = np.asarray(point["done"]) - sent
    live = (status == "ok") & (took <= slo_s)
    table = {int(k): v / 1000.0 for k, v in point["table_ms"].items()}
    load_s = point["load_ms"] / 1000.0
    median = _service(table)
    timeline = point["timeline"]
    expected = _expected(median, load_s)
    drawn = _simulate(point, args, resolved, median, 0.0, _Drawn(timeline, expected))
    weather = replayed_weather(timeline, expected, point["t0"], True)
    replayed = _simulate(point, args, resolved, median, 0.0, weather)
    reasons = collections.Counter(status[counted & (status != "ok")].tolist())
    out = {
        "queries": int(counted.sum()),
        "live_within_slo": float(live[counted].mean()),
        "live_refused": dict(reasons.most_common(6)),
    }
    for name, result in (("simulated", drawn), ("replayed", replayed)):
        why = collections.Counter(result.why[counted & result.rejected].tolist())
        out[f"{name}_within_slo"] = float(result.within(slo_s)[counted].mean())
        out[f"{name}_refused"] = dict(why.most_common(6))
    shares = {k: round(v, 4) for k, v in out.items() if k.endswith("within_slo")}
    print(f"  load {point['load']}: {out['queries']} queries, within the SLO {shares}", flush=True)
    print(f"    refused: live {out['live_refused']}, simulated {out['simulated_refused']}")
    return out


def _expected(median: Any, load_s: float) -> Any:
    def expected(kind: str, model: str, size: int) -> float:
        return median(size) if kind == "infer" else load_s

    return expected


class _Drawn:
    """A weather of independent draws from a live timeline: an INFER or LOAD takes its
    median (``expected``) times the ratio of a live action of its kind, drawn at random,
    and a call the legs of a live call of its kind, each drawn at random."""

    def __init__(self, timeline: dict[str, list[Any]], expected: Any, seed: int = 11) -> None:
        from raysrv.analytics.poolsim import call_legs

        self._rng = np.random.default_rng(seed)
        columns = ("kind", "model", "size", "started", "ended")
        self._ratios: dict[str, list[float]] = {"infer": [1.0], "load": [1.0]}
        for kind, model, size, started, ended in zip(*(timeline[c] for c in columns), strict=True):
            if kind in self._ratios and math.isfinite(ended - started):
                self._ratios[kind].append((ended - started) / expected(kind, model, size))
        self._legs = call_legs(timeline)

    def _draw(self, values: Any) -> float:
        return float(self._rng.choice(values)) if len(values) else 0.0

    def slowdown(self, worker: int, t: float, kind: str, size: int = 1, model: str = "") -> float:
        return self._draw(self._ratios[kind])

    def behind(self, worker: int, t: float, loading: bool = False, leg: str = "behind") -> float:
        return self._draw(getattr(self._legs, leg))

    def legs(
        self, worker: int, t: float, kind: str = "infer", loading: bool = False, idle: bool = True
    ) -> Any:
        from raysrv.analytics.poolsim import Legs

        legs = Legs(*(self._draw(values) for values in self._legs))
        return legs if self._legs.to_load.size else legs._replace(to_load=None)


def _simulate(
    point: dict[str, Any],
    args: argparse.Namespace,
    resolved: ResolvedPool,
    service: Any,
    hop: Any,
    weather: Any = None,
) -> Any:
    from raysrv._pool import PROFILE_RUNS
    from raysrv.analytics.poolsim import SimModel, simulate_pool

    slo_s = args.slo_ms / 1000.0
    names = [m.name for m in one_worker_pool(args, args.models, slots=args.resident)[1]]
    sim_models = {
        name: SimModel(
            make_policy("deadline", _params(args), slo_s),
            service,
            load_s=point["load_ms"] / 1000.0,
            weight_bytes=weight_bytes(args.width),
            group="convnet",
        )
        for name in names
    }
    sent = np.asarray(point["sent"])
    return simulate_pool(
        sent,
        [names[m] for m in point["models"]],
        sim_models,
        workers=1,
        capacity_bytes=resolved.capacity_bytes,
        depth=resolved.depth,
        hop_s=hop,
        deadlines=sent + slo_s,
        weather=weather,
        profile_runs=PROFILE_RUNS,
    )


def resimulate(path: Path) -> None:
    """Simulate again the points a run saved, with this code's simulator."""
    saved = json.loads(path.read_text())
    args = argparse.Namespace(**saved["args"])
    resolved, _ = one_worker_pool(args, args.models, slots=args.resident)
    for point in saved["pool"]["points"]:
        simulate_point(point, args, resolved)


def _machine(device: str) -> dict[str, Any]:
    import torch

    seen = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor(),
    }
    if device == "gpu":
        seen["gpu"] = torch.cuda.get_device_name()
        seen["cuda"] = torch.version.cuda
    return seen


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both measurements; the result is written after each, when ``args.out`` is given."""
    result: dict[str, Any] = {"machine": _machine(args.device), "args": vars(args)}
    print(f"machine: {result['machine']}", flush=True)
    for part, measure in (("worker", measure_worker), ("pool", measure_pool)):
        if part not in args.parts:
            continue
        result[part] = await measure(args)
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=1, default=str))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    parser.add_argument("--resimulate", type=Path, help="simulate a saved run's points again")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument(
        "--parts", nargs="+", choices=("worker", "pool"), default=["worker", "pool"]
    )
    parser.add_argument("--quick", action="store_true", help="small models, few runs (a check)")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--side", type=int, default=224, help="the input images' side")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--cpu-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--cpu-runs", type=int, default=30)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--resident", type=int, default=10)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--capacity-seconds", type=float, default=10.0)
    parser.add_argument("--loads", type=float, nargs="+", default=[0.5, 0.8, 1.0])
    parser.add_argument("--lead", type=float, default=3.0)
    parser.add_argument(
        "--hosted", action="store_true", help="keep the weights in host memory between LOADs"
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.side, args.sizes, args.runs, args.cpu_runs = 8, 32, [1, 4], 20, 5
        args.models, args.resident, args.capacity_seconds, args.seconds = 20, 2, 2.0, 3.0
        args.lead = 1.0
    if args.resimulate is not None:
        resimulate(args.resimulate)
        return 0
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
