"""The performance model that guides partitioning (Gillis, ICDCS'21, §IV-A): a group's latency
under a parallelization option, from a regression of run time on FLOPs per kind of layer and
the fork-join transfer delays of :mod:`raysrv.analytics.forkjoin`.

* **Run time** of a shard: ``session_s`` (one run of its session, however many layers it
  holds) plus per layer ``overhead_s + flops / flops_per_s`` of its kind, the layer's leading
  operator (``Conv``, ``Gemm``, ``MaxPool``, ...; ``default`` for the rest), the FLOPs in
  proportion to the shard's share of the group's. A regression of measured run times on FLOPs
  gives the per-layer numbers (:func:`fit_kind`; :mod:`.profile` measures them and parts the
  session's cost from the layers').
* **Transfer** of ``n`` bytes: ``n / bandwidth`` plus a delay drawn from an exponentially
  modified Gaussian; the leader waits for the slowest of its ``w`` workers, the expected maximum
  of ``w`` such delays (the n-th order statistic, §IV-A). Where a transfer of over
  ``large_bytes`` takes another path (Ray passes small objects inside the call and larger ones
  through its object store), it also pays ``large_s``.
* **A group's latency** (the fork-join round, §III-B, Fig. 4): on the leader alone, its run
  time; on workers alone, the slowest worker's transfer and run time plus the expected maximum
  delay; with the leader taking one shard itself, the larger of that and the leader's run.
  Shards that run at once share the machine's memory system: each run takes ``side_by_side``
  longer in a round of more than one shard. Where the leader's run also holds up its calls
  (on Ray the calls' way back needs the cores that the leader and its workers are running
  on), the workers' answers come ``overlap`` times the leader's run later.
* **Cold weights.** The profile times each layer with its weights warm in the caches. A shard
  run once a batch in a process of its own, between the other stages' runs, reads them from
  memory again, and its session's own code and buffers too: each of its runs also takes
  ``cold_s``, and ``cold_s_per_byte`` a byte of its weights (both zero in one process's
  profile, whose lines the whole model's run scales; timed for Ray by
  :func:`raysrv._partitioned.cold_runs`).

Caveats: shards run in parallel only where the machine has a core for each; the workers'
delays are taken as independent (the tests of :mod:`raysrv.analytics.forkjoin` say why that
overestimates the maximum).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from raysrv.analytics.forkjoin import EMG
from raysrv.partitioning.graph import Layer
from raysrv.partitioning.shards import Shard

__all__ = ["PerfModel", "fit_kind", "kind"]


def kind(layer: Layer) -> str:
    """The layer's leading operator past any reshape: what its run time is regressed on."""
    return next((op for op in layer.ops if op not in ("Flatten", "Reshape")), layer.ops[0])


def fit_kind(flops: ArrayLike, seconds: ArrayLike) -> tuple[float, float]:
    """``(overhead_s, flops_per_s)`` of a least-squares line through measured run times."""
    x, y = np.asarray(flops, dtype=float), np.asarray(seconds, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a fit needs run times of at least two different sizes")
    slope, intercept = np.polyfit(x, y, 1)
    if slope <= 0:
        raise ValueError(f"run time does not grow with FLOPs (slope {slope:.3g} s/FLOP)")
    return max(0.0, float(intercept)), float(1.0 / slope)


@dataclass(frozen=True)
class PerfModel:
    """Run times and transfers of one machine (seconds, bytes)."""

    runs: Mapping[str, tuple[float, float]]  # kind: (overhead_s, flops_per_s), with ``default``
    bandwidth: float  # bytes a second of one transfer
    delay: EMG  # of one transfer beyond its bytes
    session_s: float = 0.0  # what one run of a shard's session costs, whatever its layers
    large_bytes: float = math.inf  # a transfer of more bytes than this ...
    large_s: float = 0.0  # ... costs this much more
    side_by_side: float = 0.0  # a shard run beside others takes this fraction longer
    overlap: float = 0.0  # the workers answer this fraction of the leader's own run later
    cold_s: float = 0.0  # a shard's run, its session cold, takes this much longer ...
    cold_s_per_byte: float = 0.0  # ... and reads its weights again, at this cost a byte
    _max_delay: dict[int, float] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if "default" not in self.runs:
            raise ValueError("runs needs a 'default' kind for the kinds not measured")
        for name, (overhead, rate) in self.runs.items():
            if not (overhead >= 0 and rate > 0):
                raise ValueError(f"{name}: overhead_s must be >= 0 and flops_per_s positive")
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be positive, got {self.bandwidth}")
        if not self.session_s >= 0:
            raise ValueError(f"session_s must be >= 0, got {self.session_s}")
        if not self.side_by_side >= 0:
            raise ValueError(f"side_by_side must be >= 0, got {self.side_by_side}")
        if not self.overlap >= 0:
            raise ValueError(f"overlap must be >= 0, got {self.overlap}")
        if not (self.cold_s >= 0 and self.cold_s_per_byte >= 0):
            raise ValueError(
                f"cold_s and cold_s_per_byte must be >= 0, got {self.cold_s}, "
                f"{self.cold_s_per_byte}"
            )
        if not (self.large_bytes >= 0 and self.large_s >= 0):
            raise ValueError(
                f"large_bytes and large_s must be >= 0, got {self.large_bytes}, {self.large_s}"
            )

    def run_s(self, group: Sequence[Layer], shard: Shard) -> float:
        """Run time of ``shard`` of ``group``: one session's run, each layer's overhead, the
        whole group's time at each layer's kind's rate scaled by the shard's share of the
        group's FLOPs, and its session and weights cold."""
        lines = [self._line(layer) for layer in group]
        total = sum(layer.flops for layer in group)
        whole = sum(layer.flops / rate for layer, (_, rate) in zip(group, lines, strict=True))
        share = shard.flops / total if total else 0.0
        cold = self.cold_s + shard.weight_bytes * self.cold_s_per_byte
        return self.session_s + sum(overhead for overhead, _ in lines) + share * whole + cold

    def _line(self, layer: Layer) -> tuple[float, float]:
        return self.runs.get(kind(layer), self.runs["default"])

    def expected_max_delay(self, workers: int) -> float:
        """The expected slowest of ``workers`` transfers' delays (0 for none)."""
        if workers == 0:
            return 0.0
        if workers not in self._max_delay:
            self._max_delay[workers] = self.delay.expected_max(workers)
        return self._max_delay[workers]

    def latency_s(self, group: Sequence[Layer], pieces: Sequence[Shard], leader: bool) -> float:
        """The group's fork-join round over its shards ``pieces`` (:func:`.shards.shards`), the
        first on the leader if ``leader``, the others each on a worker."""
        on_workers = pieces[1:] if leader else pieces
        slow = self.slowed(len(pieces) if leader else len(on_workers))
        slowest = max((self._remote_s(group, p, slow) for p in on_workers), default=0.0)
        remote = slowest + self.expected_max_delay(len(on_workers))
        local = self.run_s(group, pieces[0]) * slow if leader else 0.0
        held = self.overlap * local if on_workers else 0.0
        return max(local, remote + held)

    def worker_s(self, group: Sequence[Layer], pieces: Sequence[Shard], leader: bool) -> float:
        """Seconds the round's workers are busy together: each its shard's run and bytes
        (what a cost counts, gillis §IV-C; the leader is busy the whole latency)."""
        on_workers = pieces[1:] if leader else pieces
        slow = self.slowed(len(pieces) if leader else len(on_workers))
        return sum(self._remote_s(group, p, slow) for p in on_workers)

    def slowed(self, running: int) -> float:
        """What a shard's run is multiplied by with ``running`` shards running at once."""
        return 1.0 + self.side_by_side if running > 1 else 1.0

    def transfer_s(self, n: float) -> float:
        """One transfer of ``n`` bytes, beyond its delay."""
        return n / self.bandwidth + (self.large_s if n > self.large_bytes else 0.0)

    def _remote_s(self, group: Sequence[Layer], shard: Shard, slow: float = 1.0) -> float:
        moved = self.transfer_s(shard.in_bytes) + self.transfer_s(shard.out_bytes)
        return self.run_s(group, shard) * slow + moved
