"""raysrv's declarative spec: the ``args`` of a Ray Serve application, one pydantic schema.

Every model forbids unknown keys (Serve itself silently ignores misspelled deployment keys) and
every field has a description. Cross-field checks name the values they reject. The parts that may
change while serving (batching parameters, SLOs, cache sizes, selection parameters) also form
:class:`LiveConfig`, which travels as the ingress deployment's ``user_config`` so that Serve
applies changes through ``reconfigure`` without restarting any replica.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raysrv import batching, policies

__all__ = [
    "AppLive",
    "AppSpec",
    "BatchingSpec",
    "IngressSpec",
    "InputSpec",
    "LiveConfig",
    "ModelLive",
    "ModelSpec",
    "RaysrvSpec",
    "ResourcesSpec",
    "SelectionSpec",
]

_NAME = r"^[a-z][a-z0-9_-]{0,62}$"
DTYPES = ("float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _describe(error: Any) -> str:
    where = ".".join(str(p) for p in error["loc"]) or "<root>"
    return f"params.{where}: {error['msg']} (got {error.get('input')!r})"


def _check_params(kind: str, resolve: Any, name: str, params: dict[str, Any]) -> None:
    """Validate ``params`` with the named plugin's ``Params``, naming the inner field on error."""
    cls = resolve(name)
    try:
        cls.Params.model_validate(params)
    except ValueError as exc:  # pydantic.ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        if errors is None:
            raise
        parts = [_describe(e) for e in errors()]
        raise ValueError(f"invalid {kind} params for {name!r}: " + "; ".join(parts)) from None


class InputSpec(_Strict):
    shape: tuple[int, ...] = Field(description="Shape of one input, without the batch dimension.")
    dtype: Literal[DTYPES] = Field("float32", description="Element type of the input.")  # type: ignore[valid-type]

    @field_validator("shape")
    @classmethod
    def _positive_dims(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in shape):
            raise ValueError(f"every dimension must be > 0, got {list(shape)}")
        return shape


class ResourcesSpec(_Strict):
    num_cpus: float = Field(1.0, ge=0.0, description="Logical CPUs reserved per replica.")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs reserved per replica.")
    memory_mb: int | None = Field(None, gt=0, description="Memory reserved per replica, in MiB.")
    threads: int = Field(1, ge=1, le=256, description="Intra-op threads of the runtime.")


class BatchingSpec(_Strict):
    policy: str = Field("fixed", description="Registered batching policy name or 'pkg.mod:Class'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the policy.")

    @model_validator(mode="after")
    def _params_fit_policy(self) -> BatchingSpec:
        _check_params("batching", batching.policy_class, self.policy, self.params)
        return self


class SelectionSpec(_Strict):
    policy: str = Field(
        "single", description="Registered selection policy name or 'pkg.mod:Class'."
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the policy.")

    @model_validator(mode="after")
    def _params_fit_policy(self) -> SelectionSpec:
        _check_params("selection", policies.policy_class, self.policy, self.params)
        return self


class ModelSpec(_Strict):
    name: str = Field(pattern=_NAME, description="Unique model name (lowercase, digits, - and _).")
    runtime: Literal["onnx", "torch", "python"] = Field(description="What executes the model.")
    source: str = Field(
        min_length=1,
        description="onnx: a .onnx file; torch: a TorchScript file or 'pkg.mod:factory' returning "
        "an nn.Module; python: 'pkg.mod:Class' implementing predict_batch(inputs) -> outputs.",
    )
    build: str | None = Field(
        None,
        description="'pkg.mod:fn' called as fn(source) when the source file does not exist yet.",
    )
    init_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for a factory or class source."
    )
    version: str = Field("1", min_length=1, description="Model version; part of the cache key.")
    device: Literal["cpu", "gpu"] = Field("cpu", description="Where the replicas run.")
    replicas: int = Field(1, ge=1, le=1024, description="Number of replica actors.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per replica.")
    batching: BatchingSpec = Field(default_factory=BatchingSpec, description="Batching policy.")
    slo_ms: float = Field(100.0, gt=0.0, description="Default latency objective of a query.")
    max_queue: int = Field(
        1024, ge=1, description="Queries waiting at most; beyond it requests are refused with 503."
    )
    pipeline_depth: int = Field(
        2,
        ge=1,
        le=8,
        description="Batches a replica may hold at once (1 executing, the rest on their way); "
        "2 sends the next batch so it arrives as the replica frees up, 1 waits until it is idle.",
    )
    input: InputSpec = Field(description="Shape and dtype of one input.")

    @model_validator(mode="after")
    def _device_and_resources_agree(self) -> ModelSpec:
        if self.device == "gpu" and self.resources.num_gpus <= 0:
            raise ValueError("device 'gpu' needs resources.num_gpus > 0 (got 0)")
        if self.device == "cpu" and self.resources.num_gpus > 0:
            raise ValueError(f"device 'cpu' with resources.num_gpus={self.resources.num_gpus}")
        if self.runtime == "onnx" and _is_import_path(self.source):
            raise ValueError(f"onnx source must be a .onnx file, got {self.source!r}")
        return self


def _is_import_path(source: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", source))


class AppSpec(_Strict):
    name: str = Field(pattern=_NAME, description="Endpoint name: POST /v1/{name}/predict.")
    models: list[str] = Field(min_length=1, description="Models this app may query.")
    selection: SelectionSpec = Field(default_factory=SelectionSpec, description="Model selection.")
    cache_size: int = Field(1024, ge=0, description="Prediction cache entries; 0 disables it.")
    context_field: str = Field(
        "context", pattern=r"^[A-Za-z_]\w*$", description="Request field holding the context key."
    )
    slo_ms: float | None = Field(None, gt=0.0, description="Overrides the models' default SLO.")
    confidence_threshold: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Below this confidence the app answers default_output instead (clipper "
        "§5.2.1), flagged with default: true.",
    )
    default_output: Any = Field(
        None, description="The sensible default answer given when confidence is too low."
    )
    ensemble_reserve_ms: float = Field(
        5.0,
        ge=0.0,
        description="An ensemble stops waiting for stragglers this long before the deadline, "
        "to combine and answer in time (clipper §5.2.2).",
    )

    @field_validator("models")
    @classmethod
    def _unique(cls, models: list[str]) -> list[str]:
        dupes = sorted({m for m in models if models.count(m) > 1})
        if dupes:
            raise ValueError(f"models listed twice: {dupes}")
        return models

    @model_validator(mode="after")
    def _selection_fits_models(self) -> AppSpec:
        cls = policies.policy_class(self.selection.policy)
        cls.check(self.models, cls.Params.model_validate(self.selection.params))
        return self

    @model_validator(mode="after")
    def _default_when_thresholded(self) -> AppSpec:
        if self.confidence_threshold > 0 and self.default_output is None:
            raise ValueError(
                f"confidence_threshold {self.confidence_threshold} needs a default_output to "
                f"answer when the confidence is lower"
            )
        return self

    @model_validator(mode="after")
    def _context_field_free(self) -> AppSpec:
        if self.context_field in ("input", "slo_ms"):
            raise ValueError(f"context_field {self.context_field!r} collides with a request field")
        return self


class IngressSpec(_Strict):
    replicas: int = Field(1, ge=1, le=64, description="Ingress replicas (each runs its batchers).")
    num_cpus: float = Field(0.25, ge=0.0, description="Logical CPUs reserved per ingress replica.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies get 413.")
    max_ongoing_requests: int = Field(
        256, ge=1, description="Requests in flight per ingress replica before Serve queues them."
    )
    max_queued_requests: int = Field(
        128,
        ge=-1,
        description="Requests Serve queues for the ingress before answering 503 (-1: no bound).",
    )
    seed: int = Field(0, description="Seed of the selection policies' random generator.")
    trip_back_quantile: float = Field(
        0.99,
        gt=0.0,
        le=1.0,
        description="For callers that send sent_at: the quantile of the last 200 such queries' "
        "trips here kept back from each deadline for the answer's trip back (1: the longest).",
    )


class RaysrvSpec(_Strict):
    """The whole spec: models, the apps that serve them, shared state and the ingress."""

    models: list[ModelSpec] = Field(min_length=1, description="Every model served.")
    apps: list[AppSpec] = Field(min_length=1, description="Endpoints, each over some models.")
    state: str = Field("memory", description="'memory' or a Redis URL (redis://host:port/db).")
    ingress: IngressSpec = Field(default_factory=IngressSpec, description="The HTTP/handle front.")

    @field_validator("state")
    @classmethod
    def _state_kind(cls, state: str) -> str:
        if state != "memory" and not re.match(r"^rediss?://", state):
            raise ValueError(f"state must be 'memory' or a redis:// URL, got {state!r}")
        return state

    @model_validator(mode="after")
    def _names_resolve(self) -> RaysrvSpec:
        _no_duplicates("model", [m.name for m in self.models])
        _no_duplicates("app", [a.name for a in self.apps])
        models = {m.name: m for m in self.models}
        for app in self.apps:
            unknown = [m for m in app.models if m not in models]
            if unknown:
                raise ValueError(
                    f"app {app.name!r} names unknown models {unknown}; known: {sorted(models)}"
                )
            inputs = {(models[m].input.shape, models[m].input.dtype) for m in app.models}
            if len(inputs) > 1:
                raise ValueError(
                    f"app {app.name!r} mixes models with different inputs {sorted(inputs)}"
                )
        return self

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def live(self) -> LiveConfig:
        """The live-tunable part of this spec, as the ingress ``user_config`` carries it."""
        return LiveConfig(
            models={m.name: ModelLive(batching=m.batching, slo_ms=m.slo_ms) for m in self.models},
            apps={
                a.name: AppLive(selection=a.selection, cache_size=a.cache_size, slo_ms=a.slo_ms)
                for a in self.apps
            },
        )


def _no_duplicates(kind: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{kind} names must be unique, repeated: {dupes}")


class ModelLive(_Strict):
    batching: BatchingSpec | None = Field(None, description="New batching policy and parameters.")
    slo_ms: float | None = Field(None, gt=0.0, description="New default SLO.")


class AppLive(_Strict):
    selection: SelectionSpec | None = Field(
        None, description="New selection policy and parameters."
    )
    cache_size: int | None = Field(None, ge=0, description="New cache size (0 disables).")
    slo_ms: float | None = Field(None, gt=0.0, description="New app SLO.")


class LiveConfig(_Strict):
    """Knobs applied live through the ingress deployment's ``user_config`` (no restarts).

    Entries override the spec in ``args``; fields left out keep their ``args`` values.
    """

    models: dict[str, ModelLive] = Field(default_factory=dict, description="Per model name.")
    apps: dict[str, AppLive] = Field(default_factory=dict, description="Per app name.")

    def check_against(self, spec: RaysrvSpec) -> None:
        """Raise ``ValueError`` if this names models or apps the spec does not have."""
        for kind, names, known in (
            ("models", self.models, {m.name for m in spec.models}),
            ("apps", self.apps, {a.name for a in spec.apps}),
        ):
            unknown = sorted(set(names) - known)
            if unknown:
                raise ValueError(
                    f"user_config.{kind} names unknown entries {unknown}; known: {sorted(known)}"
                )
