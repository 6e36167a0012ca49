"""Load generators for a Serve app: open-loop Poisson, closed loop, and ``wrk``.

Two client kinds share one interface, ``await client.send(i) -> status``: :class:`HttpClient`
POSTs the i-th pre-encoded JSON body (aiohttp, a Ray Serve dependency, one pooled session), and
:class:`HandleClient` calls a Serve ``DeploymentHandle`` with the i-th pre-built array (it must
run in a process connected to Ray, e.g. the driver after ``serve.run``). Inputs and bodies are
built once, before any timing, so the client spends little CPU per request.

* :func:`open_loop`: arrivals are a Poisson process (exponential gaps from a seeded numpy
  generator) at a fixed rate; each request starts at its scheduled time whether or not earlier
  ones finished. Latency runs from the *scheduled* time, so a client that falls behind shows up
  in the latency instead of hiding it (no coordinated omission); ``max_lag_ms`` says how far
  sends slipped.
* :func:`closed_loop`: N workers, each sending its next request when the previous one answers,
  for T seconds: the saturation throughput as this client sees it.
* :func:`wrk_saturation`: the same for HTTP with ``wrk`` (a C client, far cheaper per request than
  any Python one), its POST bodies in a generated Lua script.

Statuses: 200 ok, 429/503 rejected (overload), anything else an error; 0 is a client-side
failure (timeout, connection error).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import itertools
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np

from raysrv._heap import settle

__all__ = [
    "REJECTED",
    "STALL_S",
    "Client",
    "HandleClient",
    "HttpClient",
    "RequestLog",
    "RunResult",
    "closed_loop",
    "collector_off",
    "encode_bodies",
    "make_inputs",
    "open_loop",
    "require_wrk",
    "parse_wrk",
    "poisson_offsets",
    "replay",
    "favour_client",
    "refusal_reason",
    "scheduled_at",
    "wrk_saturation",
]

REJECTED = frozenset({429, 503})
MODEL_NAMED = re.compile(r"^model '[^']*':? ")  # how an error names its model
STALL_S = 0.005  # a replay's client notes when its loop runs a sleep this long this late
DEFAULT_TIMEOUT_S = 10.0


def refusal_reason(message: str) -> str:
    """Why a query was not answered, without the model it names (``model 'm0042': ...``), so
    that one reason is counted once over every model, not once per model."""
    return MODEL_NAMED.sub("", message, count=1)[:60]


def make_inputs(n: int, shape: Sequence[int], seed: int = 0, decimals: int = 4) -> list[np.ndarray]:
    """``n`` distinct random float32 inputs in [0, 1), rounded so their JSON stays short."""
    rng = np.random.default_rng(seed)
    values = np.round(rng.random((n, *shape)), decimals)
    return list(values.astype(np.float32))


def encode_bodies(inputs: Sequence[np.ndarray], decimals: int = 4) -> list[bytes]:
    """``{"input": <nested list>}`` JSON bodies, one per input."""
    return [
        json.dumps({"input": np.round(x.astype(np.float64), decimals).tolist()}).encode()
        for x in inputs
    ]


class Client(Protocol):
    kind: str

    async def send(self, i: int) -> int:
        """Send request ``i``; return its status (0 for a client-side failure)."""
        ...


class HttpClient:
    """POSTs pre-encoded JSON bodies to one URL over a pooled aiohttp session, each with
    ``headers`` besides the JSON content type."""

    kind = "http"

    def __init__(
        self,
        url: str,
        bodies: Sequence[bytes],
        connections: int = 512,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self._bodies = bodies
        self._connections = connections
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._session: Any = None

    async def __aenter__(self) -> HttpClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._connections),
            timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            headers=self._headers,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    async def send(self, i: int) -> int:
        try:
            async with self._session.post(
                self.url, data=self._bodies[i % len(self._bodies)]
            ) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return 0


def _exception_status(exc: BaseException) -> int:
    """HTTP-like status of an exception raised through a handle call."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status  # raysrv's errors carry their HTTP status
    if "BackPressure" in type(exc).__name__:
        return 503
    return 500


class HandleClient:
    """Calls ``call(input)`` (e.g. ``lambda x: handle.predict.remote(x)``) on pre-built inputs."""

    kind = "handle"

    def __init__(
        self,
        call: Callable[[np.ndarray], Any],
        inputs: Sequence[np.ndarray],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._call = call
        self._inputs = inputs
        self._timeout_s = timeout_s

    async def send(self, i: int) -> int:
        response = self._call(self._inputs[i % len(self._inputs)])
        try:
            result = await asyncio.wait_for(_awaited(response), self._timeout_s)
        except asyncio.TimeoutError:
            response.cancel()
            return 0
        except Exception as exc:
            return _exception_status(exc)
        if isinstance(result, dict) and "error" in result:  # raysrv answers errors as objects
            return int(result.get("status", 500))
        return 200


_SCHEDULED: contextvars.ContextVar[float] = contextvars.ContextVar("scheduled")


def scheduled_at() -> float:
    """The wall-clock time the request being sent was scheduled for (:meth:`RequestLog.timed`
    sets it; now, outside one): a caller's ``sent_at``, so that the server counts its SLO from
    where the load generator counts the request's latency, the client's own lag included."""
    return _SCHEDULED.get(time.time())


def favour_client(niceness: int) -> bool:
    """Give every thread of this process ``niceness`` (Linux keeps one per thread; threads
    started later inherit it from the one that starts them), so that a client sharing the
    machine's cores with the servers it measures waits for a core about as seldom as one on
    its own machine would. Processes started before keep theirs. False where this process may
    not raise its priority (below niceness 0 needs root or ``CAP_SYS_NICE``)."""
    try:
        threads = os.listdir("/proc/self/task")
    except FileNotFoundError:  # no /proc: not Linux
        return False
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except PermissionError:
            return False
    return True


async def _awaited(response: Awaitable[Any]) -> Any:
    return await response


@dataclass
class RequestLog:
    """Per request: scheduled and actual send time, completion time (seconds from the run's
    start) and status. ``stalls``: when the client's own event loop was held (a replay's),
    as (seconds from the run's start when it ran again, seconds it was held beyond
    ``STALL_S``, seconds its thread ran meanwhile): an answer that arrived meanwhile was seen
    that much later. The loop's thread running for most of a hold is the client's own work;
    running little, it waited for a CPU (logs saved before this was read have two values).
    ``start``: the run's start, as ``time.perf_counter()`` read it (a replay's)."""

    scheduled: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    stalls: list[tuple[float, ...]] = field(default_factory=list)
    start: float = 0.0

    async def timed(self, client: Client, i: int, scheduled: float, t0: float) -> None:
        sent = time.perf_counter() - t0
        _SCHEDULED.set(time.time() - (sent - scheduled))
        status = await client.send(i)
        self.scheduled.append(scheduled)
        self.sent.append(sent)
        self.done.append(time.perf_counter() - t0)
        self.status.append(status)


@dataclass(frozen=True)
class RunResult:
    """Summary of one load run; latencies in ms over the requests answered 200.

    ``throughput_rps`` is the number of 200 answers over the time from the start of the run to
    the last 200 answer (for an open loop that includes draining its queue).
    """

    client: str
    mode: str
    offered_rps: float | None
    duration_s: float
    sent: int
    ok: int
    rejected: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_lag_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_log(
        cls, log: RequestLog, client: str, mode: str, offered_rps: float | None
    ) -> RunResult:
        status = np.asarray(log.status, dtype=int)
        ok = status == 200
        done = np.asarray(log.done)
        latency_ms = (done - np.asarray(log.scheduled))[ok] * 1e3
        elapsed = float(done[ok].max()) if ok.any() else 0.0  # until the last 200 answered
        pct = np.percentile(latency_ms, [50, 90, 99]) if ok.any() else [np.nan] * 3
        rejected = int(np.isin(status, list(REJECTED)).sum())
        lag = np.asarray(log.sent) - np.asarray(log.scheduled)
        return cls(
            client=client,
            mode=mode,
            offered_rps=offered_rps,
            duration_s=round(elapsed, 3),
            sent=len(status),
            ok=int(ok.sum()),
            rejected=rejected,
            errors=len(status) - int(ok.sum()) - rejected,
            throughput_rps=float(ok.sum() / elapsed) if elapsed > 0 else 0.0,
            p50_ms=float(pct[0]),
            p90_ms=float(pct[1]),
            p99_ms=float(pct[2]),
            mean_ms=float(latency_ms.mean()) if ok.any() else float("nan"),
            max_lag_ms=float(lag.max() * 1e3) if len(lag) else 0.0,
        )


def poisson_offsets(
    rate: float, rng: np.random.Generator, duration_s: float | None = None, count: int | None = None
) -> np.ndarray:
    """Arrival times (s from start) of a Poisson process: within ``duration_s`` or ``count`` of
    them."""
    if rate <= 0 or (duration_s is None) == (count is None):
        raise ValueError(f"need rate > 0 and exactly one of duration_s/count, got {rate=}")
    n = count if count is not None else int(rate * duration_s * 1.2 + 50)
    offsets = np.cumsum(rng.exponential(1.0 / rate, n))
    return offsets if duration_s is None else offsets[offsets < duration_s]


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The client's heap frozen (``settle``) and its collector off until the block ends.

    Freezing keeps start-up's objects (Ray's modules: an 80 ms full pass) out of the collector's
    passes, but not what the run creates: a full pass over its requests mid-run holds the
    client's loop, and the answers arriving meanwhile are seen late (bench/RESULTS.md, "Late
    answers"). What a run leaves in cycles is collected once it ends."""
    settle()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def open_loop(
    client: Client,
    rate: float,
    duration_s: float | None = None,
    count: int | None = None,
    seed: int = 0,
    first: int = 0,
) -> RunResult:
    """Poisson arrivals at ``rate``/s for ``duration_s`` seconds or ``count`` requests.

    Request k uses input ``first + k``; wait for every answer (each bounded by the client's
    timeout) before summarizing.
    """
    offsets = poisson_offsets(rate, np.random.default_rng(seed), duration_s, count)
    log = await replay(client, offsets, first)
    return RunResult.from_log(log, client.kind, "open", rate)


async def replay(
    client: Client, offsets: Sequence[float] | np.ndarray, first: int = 0
) -> RequestLog:
    """Send request ``first + k`` at ``offsets[k]`` seconds from now, whether or not earlier ones
    have answered; wait for every answer. The client's own collector does not run meanwhile
    (:func:`collector_off`), so that its pauses do not count as the server's latency. At the
    end it waits on the requests still in flight only, so that its own bookkeeping of the
    run's requests does not delay the last answers (bench/RESULTS.md, "Late answers")."""
    with collector_off():
        return await _replay(client, offsets, first)


async def _replay(client: Client, offsets: Sequence[float] | np.ndarray, first: int) -> RequestLog:
    log = RequestLog()
    tasks: list[asyncio.Task[None]] = []
    in_flight: set[asyncio.Task[None]] = set()
    t0 = log.start = time.perf_counter()
    watch = asyncio.create_task(_watch_stalls(log.stalls, t0))
    try:
        for k, offset in enumerate(offsets):
            delay = offset - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(log.timed(client, first + k, float(offset), t0))
            tasks.append(task)
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight)
    finally:
        watch.cancel()
    for task in tasks:  # what a request raised, now that none is timed any more
        task.result()
    return log


async def _watch_stalls(stalls: list[tuple[float, ...]], t0: float) -> None:
    """Append to ``stalls`` each time this event loop ran a ``STALL_S`` sleep more than
    ``STALL_S`` late (``RequestLog.stalls``)."""
    while True:
        before, ran = time.perf_counter(), time.thread_time()
        await asyncio.sleep(STALL_S)
        after = time.perf_counter()
        if after - before > 2 * STALL_S:
            stalls.append((after - t0, after - before - STALL_S, time.thread_time() - ran))


async def closed_loop(
    client: Client,
    concurrency: int,
    duration_s: float,
    first: int = 0,
    log: RequestLog | None = None,
) -> RunResult:
    """``concurrency`` workers send back to back for ``duration_s`` seconds (then drain);
    each request is also recorded in ``log`` when one is given."""
    log = log if log is not None else RequestLog()
    ids = itertools.count(first)
    t0 = time.perf_counter()

    async def worker() -> None:
        while (now := time.perf_counter() - t0) < duration_s:
            await log.timed(client, next(ids), now, t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return RunResult.from_log(log, client.kind, "closed", None)


_LUA = """\
wrk.method = "POST"
%s
local bodies = {
%s
}
local i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
"""


# each thread sums the matches of a pattern in its 200 answers; done() prints the total
_COUNT_LUA = """\
counted = 0
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
response = function(status, headers, body)
  if status == 200 then
    local _, n = string.gsub(body, %s, "")
    counted = counted + n
  end
end
function done(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do
    total = total + thread:get("counted")
  end
  io.write(string.format("Counted: %%d\\n", total))
end
"""


def wrk_script(
    bodies: Sequence[bytes], count: str | None = None, headers: dict[str, str] | None = None
) -> str:
    """A wrk Lua script cycling through ``bodies`` sent with ``headers`` (a JSON content type if
    None); with ``count`` (a Lua pattern), it also sums its matches in the 200 answers."""
    headers = headers or {"Content-Type": "application/json"}
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    script = _LUA % (lines, ",\n".join(_lua_string(b) for b in bodies))
    return script if count is None else script + _COUNT_LUA % f"[==[{count}]==]"


def _lua_string(body: bytes) -> str:
    """``body`` as a Lua literal: a long string for printable text such as JSON (without the
    ``]==]`` closer), else escaped byte by byte: a long string would change line ends."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable() and "]==]" not in text:
        return f"[==[{text}]==]"
    return '"' + "".join(f"\\{b}" for b in body) + '"'


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def parse_wrk(output: str) -> dict[str, float]:
    """Requests, seconds, non-2xx count, socket errors, requests/s and latency percentiles."""
    done = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", output)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if done is None or rps is None:
        raise ValueError(f"unexpected wrk output:\n{output}")
    parsed = {
        "requests": float(done.group(1)),
        "seconds": _ms(done.group(2) + done.group(3)) / 1e3,
        "requests_per_s": float(rps.group(1)),
    }
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    parsed["non_2xx"] = float(non_2xx.group(1)) if non_2xx else 0.0
    socket = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    parsed["socket_errors"] = float(sum(map(int, socket.groups()))) if socket else 0.0
    counted = re.search(r"^Counted: (\d+)$", output, re.M)
    if counted:
        parsed["counted"] = float(counted.group(1))
    for pct, value in re.findall(r"^\s+(50|90|99)%\s+([\d.]+(?:us|ms|s|m))\s*$", output, re.M):
        parsed[f"p{pct}_ms"] = _ms(value)
    return parsed


def require_wrk() -> None:
    """Exit with what to install when ``wrk`` is not on the PATH: a bench that drives it checks
    before it starts Ray, since a failure inside the measuring loop leaves Serve's handles
    behind and Ray's shutdown can then wait on them for ever."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not on the PATH: install it (Debian, Ubuntu: apt-get install wrk)")


async def wrk_saturation(
    url: str,
    bodies: Sequence[bytes],
    connections: int,
    duration_s: float,
    threads: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    count: str | None = None,
    headers: dict[str, str] | None = None,
) -> RunResult:
    """Run ``wrk`` against ``url`` with the given POST bodies; throughput counts 2xx answers
    only (percentiles are wrk's, over every answer). With ``count`` (a Lua pattern), the
    matches in the 200 answers are summed too (``extra["counted"]``)."""
    with tempfile.TemporaryDirectory(prefix="raysrv-wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(wrk_script(bodies, count, headers))
        args = [f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration_s))}s"]
        args += ["--latency", f"--timeout={max(1, round(timeout_s))}s", "-s", str(script), url]
        proc = await asyncio.create_subprocess_exec(
            "wrk", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}:\n{text}")
    w = parse_wrk(text)
    ok = w["requests"] - w["non_2xx"]
    return RunResult(
        client="wrk",
        mode="closed",
        offered_rps=None,
        duration_s=w["seconds"],
        sent=int(w["requests"]),
        ok=int(ok),
        rejected=int(w["non_2xx"]),
        errors=int(w["socket_errors"]),
        throughput_rps=ok / w["seconds"] if w["seconds"] > 0 else 0.0,
        p50_ms=w.get("p50_ms", float("nan")),
        p90_ms=w.get("p90_ms", float("nan")),
        p99_ms=w.get("p99_ms", float("nan")),
        mean_ms=float("nan"),
        extra={
            "wrk_requests_per_s": w["requests_per_s"],
            **({"counted": w["counted"]} if "counted" in w else {}),
            "command": ["wrk", *args[:-3], "-s", "post.lua", url],
        },
    )
