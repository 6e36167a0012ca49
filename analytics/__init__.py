"""Latency models that predict what the live system will do: numpy/scipy only, seconds throughout.

* Arrival processes and trace fitting (BATCH §IV, §III-A): :mod:`.arrivals`.
* The batch buffer's latency distribution, exact and as the paper has it, with finite-server
  bounds (batch §IV eq. 4-15) and eq. 1's cost: :mod:`.buffer`.
* The cost/latency optimizer (batch eq. 2-3): :mod:`.optimize`.
* Service-time profiles: polynomial regression (batch §III-A) and measured tables:
  :mod:`.profiles` (the run times measured live are :mod:`raysrv.batching.profile`).
* SERF's M/D_interf/c model and configuration table (serf §IV-C): :mod:`.serf`, with its
  referee simulator in :mod:`.interference`.
* Fork-join transfer delays as an exponentially modified Gaussian (gillis §IV-A): :mod:`.forkjoin`.
* The discrete-event simulators: any :mod:`raysrv.batching` policy on one model
  (:mod:`.simulate`), and a pool of workers serving many models under the live system's own
  scheduler, with LOADs and UNLOADs, fed by arrival times or by a closed loop of clients
  (:mod:`.poolsim`).

``bench/validate_analytics.py`` measures every model against the simulators and the live system.
"""

from raysrv.analytics.arrivals import MAP, MAP2, MMPP2, MapFit, Poisson, fit_map2
from raysrv.analytics.buffer import BatchBufferModel, LatencyBounds, Pricing
from raysrv.analytics.forkjoin import EMG, fit_emg
from raysrv.analytics.interference import simulate_interference
from raysrv.analytics.optimize import BatchingPlan, optimize_batching
from raysrv.analytics.poolsim import PoolSimResult, SimModel, simulate_closed_loop, simulate_pool
from raysrv.analytics.profiles import ServiceProfile, TableProfile
from raysrv.analytics.serf import lookup_config, serf_config_table, serf_latency, serf_predict
from raysrv.analytics.simulate import SimResult, simulate

__all__ = [
    "EMG",
    "MAP",
    "MAP2",
    "MMPP2",
    "BatchBufferModel",
    "BatchingPlan",
    "LatencyBounds",
    "MapFit",
    "Poisson",
    "PoolSimResult",
    "Pricing",
    "ServiceProfile",
    "SimModel",
    "SimResult",
    "TableProfile",
    "fit_emg",
    "fit_map2",
    "lookup_config",
    "optimize_batching",
    "serf_config_table",
    "serf_latency",
    "serf_predict",
    "simulate",
    "simulate_interference",
    "simulate_closed_loop",
    "simulate_pool",
]
