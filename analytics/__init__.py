"""Latency models (batch §III-IV, serf §IV, gillis §IV-A, clockwork §5.3): numpy/scipy only.

Arrival processes, the batch-buffer CTMC, the optimizer, service profiles and the simulator that
the batching planner and the partitioner stand on. Nothing is implemented yet: a later issue
brings it.
"""

__all__: list[str] = []
