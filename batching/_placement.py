"""Where models live in a pool: LOAD, UNLOAD, cold refusals and the load priorities (Clockwork,
OSDI'20, Appendix B, "Loading Models"); the reasoning is :mod:`raysrv.batching.scheduler`'s
docstring, item 3 and 4. A part of :class:`~raysrv.batching.scheduler.PoolScheduler`, kept apart
from the choice of batches."""

from __future__ import annotations

import math
from collections.abc import Iterable

from raysrv.batching._pool_state import (
    PREDICT_Q,
    _estimate,
    _ids,
    _load_estimate,
    _Model,
    _Out,
    _Worker,
)
from raysrv.batching.actions import COLD_DOOMED, Load, Refusal, Unload

__all__ = ["Placement"]


class Placement:
    """The LOAD and UNLOAD half of a pool's scheduler (a mixin of ``PoolScheduler``)."""

    workers: list[_Worker]
    _all: dict[int, _Worker]
    _coming: list[float]
    capacity_bytes: int | None
    _models: dict[str, _Model]
    _active: dict[str, _Model]
    _removals: list[tuple[int, str]]
    _stash: list[Refusal]
    loads: int
    unloads: int
    evictions: int

    def _serve(self, model: _Model, now: float, out: _Out) -> None:
        raise NotImplementedError  # the scheduler's: a model's batches

    def _refuse(
        self, model: _Model, ids: Iterable[int], reason: str, out: _Out, error: str = "rejected"
    ) -> None:
        raise NotImplementedError  # the scheduler's

    def _holders(self, name: str) -> list[_Worker]:
        return [w for w in self.workers if name in w.held]

    def _cold(self, model: _Model, now: float, out: _Out) -> None:
        """A model loaded nowhere: refuse what a LOAD cannot save, then load it if a worker
        is offered."""
        model.dirty, model.wake = False, math.inf
        if model.failed_until > now:
            reason = f"model could not be loaded: {model.error}"
            self._refuse(model, _ids(model.queue), reason, out, "failed")
            return
        finish = self._cold_finish(model, now)
        doomed = [
            q.query_id
            for q in model.queue
            if (q.deadline < finish if q.priority <= 0 else q.deadline < now)
        ]
        self._refuse(model, doomed, COLD_DOOMED, out)
        if not model.queue:
            if doomed:
                self._probe(model, now, out)
            return
        for w in self._load_order(model, now, out):
            if self._load(model, w, now, out):
                self._serve(model, now, out)  # its INFER right behind it, if w can take it
                return
        lead = _estimate(model.runs, 1) + _load_estimate(model.runs)
        urgent = [q.deadline - lead for q in model.queue if q.priority <= 0]
        if urgent:  # look again when the first becomes doomed
            model.wake = max(min(urgent), now)
            out.wake = min(out.wake, model.wake)

    def _probe(self, model: _Model, now: float, out: _Out) -> None:
        """Load a model whose queries were all refused on an idle worker all the same: they
        were refused on LOAD times that only another LOAD can correct (a slow one measured
        would otherwise keep every later one from happening), and idle time costs nothing."""
        for w in self._load_order(model, now, out):
            if not w.busy:
                self._load(model, w, now, out)
                return

    def _steady(self, now: float, out: _Out) -> set[str]:
        """The held models with steady traffic, a query per SLO or more (once per step)."""
        if out.steady is None:
            held = {name for w in self.workers for name in w.held if name in self._models}
            out.steady = {
                name
                for name in held
                if self._models[name].rate_at(now) * self._models[name].policy.slo_s >= 1.0
            }
        return out.steady

    def _cold_finish(self, model: _Model, now: float) -> float:
        """The earliest a batch of one could be done after loading ``model`` on a worker where
        it fits: its LOAD after the LOADs in flight there, its INFER after both the LOAD and
        the INFERs in flight."""
        if self.capacity_bytes is not None and (model.weight_bytes or 0) > self.capacity_bytes:
            return math.inf
        load, one = _load_estimate(model.runs), _estimate(model.runs, 1)
        here = (max(w.loads.free_at(now) + load, w.infers.free_at(now)) + one for w in self.workers)
        coming = (max(at, now) + load + one for at in self._coming)  # workers asked for
        return min([*here, *coming], default=math.inf)

    def _load_order(self, model: _Model, now: float, out: _Out) -> list[_Worker]:
        """Workers whose LOAD executor is free in this step and where ``model`` fits, those
        that would finish its first batch soonest first, then those needing fewer evictions."""
        load = _load_estimate(model.runs)
        fits = []
        for w in self.workers:
            if not out.may_load(w) or model.name in w.held:
                continue
            victims = self._room(w, model.weight_bytes)
            if victims is not None:
                ready = max(w.loads.free_at(now) + load, w.infers.free_at(now))
                fits.append((ready, len(victims), w.index, w))
        return [w for *_, w in sorted(fits)]

    def _room(self, w: _Worker, need: int | None) -> list[str] | None:
        """The models to evict from ``w`` so that ``need`` bytes fit; None if they cannot."""
        if self.capacity_bytes is None:
            return []
        need = need or 0
        free = self.capacity_bytes - w.resident
        victims: list[str] = []
        for name in w.evictable(self._models):
            if free >= need:
                break
            victims.append(name)
            free += w.held[name]
        return victims if free >= need else None

    def _load(
        self, model: _Model, w: _Worker, now: float, out: _Out, for_queued: bool = True
    ) -> bool:
        """LOAD ``model`` on ``w``, evicting what it needs room from. ``for_queued``: the LOAD
        is for the queries queued now, and its latest start the last one that still serves
        one of them; it is not sent if that start has passed before it could begin (the worker
        would refuse it, and it would be sent again). Otherwise (another worker for a model's
        steady traffic) it has no latest start."""
        start = w.loads.free_at(now)
        latest = math.inf
        if for_queued and model.queue:
            one = _estimate(model.runs, 1)
            latest = max(q.deadline for q in model.queue) - one - _load_estimate(model.runs)
        if latest < start:
            return False
        victims = self._room(w, model.weight_bytes)
        if victims is None:
            return False
        for name in victims:
            self._unload(w, name, now, out, evicted=True)
        predicted = _load_estimate(model.runs, PREDICT_Q, default=math.inf)
        action = Load(w.index, model.name, now, start, latest, model.weight_bytes)
        w.held[model.name] = model.weight_bytes or 0
        w.loading[model.name] = start + predicted
        w.load_of[model.name] = action
        w.last_used[model.name] = now
        w.peak_bytes = max(w.peak_bytes, w.resident)
        w.loads.sent(action, predicted, now, out.call, start)
        out.loaded.add(w.index)
        out.actions.append(action)
        return True

    def _unload(self, w: _Worker, name: str, now: float, out: _Out, evicted: bool) -> None:
        w.held.pop(name, None)
        w.load_of.pop(name, None)
        w.last_used.pop(name, None)
        runs = self._models[name].runs if name in self._models else None
        predicted = 0.0 if runs is None else runs.unload_time(PREDICT_Q) or 0.0
        action = Unload(w.index, name, now, evicted)
        w.loads.sent(action, predicted, now, out.call, now)
        self.unloads += 1
        if evicted:
            self.evictions += 1
            if name in self._models:
                self._models[name].evictions += 1
        out.actions.append(action)

    def _emit_removals(self, now: float, out: _Out) -> None:
        for index, name in self._removals:
            w = self._all[index]
            if name in w.held and name not in self._models:
                self._unload(w, name, now, out, evicted=False)
        self._removals.clear()

    def _replicate(self, now: float, out: _Out) -> None:
        """Before anything else, load the models with steady traffic on the workers that lack
        them: both INFER executors then serve their queries, which otherwise queue on one
        worker behind other models' batches."""
        steady = sorted(self._steady(now, out), key=lambda n: -self._models[n].rate_at(now))
        self._load_on(steady, now, out)

    def _scale_out(self, now: float, out: _Out) -> None:
        """Load on more workers the models whose unfulfilled demand exceeds a LOAD's cost."""
        lacking = any(
            name not in w.held for w in self.workers if out.may_load(w) for name in self._active
        )
        if not lacking:  # every worker that may LOAD holds every model with queries already
            return
        priorities = self._load_priorities(now)
        wanted = [
            name
            for name, priority in sorted(priorities.items(), key=lambda kv: -kv[1])
            if priority > _load_estimate(self._models[name].runs)
        ]
        self._load_on(wanted, now, out)

    def _load_on(self, wanted: list[str], now: float, out: _Out) -> None:
        """Load each of ``wanted`` on the first worker that lacks it and may take a LOAD."""
        for name in wanted:
            model = self._models[name]
            if model.failed_until > now:
                continue
            for w in self.workers:
                if not out.may_load(w) or name in w.held:
                    continue
                if self._load(model, w, now, out, for_queued=False):
                    break

    def _load_priorities(self, now: float) -> dict[str, float]:
        """Appendix B's ``p_m`` of every held model with queued queries (see the module
        docstring): one allocation pass, no fixed point."""
        demand = {name: self._demand(m) for name, m in self._active.items()}
        holders = {name: self._holders(name) for name in demand}
        load = {w.index: w.infers.outstanding(now) for w in self.workers}
        for name, ws in holders.items():
            for w in ws:
                load[w.index] += demand[name] / len(ws)
        priorities = {}
        for name, ws in holders.items():
            if not ws or not demand[name]:
                continue
            weights = [1.0 / max(load[w.index], 1e-9) for w in ws]
            horizon = self._models[name].policy.slo_s
            served = 0.0
            for w, weight in zip(ws, weights, strict=True):
                share = demand[name] * weight / sum(weights)  # a_mg
                served += share * min(1.0, horizon / max(load[w.index], 1e-9))
            priorities[name] = demand[name] - served
        return priorities

    def _demand(self, model: _Model) -> float:
        """Run time of the model's queued latency-sensitive queries in full batches."""
        n = sum(q.priority <= 0 for q in model.queue)
        if not n:
            return 0.0
        size = max(1, min(n, model.policy.max_batch_size))
        return math.ceil(n / size) * _estimate(model.runs, size)
