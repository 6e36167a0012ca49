"""``fixed``: a maximum batch size and a timeout, what ``@serve.batch`` does, but slot-aware.

A batch is cut when a replica is free and either ``max_batch_size`` queries wait or the oldest has
waited ``timeout_ms``. Unlike ``@serve.batch`` it never cuts a batch while every replica is busy
(cutting early keeps batches small and throughput low under load); the queries keep
accumulating and the next free replica takes up to a full batch at once.

``busy_timeout_ms`` is Clipper's delayed batching (§4.3.2) where its premise holds: a batch
has a fixed cost, and it pays to wait for more queries when that cost is what bounds the
throughput. With the model in the ingress's process (``colocated``) or one hop away, that cost
is largely the ingress event loop's, for each batch it schedules and takes the answers of. So
while fewer queries wait than the ingress lately held requests at once
(:attr:`BatcherView.concurrency`), the oldest may wait up to ``busy_timeout_ms`` for the rest:
clients that each send their next query as an answer arrives come back together, and their
queries make one batch instead of several. A lone client's query never waits (it is all the
ingress holds), and none waits once as many wait as the ingress held. See
``docs/pools.md``, "Holding batches for the ingress's concurrency".
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

__all__ = ["FixedParams", "FixedPolicy", "expects_more", "fifo_step"]


class FixedParams(PolicyParams):
    max_batch_size: int = Field(8, ge=1, le=4096, description="Largest batch cut.")
    timeout_ms: float = Field(
        0.0,
        ge=0.0,
        le=60_000.0,
        description="How long the oldest query may wait for a fuller batch.",
    )
    busy_timeout_ms: float = Field(
        0.0,
        ge=0.0,
        le=60_000.0,
        description="How long it may wait while fewer wait than the ingress's concurrency.",
    )


def fifo_step(
    view: BatcherView, max_batch_size: int, timeout_s: float, busy_timeout_s: float = 0.0
) -> Decision:
    """One FIFO step: the oldest ``max_batch_size`` queries to a free replica, or wait: for
    ``timeout_s`` past the oldest's arrival, or ``busy_timeout_s`` if longer while more
    queries are expected (:func:`expects_more`).

    Shared by the FIFO policies (``fixed``, ``aimd``): they differ only in how the two limits move.
    Before a batch is cut, its queries already past their deadline are rejected: no work is
    started for an answer nobody waits for any more (clockwork §5.2: "executors reject actions
    whose latest timestamp has passed").
    """
    replica = view.free_replica()
    if replica is None or not view.queue:
        return Wait()
    n = min(len(view.queue), max_batch_size)
    if busy_timeout_s > timeout_s and expects_more(view, max_batch_size):
        timeout_s = busy_timeout_s
    release_at = view.queue[0].arrival + timeout_s
    if n < max_batch_size and view.now < release_at:
        return Wait(release_at)
    batch = view.queue[:n]
    late = tuple(q.query_id for q in batch if q.deadline < view.now)
    if late:
        return Reject(late, "deadline passed while queued")
    return Dispatch(tuple(q.query_id for q in batch), replica)


def expects_more(view: BatcherView, max_batch_size: int) -> bool:
    """Fewer queries wait than a full batch and than the requests the ingress lately held at
    once (``view.concurrency``): more may be on their way."""
    return len(view.queue) < min(max_batch_size, view.concurrency)


class FixedPolicy(BatchingPolicy):
    name = "fixed"
    Params = FixedParams
    params: FixedParams

    def decide(self, view: BatcherView) -> Decision:
        params = self.params
        return fifo_step(
            view, params.max_batch_size, params.timeout_ms / 1000.0, params.busy_timeout_ms / 1000.0
        )

    @property
    def max_batch_size(self) -> int:
        return self.params.max_batch_size
