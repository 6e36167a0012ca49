"""The application builder that a Serve config's ``import_path`` names.

    applications:
      - name: digits
        import_path: raysrv.app:build_app
        args: {models: [...], apps: [...]}

Serve validates ``args`` into :class:`RaysrvSpec` (the builder's annotation) before calling it.
Model sets are listed as their models here, relative file sources are resolved against the
spec's ``root`` (``raysrv run FILE`` sets it to FILE's directory; unset, the working directory
of the process Serve builds the application in), and a model's ``build`` hook runs here, once,
when its source file does not exist yet.
"""

# No ``from __future__ import annotations`` here: Serve reads the builder's parameter annotation
# as a class to validate ``args`` with it.

from pathlib import Path
from typing import Any

from ray.serve import Application

from raysrv._admission import auto_bound, longest_slo_ms
from raysrv._deployments import Ingress
from raysrv._plugins import import_object
from raysrv.config import ModelSpec, RaysrvSpec

__all__ = ["build_app", "ingress_options", "prepare_spec"]


def _prepare_model(model: ModelSpec, root: Path) -> ModelSpec:
    if model.runtime == "python" or ":" in model.source:
        return model
    path = Path(model.source).expanduser()
    if not path.is_absolute():
        path = (root / path).resolve()
    if not path.exists() and model.build is not None:
        import_object(model.build)(str(path))
    if not path.exists():
        raise ValueError(f"model {model.name!r}: source file {str(path)!r} does not exist")
    return model.model_copy(update={"source": str(path)})


def prepare_spec(spec: RaysrvSpec, root: Path | None = None) -> RaysrvSpec:
    """``spec`` with its model sets listed and absolute model paths, after building the
    missing ones that have a hook; relative paths from ``root``, else the spec's, else the
    working directory."""
    base = root or spec.base_dir()
    listed = spec.expanded(base)
    return listed.model_copy(update={"models": [_prepare_model(m, base) for m in listed.models]})


def build_app(args: RaysrvSpec) -> Application:
    """The Serve application of one raysrv spec: the ingress, owning the workers of every pool,
    with :func:`ingress_options`.

    Serve passes ``args`` already validated; Python callers may pass the plain dict.
    """
    given = args if isinstance(args, RaysrvSpec) else RaysrvSpec.model_validate(args)
    root = given.base_dir()
    spec = prepare_spec(given, root)
    return Ingress.options(**ingress_options(spec)).bind(spec.model_dump(mode="json"), str(root))


def ingress_options(spec: RaysrvSpec) -> dict[str, Any]:
    """Serve's options of the ingress deployment of ``spec`` (prepared): its replicas and
    resources, and Serve's bound on its requests in flight, timed here if ``auto``
    (:mod:`raysrv._admission`)."""
    ongoing = spec.ingress.max_ongoing_requests
    if ongoing == "auto":
        slo_ms = longest_slo_ms(spec.models, spec.apps)
        ongoing = auto_bound(spec.resolved_pools(), slo_ms)
    per_node = spec.ingress.max_replicas_per_node
    return {
        "name": "ingress",
        "num_replicas": spec.ingress.replicas,
        **({} if per_node is None else {"max_replicas_per_node": per_node}),
        "ray_actor_options": spec.ingress_resources(),
        "max_ongoing_requests": ongoing,
        "max_queued_requests": spec.ingress.max_queued_requests,
        "health_check_period_s": spec.ingress.health_check_period_s,
        "user_config": {},  # no knob overridden: every model and app as declared
    }
