"""Sending the next batch ahead: when a busy replica is offered again, and the batcher using it."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from raysrv import batching
from raysrv._batcher import Batcher
from raysrv._pipeline import DurationProfile, ReplicaPipeline
from raysrv.testing import FakeClock


def test_profile_averages_per_size_and_scales_to_unseen_sizes() -> None:
    profile = DurationProfile(alpha=0.5)
    assert profile.predict(4) == math.inf
    profile.observe(4, 0.010)
    profile.observe(4, 0.020)
    assert profile.predict(4) == pytest.approx(0.015)
    assert profile.predict(8) == pytest.approx(0.030)  # scaled from the largest smaller size
    assert profile.predict(2) == pytest.approx(0.0075)  # scaled from the smallest size


def test_a_busy_replica_is_offered_again_when_its_batch_should_have_run_out() -> None:
    clock = FakeClock()
    pipe = ReplicaPipeline(replicas=1, depth=2)
    pipe.sent(0, 4, clock())
    assert not pipe.can_take(0, clock())  # nothing measured yet: wait until idle
    pipe.done(0, 4, 0.010, clock())
    assert pipe.busy() == 0
    pipe.sent(0, 4, clock())
    assert pipe.view(clock())[0].busy_since == clock()
    assert pipe.next_opening(clock()) == pytest.approx(clock() + 0.010)
    clock.advance(0.009)
    assert not pipe.can_take(0, clock())
    clock.advance(0.001)
    assert pipe.view(clock())[0].free
    pipe.sent(0, 4, clock())
    assert not pipe.can_take(0, clock() + 1.0)  # depth 2 reached
    assert pipe.next_opening(clock()) is None
    with pytest.raises(RuntimeError, match="2 in flight"):
        pipe.sent(0, 1, clock())


def test_each_answer_re_anchors_the_work_still_in_flight() -> None:
    """A late answer moves the batch behind it: the replica is offered again only once that
    batch should have run from the answer, not from when it was sent. Predicted from its
    sending, the next batch would go out 20 ms early and wait behind it."""
    pipe = ReplicaPipeline(replicas=1, depth=2)
    pipe.profile.observe(4, 0.010)
    pipe.sent(0, 4, 0.0)
    pipe.sent(0, 4, 0.010)  # the first should end now
    pipe.done(0, 4, 0.010, 0.030)  # it came back 20 ms late
    assert not pipe.can_take(0, 0.030)
    assert pipe.next_opening(0.030) == pytest.approx(0.040)
    pipe.done(0, 4, 0.010, 0.036)  # early: idle, free at once
    assert pipe.can_take(0, 0.036)


def test_depth_one_offers_only_idle_replicas() -> None:
    pipe = ReplicaPipeline(replicas=2, depth=1)
    pipe.sent(0, 1, 0.0)
    pipe.done(0, 1, 0.001, 0.5)
    pipe.sent(0, 1, 1.0)
    assert not pipe.can_take(0, 5.0)
    assert pipe.can_take(1, 1.0)
    assert [s.free for s in pipe.view(5.0)] == [False, True]


def test_the_batcher_sends_ahead_yet_each_replica_runs_one_batch_at_a_time() -> None:
    """A fake serial replica: calls queue on a lock, as calls to one Ray actor do.

    Each call takes 10 ms but reports 6 ms of run time: the other 4 ms stand for the round trip.
    """

    async def scenario() -> None:
        lock = asyncio.Lock()
        outstanding = peak_outstanding = running = peak_running = 0

        async def execute(inputs: np.ndarray, replica: int, *_: float) -> tuple[list[Any], float]:
            nonlocal outstanding, peak_outstanding, running, peak_running
            outstanding += 1
            peak_outstanding = max(peak_outstanding, outstanding)
            async with lock:
                running += 1
                peak_running = max(peak_running, running)
                await asyncio.sleep(0.01)
                running -= 1
            outstanding -= 1
            return list(inputs.sum(axis=1)), 0.006

        policy = batching.make_policy("fixed", {"max_batch_size": 4}, 1.0)
        batcher = Batcher("m", policy, execute, 1, 1000, pipeline_depth=2)
        futures = []
        for i in range(40):
            futures.append(batcher.submit(np.full(2, i)))
            await asyncio.sleep(0.002)
        answers = await asyncio.gather(*futures)
        assert answers == [2.0 * i for i in range(40)]
        assert peak_outstanding == 2  # the next batch was on its way while one ran
        assert peak_running == 1
        await batcher.close()

    asyncio.run(scenario())
