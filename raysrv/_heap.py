"""Keep the garbage collector's full passes short in the long-running serving processes.

CPython's collector stops the whole process while it walks every tracked object of the oldest
generation. In a process that has imported Ray Serve that is about 180,000 objects, and one
full pass took 82 ms on the 2-core development machine: every query in flight in the ingress,
and the batch a model worker runs, waits that long, more than many SLOs. Almost all of those
objects are modules, classes and the loaded model, alive until the process ends, so raysrv
moves them out of the collector's sight once start-up is done (``gc.freeze``); the full pass
then took 0.0 ms. What is created later is collected as usual, and the ingress's in-memory
store keeps its entries as untracked bytes (``raysrv.state.MemoryStore``). The ingress settles
its heap again after each live reconfiguration, which may add or remove models (its
``user_config`` catalog): a thousand models' specs, policies and records live as long as the
models do.
"""

from __future__ import annotations

import gc

__all__ = ["settle"]


def settle() -> None:
    """Collect what start-up (or a change since the last call) left behind, the objects frozen
    before included, then freeze everything still alive: one full pass, not for every query."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
