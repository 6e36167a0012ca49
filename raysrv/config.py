"""raysrv's declarative spec: the ``args`` of a Ray Serve application, one pydantic schema.

Every model forbids unknown keys (Serve itself silently ignores misspelled deployment keys) and
every field has a description. Cross-field checks name the values they reject. The parts that may
change while serving (batching parameters, SLOs, cache sizes, selection parameters, and the
models served by shared pools) also form :class:`LiveConfig`, which travels as the ingress
deployment's ``user_config`` so that Serve applies changes through ``reconfigure`` without
restarting any replica or worker.

Workers come in pools (:class:`PoolSpec`): a model either names a shared pool (``pool: name``),
whose workers load and unload models on demand within ``memory_mb`` of weights each, or gets a
dedicated pool of its own from ``replicas``, ``device`` and ``resources``, its model loaded on
every worker for good. Many models are declared as one entry (:class:`ModelSetSpec`): a glob or
directory of files and a template.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raysrv import batching, policies

__all__ = [
    "AppLive",
    "AppSpec",
    "BatchingSpec",
    "CatalogSpec",
    "IngressSpec",
    "InputSpec",
    "LiveConfig",
    "ModelLive",
    "ModelSetSpec",
    "ModelSpec",
    "ModelTemplate",
    "PoolSpec",
    "RaysrvSpec",
    "ResolvedPool",
    "ResourcesSpec",
    "SelectionSpec",
    "resolve_pools",
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


class ModelTemplate(_Strict):
    """Everything of a model but its name and source: one model's settings, or a set's."""

    runtime: Literal["onnx", "torch", "python"] = Field(description="What executes the model.")
    build: str | None = Field(
        None,
        description="'pkg.mod:fn' called as fn(source) when the source file does not exist yet.",
    )
    init_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for a factory or class source."
    )
    version: str = Field("1", min_length=1, description="Model version; part of the cache key.")
    pool: str | None = Field(
        None,
        pattern=_NAME,
        description="A shared pool from `pools` that loads the model on demand; unset: a "
        "dedicated pool of `replicas` workers with `device` and `resources`.",
    )
    group: str | None = Field(
        None,
        description="Models with alike run times (one architecture): a model never run yet is "
        "planned with its group's run times. A model set's models form a group.",
    )
    weights_mb: float | None = Field(
        None,
        gt=0.0,
        description="Memory the model's weights take in a worker, in MiB, for sources whose "
        "size is not a file's (factories, python classes); measured at the first load.",
    )
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
    def _device_and_resources_agree(self) -> ModelTemplate:
        if self.device == "gpu" and self.resources.num_gpus <= 0:
            raise ValueError("device 'gpu' needs resources.num_gpus > 0 (got 0)")
        if self.device == "cpu" and self.resources.num_gpus > 0:
            raise ValueError(f"device 'cpu' with resources.num_gpus={self.resources.num_gpus}")
        return self

    @model_validator(mode="after")
    def _pooled_takes_the_pools_workers(self) -> ModelTemplate:
        worker_keys = ("device", "replicas", "resources", "pipeline_depth")
        fields = type(self).model_fields
        clash = [
            k
            for k in worker_keys
            if getattr(self, k) != fields[k].get_default(call_default_factory=True)
        ]
        if self.pool is not None and clash:
            raise ValueError(
                f"a model in pool {self.pool!r} runs on the pool's workers: {clash} belong to "
                f"the pool, not to the model"
            )
        return self


class ModelSpec(ModelTemplate):
    name: str = Field(pattern=_NAME, description="Unique model name (lowercase, digits, - and _).")
    source: str = Field(
        min_length=1,
        description="onnx: a .onnx file; torch: a TorchScript file or 'pkg.mod:factory' returning "
        "an nn.Module; python: 'pkg.mod:Class' implementing predict_batch(inputs) -> outputs.",
    )

    @model_validator(mode="after")
    def _onnx_is_a_file(self) -> ModelSpec:
        if self.runtime == "onnx" and _is_import_path(self.source):
            raise ValueError(f"onnx source must be a .onnx file, got {self.source!r}")
        return self

    def weight_bytes(self) -> int | None:
        """The bytes its weights take: ``weights_mb`` if given, else its source file's size;
        None when neither is known before a load."""
        if self.weights_mb is not None:
            return int(self.weights_mb * MIB)
        if _is_import_path(self.source) or not os.path.isfile(self.source):
            return None
        return os.path.getsize(self.source)


MIB = 1 << 20


class ModelSetSpec(_Strict):
    """Many models as one entry: every file a glob (or directory) matches, one model each, all
    with one template. Model names are ``prefix`` + the file's stem."""

    name: str = Field(pattern=_NAME, description="The set's name; its models' group.")
    source: str = Field(
        min_length=1,
        description="A glob ('models/*.onnx') or a directory (every file in it), relative to "
        "the directory `serve run` starts in.",
    )
    prefix: str = Field("", pattern=r"^[a-z0-9_-]{0,32}$", description="Put before each stem.")
    template: ModelTemplate = Field(description="The settings of every model of the set.")

    def expand(self, root: Path) -> list[ModelSpec]:
        """One model per matching file, sorted by name; raises naming the set if none match
        or a name is not a valid model name."""
        pattern = Path(self.source).expanduser()
        pattern = pattern if pattern.is_absolute() else root / pattern
        if pattern.is_dir():
            pattern = pattern / "*"
        files = sorted(Path(p) for p in glob.glob(str(pattern)) if Path(p).is_file())
        if not files:
            raise ValueError(f"model set {self.name!r}: no file matches {str(pattern)!r}")
        group = self.template.group or self.name
        base = self.template.model_dump(exclude_unset=True)
        models = []
        for path in files:
            name = self.prefix + path.stem
            if not re.match(_NAME, name):
                raise ValueError(
                    f"model set {self.name!r}: file {path.name!r} gives the model name {name!r}, "
                    f"not of the form {_NAME}"
                )
            models.append(
                ModelSpec.model_validate(
                    {**base, "name": name, "source": str(path), "group": group}
                )
            )
        return models


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
    replicas: int = Field(1, ge=1, le=64, description="Ingress replicas (each runs its pools).")
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


class PoolSpec(_Strict):
    """A shared pool: ``workers`` identical workers that load the models naming it on demand
    and unload the least recently used ones to stay within ``memory_mb`` of weights each."""

    name: str = Field(pattern=_NAME, description="The pool's name, which models give as `pool`.")
    workers: int = Field(1, ge=1, le=1024, description="Worker actors in the pool.")
    device: Literal["cpu", "gpu"] = Field("cpu", description="Where the workers run.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per worker.")
    memory_mb: float = Field(
        gt=0.0, description="Model weights one worker may hold, in MiB; never exceeded."
    )
    pipeline_depth: int = Field(
        2, ge=1, le=8, description="Actions a worker may have in flight (1 running)."
    )

    @model_validator(mode="after")
    def _device_and_resources_agree(self) -> PoolSpec:
        if (self.device == "gpu") != (self.resources.num_gpus > 0):
            raise ValueError(
                f"pool {self.name!r}: device {self.device!r} with resources.num_gpus="
                f"{self.resources.num_gpus}"
            )
        return self


@dataclass(frozen=True)
class ResolvedPool:
    """A pool as it runs: a shared one from ``pools``, or a model's dedicated one (named after
    the model, its model pinned on every worker, no capacity)."""

    name: str
    workers: int
    device: str
    resources: ResourcesSpec
    capacity_bytes: int | None
    depth: int
    pinned: tuple[ModelSpec, ...] = ()

    @property
    def kind(self) -> str:
        """What run times are recorded under: the device and threads of a worker."""
        return f"{self.device}/{self.resources.threads}t"

    def worker_model(self, model: ModelSpec) -> ModelSpec:
        """``model`` as this pool's workers load it: on their device, with their threads."""
        if model.pool is None:
            return model
        resources = model.resources.model_copy(update={"threads": self.resources.threads})
        return model.model_copy(update={"device": self.device, "resources": resources})


def resolve_pools(pools: list[PoolSpec], models: list[ModelSpec]) -> list[ResolvedPool]:
    """Every pool the models run on: the shared ones, then one dedicated pool per model that
    names none."""
    shared = [
        ResolvedPool(
            p.name, p.workers, p.device, p.resources, int(p.memory_mb * MIB), p.pipeline_depth
        )
        for p in pools
    ]
    dedicated = [
        ResolvedPool(m.name, m.replicas, m.device, m.resources, None, m.pipeline_depth, (m,))
        for m in models
        if m.pool is None
    ]
    return shared + dedicated


class RaysrvSpec(_Strict):
    """The whole spec: pools, models, the apps that serve them, shared state and the ingress."""

    pools: list[PoolSpec] = Field(
        default_factory=list, description="Shared worker pools, which models join by name."
    )
    models: list[ModelSpec] = Field(default_factory=list, description="Models served.")
    model_sets: list[ModelSetSpec] = Field(
        default_factory=list, description="Many models as one entry each: files and a template."
    )
    apps: list[AppSpec] = Field(
        default_factory=list,
        description="Endpoints over some models (every model also answers at "
        "POST /v1/models/{name}/predict).",
    )
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
        if not self.models and not self.model_sets:
            raise ValueError("no models: give `models` or `model_sets`")
        _no_duplicates("model", [m.name for m in self.models])
        _no_duplicates("app", [a.name for a in self.apps])
        _no_duplicates("pool", [p.name for p in self.pools])
        _no_duplicates("model set", [s.name for s in self.model_sets])
        check_pools(self.pools, self.models + [_set_member(s) for s in self.model_sets])
        if not self.model_sets:  # names from sets are known once their files are listed
            check_apps(self.apps, self.models)
        return self

    def expanded(self, root: Path) -> RaysrvSpec:
        """This spec with every model set listed as its models (files matched under ``root``)."""
        models = list(self.models)
        for model_set in self.model_sets:
            models += model_set.expand(root)
        return RaysrvSpec.model_validate(
            {
                **self.model_dump(mode="json", exclude={"models", "model_sets"}),
                "models": [m.model_dump(mode="json") for m in models],
            }
        )

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def resolved_pools(self) -> list[ResolvedPool]:
        return resolve_pools(self.pools, self.models)

    def live(self) -> LiveConfig:
        """The live-tunable part of this spec, as the ingress ``user_config`` carries it."""
        return LiveConfig(
            models={m.name: ModelLive(batching=m.batching, slo_ms=m.slo_ms) for m in self.models},
            apps={
                a.name: AppLive(selection=a.selection, cache_size=a.cache_size, slo_ms=a.slo_ms)
                for a in self.apps
            },
        )


def _set_member(model_set: ModelSetSpec) -> ModelSpec:
    """A stand-in for a set's models in checks that need only the template."""
    fields = model_set.template.model_dump(exclude_unset=True)
    return ModelSpec.model_validate({**fields, "name": f"{model_set.name}-x", "source": "x"})


def check_pools(pools: list[PoolSpec], models: list[ModelSpec]) -> None:
    """Every named pool exists and no dedicated pool (named after its model) shadows one."""
    names = {p.name for p in pools}
    for model in models:
        if model.pool is not None and model.pool not in names:
            raise ValueError(
                f"model {model.name!r} names unknown pool {model.pool!r}; pools: {sorted(names)}"
            )
        if model.pool is None and model.name in names:
            raise ValueError(
                f"model {model.name!r} has a dedicated pool named like the shared pool "
                f"{model.name!r}: rename one"
            )


def check_apps(apps: list[AppSpec], models: list[ModelSpec]) -> None:
    """Every app names known models, all with one input."""
    by_name = {m.name: m for m in models}
    for app in apps:
        unknown = [m for m in app.models if m not in by_name]
        if unknown:
            raise ValueError(
                f"app {app.name!r} names unknown models {unknown}; known: {sorted(by_name)[:20]}"
            )
        inputs = {(by_name[m].input.shape, by_name[m].input.dtype) for m in app.models}
        if len(inputs) > 1:
            raise ValueError(
                f"app {app.name!r} mixes models with different inputs {sorted(inputs)}"
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


class CatalogSpec(_Strict):
    """Models served beyond the ``args``, added and removed live; each must join a shared pool
    (a dedicated pool would need workers of its own: declare such a model in ``args``)."""

    models: list[ModelSpec] = Field(default_factory=list, description="Models added live.")
    model_sets: list[ModelSetSpec] = Field(
        default_factory=list, description="Model sets added live."
    )

    @model_validator(mode="after")
    def _pooled(self) -> CatalogSpec:
        _no_duplicates("model", [m.name for m in self.models])
        members = self.models + [_set_member(s) for s in self.model_sets]
        unpooled = sorted(m.name for m in members if m.pool is None)
        if unpooled:
            raise ValueError(
                f"models added through user_config must name a shared pool (`pool`): {unpooled}"
            )
        return self

    def expanded(self, root: Path) -> list[ModelSpec]:
        models = list(self.models)
        for model_set in self.model_sets:
            models += model_set.expand(root)
        return models


class LiveConfig(_Strict):
    """Knobs applied live through the ingress deployment's ``user_config`` (no restarts).

    Entries override the spec in ``args``; fields left out keep their ``args`` values.
    ``catalog`` lists the models served on shared pools beyond the ``args``: a model listed
    there is added, one no longer listed is removed, and no worker restarts.
    """

    models: dict[str, ModelLive] = Field(default_factory=dict, description="Per model name.")
    apps: dict[str, AppLive] = Field(default_factory=dict, description="Per app name.")
    catalog: CatalogSpec = Field(
        default_factory=CatalogSpec, description="Models added live to shared pools."
    )

    def check_against(self, spec: RaysrvSpec, added: list[ModelSpec] | None = None) -> None:
        """Raise ``ValueError`` if this names models, apps or pools the spec does not have;
        ``added``: the catalog's models, once its sets are listed (without it, models of
        sets are not known by name and knobs for them are not checked)."""
        listed = added is not None or not (spec.model_sets or self.catalog.model_sets)
        added = added if added is not None else self.catalog.models
        check_pools(spec.pools, added + [_set_member(s) for s in self.catalog.model_sets])
        clash = sorted({m.name for m in added} & {m.name for m in spec.models})
        if clash:
            raise ValueError(f"user_config.catalog adds models the args already have: {clash}")
        checks = [("apps", self.apps, {a.name for a in spec.apps})]
        if listed:
            checks.append(("models", self.models, {m.name for m in spec.models + added}))
        for kind, names, known in checks:
            unknown = sorted(set(names) - known)
            if unknown:
                raise ValueError(
                    f"user_config.{kind} names unknown entries {unknown}; "
                    f"known: {sorted(known)[:20]}"
                )
