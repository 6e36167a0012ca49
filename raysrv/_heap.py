"""Keep the garbage collector's full passes short in the long-running serving processes.

CPython's collector stops the whole process while it walks every tracked object of the oldest
generation. In a process that has imported Ray Serve that is about 180,000 objects, and one full
pass took 82 ms on the 2-core development machine: every query in flight in the ingress, and the
batch a model worker runs, waits that long, more than many SLOs. Almost all of those objects are
modules, classes and the loaded model, alive until the process ends, so raysrv moves them out of
the collector's sight once start-up is done (``gc.freeze``); the full pass then took 0.0 ms.
What is created later is collected as usual (the young generation's threshold: below), and the
ingress's in-memory store keeps its entries as untracked bytes (``raysrv.state.MemoryStore``).
The ingress settles its heap again after each live reconfiguration, which may add or remove
models (its ``user_config`` catalog): a thousand models' specs, policies and records live as
long as the models do.

The young generation is collected at CPython's threshold (700 more tracked objects made than
freed since its last pass) unless ``RAYSRV_GC_YOUNG_OBJECTS`` in the environment of Ray's
processes sets another. At 20,000, in raysrv's processes and plain Serve's alike, the pass came
round less often under load, and each system answered 6-7% more a second on Serve's fast path
(bench/RESULTS.md, "The fast path"); a pass over 20,000 live young objects took 0.4 ms here. The
cost: garbage in reference cycles lives longer, with what it holds (at 20,000 a client in the
same process kept enough 60 KB labels alive to pass the hostile-input test's memory budget), so
the default stays CPython's.
"""

from __future__ import annotations

import gc
import os

__all__ = ["YOUNG_ENV", "set_young_threshold", "settle", "young_objects"]

YOUNG_ENV = "RAYSRV_GC_YOUNG_OBJECTS"  # the young generation's threshold, if not CPython's


def settle() -> None:
    """Collect what start-up (or a change since the last call) left behind, the objects frozen
    before included, then freeze everything still alive: one full pass, not for every query.
    The young generation is collected from then on at :func:`young_objects`, if set."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    set_young_threshold()


def set_young_threshold() -> None:
    """Collect the young generation at :func:`young_objects` if the environment sets it, the
    older ones at the thresholds they had; else leave the collector as it is."""
    young = young_objects()
    if young is not None:
        gc.set_threshold(young, *gc.get_threshold()[1:])


def young_objects() -> int | None:
    """``RAYSRV_GC_YOUNG_OBJECTS`` as a number, None when unset; ValueError naming the variable
    for anything but a positive integer (0 would stop the collector)."""
    given = os.environ.get(YOUNG_ENV)
    if given is None:
        return None
    if not given.strip().isdigit() or int(given) < 1:
        raise ValueError(f"{YOUNG_ENV} must be a positive integer, got {given[:40]!r}")
    return int(given)
