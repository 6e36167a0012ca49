"""Partitioned models (gillis §III-IV, serf §III): layer grouping, fork-join, placement groups.

Pure planning code lives here (no Ray import); the Ray side (shard actors in a replica's
placement group) lives in ``raysrv``. Nothing is implemented yet: a later issue brings it.
"""

__all__: list[str] = []
