"""When each replica of a model can take its next batch: one batch executing, one on its way.

A batch sent to an idle replica spends a round trip travelling (about a millisecond per hop
here, more under load) while the replica idles. Clockwork's controller keeps a performance
profile per worker and, from the actions outstanding there, "can deduce the earliest time that a
worker could begin executing a new action" (papers/clockwork.md §4.5), so it sends work ahead;
this does the same with the one prediction the batcher has: how long a batch of a given size
runs (an EWMA of measured run times per size).

A replica that has been sent ``k`` batches is offered to the batching policy again when
``k < depth`` and its work in flight is predicted to have run out; a batch sent then is
predicted to run for its predicted duration from there. Each answer re-anchors the prediction:
the batches still in flight there run from the moment it came back. Until a run time has been
measured nothing is predicted and a replica is offered only when idle. The next batch then
reaches the replica about when it becomes free, and queries that arrive meanwhile still join
it. A Ray actor runs the calls it receives one at a time, in order, so a replica still executes
exactly one batch at a time. ``depth = 1`` turns this off (a replica is offered only when idle).

Predicted from when a batch was sent instead, a batch sent behind a late one was predicted to
end as early as that one had been, and the next went out early by as much; the error carried
from batch to batch. Live at 80% load (``bench/RESULTS.md``, "The pipeline's drift") batches
waited a median 62 ms, at times 166 ms, in the replica's mailbox, while the queries arriving
meanwhile missed them; re-anchored, 5 ms.

Pure and clock-free: the batcher passes ``now``.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from raysrv.batching import ReplicaSlot

__all__ = ["DurationProfile", "ReplicaPipeline"]


class DurationProfile:
    """Predicted run time of a batch by size: an EWMA per size seen, scaled for unseen sizes."""

    def __init__(self, alpha: float = 0.3) -> None:
        self._alpha = alpha
        self._by_size: dict[int, float] = {}

    def observe(self, size: int, duration: float) -> None:
        old = self._by_size.get(size)
        self._by_size[size] = duration if old is None else old + self._alpha * (duration - old)

    def predict(self, size: int) -> float:
        """Seconds a batch of ``size`` should run; infinite before anything was measured."""
        if size in self._by_size:
            return self._by_size[size]
        if not self._by_size:
            return math.inf
        below = [k for k in self._by_size if k < size]
        nearest = max(below) if below else min(self._by_size)
        return self._by_size[nearest] * size / nearest


@dataclass(slots=True)
class _Replica:
    open_at: float = -math.inf
    sizes: collections.deque[int] = field(default_factory=collections.deque)  # in flight, in order
    busy_since: float | None = None

    @property
    def sent(self) -> int:
        """Batches in flight."""
        return len(self.sizes)


class ReplicaPipeline:
    """Batches in flight per replica, and when each replica can take another."""

    def __init__(self, replicas: int, depth: int, profile: DurationProfile | None = None) -> None:
        if replicas < 1 or depth < 1:
            raise ValueError(f"need replicas >= 1 and depth >= 1, got {replicas} and {depth}")
        self._replicas = [_Replica() for _ in range(replicas)]
        self._depth = depth
        self.profile = profile or DurationProfile()

    def __len__(self) -> int:
        return len(self._replicas)

    def can_take(self, replica: int, now: float) -> bool:
        r = self._replicas[replica]
        return r.sent == 0 or (r.sent < self._depth and now >= r.open_at)

    def view(self, now: float) -> tuple[ReplicaSlot, ...]:
        """The replicas as a policy sees them: free when they can take a batch now."""
        slots = []
        for i, r in enumerate(self._replicas):
            until = r.open_at if r.sent and math.isfinite(r.open_at) else None  # None: unknown
            if self.can_take(i, now):
                slots.append(ReplicaSlot(i, busy_until=until))
            else:
                slots.append(ReplicaSlot(i, r.busy_since, r.sizes[-1], until))
        return tuple(slots)

    def busy(self) -> int:
        """Replicas with at least one batch in flight."""
        return sum(r.sent > 0 for r in self._replicas)

    def next_opening(self, now: float) -> float | None:
        """The earliest future time a replica that is busy now can take another batch."""
        times = [r.open_at for r in self._replicas if 0 < r.sent < self._depth and r.open_at > now]
        return min(times, default=None)

    def sent(self, replica: int, size: int, now: float) -> None:
        """A batch of ``size`` left for ``replica`` at ``now``, when the work in flight there
        (if any) should have ended: it should run from now for its predicted duration."""
        r = self._replicas[replica]
        if not self.can_take(replica, now):
            raise RuntimeError(f"replica {replica} cannot take a batch now ({r.sent} in flight)")
        if r.sent == 0:
            r.busy_since = now
        r.sizes.append(size)
        r.open_at = now + self.profile.predict(size)

    def done(self, replica: int, size: int, duration: float | None, now: float) -> None:
        """A batch of ``size`` came back at ``now``; ``duration`` is its measured run time if
        it ran. The batches still in flight there are predicted to run from ``now``."""
        r = self._replicas[replica]
        r.sizes.remove(size)
        if duration is not None:
            self.profile.observe(size, duration)
        if r.sent == 0:
            r.busy_since = None
            r.open_at = -math.inf
        else:
            r.open_at = now + sum(self.profile.predict(s) for s in r.sizes)
