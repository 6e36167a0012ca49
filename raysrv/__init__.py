"""raysrv: model serving on Ray Serve with adaptive batching, model selection and deadlines.

The public surface: the config schema, the Serve application builder, and the base classes of
the pluggable families. Ray is imported only when the builder is first used, so the pure parts
(config, batching, policies, analytics) import fast and without Ray.
"""

from __future__ import annotations

from typing import Any

from raysrv.batching import BatchingPolicy
from raysrv.config import AppSpec, LiveConfig, ModelSpec, RaysrvSpec
from raysrv.errors import RaysrvError
from raysrv.policies import SelectionPolicy

__all__ = [
    "AppSpec",
    "BatchingPolicy",
    "LiveConfig",
    "ModelSpec",
    "RaysrvError",
    "RaysrvSpec",
    "SelectionPolicy",
    "__version__",
    "build_app",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from raysrv.app import build_app

        return build_app
    raise AttributeError(f"module 'raysrv' has no attribute {name!r}")
