"""``fixed``: a maximum batch size and a timeout, what ``@serve.batch`` does, but slot-aware.

A batch is cut when a replica is free and either ``max_batch_size`` queries wait or the oldest has
waited ``timeout_ms``. Unlike ``@serve.batch`` it never cuts a batch while every replica is busy
(cutting early keeps batches small and throughput low under load); the queries keep
accumulating and the next free replica takes up to a full batch at once.
"""

from __future__ import annotations

from pydantic import Field

from raysrv.batching.base import (
    BatcherView,
    BatchingPolicy,
    Decision,
    Dispatch,
    PolicyParams,
    Reject,
    Wait,
)

__all__ = ["FixedParams", "FixedPolicy", "fifo_step"]


class FixedParams(PolicyParams):
    max_batch_size: int = Field(8, ge=1, le=4096, description="Largest batch cut.")
    timeout_ms: float = Field(
        0.0,
        ge=0.0,
        le=60_000.0,
        description="How long the oldest query may wait for a fuller batch.",
    )


def fifo_step(view: BatcherView, max_batch_size: int, timeout_s: float) -> Decision:
    """One FIFO step: the oldest ``max_batch_size`` queries to a free replica, or wait.

    Shared by the FIFO policies (``fixed``, ``aimd``): they differ only in how the two limits move.
    Before a batch is cut, its queries already past their deadline are rejected: no work is
    started for an answer nobody waits for any more (clockwork §5.2: "executors reject actions
    whose latest timestamp has passed").
    """
    replica = view.free_replica()
    if replica is None or not view.queue:
        return Wait()
    n = min(len(view.queue), max_batch_size)
    release_at = view.queue[0].arrival + timeout_s
    if n < max_batch_size and view.now < release_at:
        return Wait(release_at)
    batch = view.queue[:n]
    late = tuple(q.query_id for q in batch if q.deadline < view.now)
    if late:
        return Reject(late, "deadline passed while queued")
    return Dispatch(tuple(q.query_id for q in batch), replica)


class FixedPolicy(BatchingPolicy):
    name = "fixed"
    Params = FixedParams
    params: FixedParams

    def decide(self, view: BatcherView) -> Decision:
        return fifo_step(view, self.params.max_batch_size, self.params.timeout_ms / 1000.0)

    @property
    def max_batch_size(self) -> int:
        return self.params.max_batch_size
