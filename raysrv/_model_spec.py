"""The models of a raysrv spec and the workers they run on: one model, many models from files
and a template, and the pools of workers (see :mod:`raysrv.config`, which gathers the whole
spec and re-exports these)."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raysrv import batching
from raysrv.batching.autoscale import AutoscalingSpec

__all__ = [
    "DTYPES",
    "MIB",
    "NUMERIC",
    "TEXT",
    "BatchingSpec",
    "Input",
    "InputSpec",
    "ModelSetSpec",
    "ModelSpec",
    "ModelTemplate",
    "PartitionSpec",
    "PoolSpec",
    "ResolvedPool",
    "ResourcesSpec",
    "check_pools",
    "is_import_path",
    "resolve_pools",
]

_NAME = r"^[a-z][a-z0-9_-]{0,62}$"
Placement = Literal["workers", "colocated", "auto"]
_PLACEMENT = (
    "Where the workers run: 'workers', each its own Ray actor; 'colocated', threads of the "
    "ingress process, which saves a call to another process per batch but shares the "
    "ingress's process and interpreter (for cheap models on few cores); 'auto', colocated "
    "where a batch of one of each of the pool's dedicated onnx or torch models runs in at "
    "most the CPU a call between processes costs, timed in the ingress as it starts (a CPU "
    "pool only), else workers."
)
NUMERIC = ("float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")
TEXT = ("string", "bytes")  # one value of variable length a query, for python-runtime models
DTYPES = NUMERIC + TEXT
MAX_LENGTH = 65536  # a string input's characters, or a bytes input's bytes, by default
Input = np.ndarray | str | bytes  # one query's input, as InputSpec reads it


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
    """One query's input: a tensor of a fixed ``shape`` and numeric ``dtype``, or one string
    or bytes value of at most ``max_length`` (characters or bytes), whose models see a list."""

    shape: tuple[int, ...] = Field(
        (), description="Shape of one input, without the batch dimension; none for string or bytes."
    )
    dtype: Literal[DTYPES] = Field("float32", description="Element type of the input.")  # type: ignore[valid-type]
    max_length: int = Field(
        MAX_LENGTH,
        ge=1,
        le=1 << 30,
        description="string: characters, bytes: bytes of one input at most; longer ones are "
        "refused with 413.",
    )
    example: str = Field(
        "",
        description="string or bytes (this text's UTF-8): the input that profiling runs and "
        "LOADs warm up with; give one of typical length.",
    )

    @field_validator("shape")
    @classmethod
    def _positive_dims(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in shape):
            raise ValueError(f"every dimension must be > 0, got {list(shape)}")
        return shape

    @model_validator(mode="after")
    def _fits_its_dtype(self) -> InputSpec:
        given = self.model_fields_set
        if self.text and self.shape:
            raise ValueError(f"a {self.dtype} input has no shape, got {list(self.shape)}")
        if not self.text and "shape" not in given:
            raise ValueError(f"an input of dtype {self.dtype} needs its shape")
        fields = type(self).model_fields
        extra = [k for k in ("max_length", "example") if getattr(self, k) != fields[k].default]
        if not self.text and extra:
            raise ValueError(f"{extra} belong to string and bytes inputs, not {self.dtype}")
        size = len(self.example.encode() if self.dtype == "bytes" else self.example)
        if size > self.max_length:
            raise ValueError(f"example's length {size} is more than max_length {self.max_length}")
        return self

    @property
    def text(self) -> bool:
        """Whether one input is a string or bytes value rather than a tensor."""
        return self.dtype in TEXT

    def batch(self, size: int) -> np.ndarray | list[str] | list[bytes]:
        """A batch of ``size`` inputs for profiling and warm-up: zeros, or the ``example``."""
        if self.dtype == "string":
            return [self.example] * size
        if self.dtype == "bytes":
            return [self.example.encode()] * size
        return np.zeros((size, *self.shape), dtype=self.dtype)


class ResourcesSpec(_Strict):
    num_cpus: float = Field(1.0, ge=0.0, description="Logical CPUs reserved per replica.")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs reserved per replica.")
    memory_mb: int | None = Field(None, gt=0, description="Memory reserved per replica, in MiB.")
    custom: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources reserved per replica, e.g. {fast-disk: 1}: it runs "
        "only on a node that offers them (`ray start --resources`).",
    )
    threads: int = Field(1, ge=1, le=256, description="Intra-op threads of the runtime.")
    niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="Steps of OS niceness (Linux) a worker's batches run below its other "
        "threads and the ingress, so that on a busy host scheduling and replies come first, at "
        "the batches' cost; 0 leaves them as they are.",
    )
    load_niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="The same for a worker's LOADs and UNLOADs, so that they yield the CPU to "
        "batches.",
    )

    @field_validator("custom")
    @classmethod
    def _custom_resources(cls, custom: dict[str, float]) -> dict[str, float]:
        builtin = sorted(set(custom) & {"CPU", "GPU", "memory", "object_store_memory"})
        if builtin:
            raise ValueError(
                f"custom names Ray's own resources {builtin}: use num_cpus, num_gpus, memory_mb"
            )
        empty = sorted(k for k, v in custom.items() if v <= 0)
        if empty:
            raise ValueError(f"custom resources must be more than 0: {empty}")
        return custom


class PartitionSpec(_Strict):
    """A model split across shard workers that run it fork-join with its replica's worker, the
    leader (gillis §III-IV): how it is planned, and what each shard worker reserves."""

    objective: Literal["latency", "cost"] = Field(
        "latency",
        description="'latency': the fastest plan (gillis §IV-B); 'cost': the one of least busy "
        "time within slo_ms (gillis §IV-C).",
    )
    workers: int = Field(2, ge=1, le=64, description="Shard workers one round uses at most.")
    memory_limit_mb: float = Field(
        gt=0.0,
        description="What one shard holds at most, in MiB: its weights and the activations it "
        "reads and writes; the leader's shards together too.",
    )
    slo_ms: float | None = Field(
        None, gt=0.0, description="Predicted latency a plan must meet ('cost' needs it)."
    )
    num_cpus: float = Field(
        0.5, gt=0.0, description="Logical CPUs each shard worker reserves in the placement group."
    )
    timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="How long the leader waits for a shard's answer; past it the batch fails.",
    )

    @model_validator(mode="after")
    def _cost_needs_an_slo(self) -> PartitionSpec:
        if self.objective == "cost" and self.slo_ms is None:
            raise ValueError("objective 'cost' needs slo_ms: the latency its plan must meet")
        return self


class BatchingSpec(_Strict):
    policy: str = Field("fixed", description="Registered batching policy name or 'pkg.mod:Class'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the policy.")

    @model_validator(mode="after")
    def _params_fit_policy(self) -> BatchingSpec:
        _check_params("batching", batching.policy_class, self.policy, self.params)
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
    replicas: int = Field(
        1, ge=1, le=1024, description="Number of replica actors (with autoscaling: at start)."
    )
    autoscaling: AutoscalingSpec | None = Field(
        None,
        description="Add and remove replicas live between min and max: 'analytic' from a "
        "model of the queue, 'reactive' from the queries in flight; unset, `replicas` stay.",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per replica.")
    placement: Placement = Field("workers", description=_PLACEMENT)
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
    lanes: int = Field(
        1,
        ge=1,
        le=64,
        description="Replicas that share one process and one copy of the weights, each running "
        "its own batches beside the others' (`replicas` counts lanes); the model's "
        "predict_batch is then called from several threads at once.",
    )
    input: InputSpec = Field(description="What one query's input is: shape and dtype.")
    partition: PartitionSpec | None = Field(
        None,
        description="Split the model across shard workers (onnx models of a dedicated pool on "
        "CPU workers): see PartitionSpec; unset, each worker holds the whole model.",
    )
    warm_up: bool = Field(
        True,
        description="Run a batch of one as the last step of every LOAD, so that the first "
        "query after it does not pay the runtime's first-run setup, and a model that cannot "
        "run fails its LOAD; false takes that run out of every cold start, for models whose "
        "first run is no slower than the next.",
    )

    @model_validator(mode="after")
    def _device_and_resources_agree(self) -> ModelTemplate:
        if self.device == "gpu" and self.resources.num_gpus <= 0:
            raise ValueError("device 'gpu' needs resources.num_gpus > 0 (got 0)")
        if self.device == "cpu" and self.resources.num_gpus > 0:
            raise ValueError(f"device 'cpu' with resources.num_gpus={self.resources.num_gpus}")
        return self

    @model_validator(mode="after")
    def _text_for_python_models(self) -> ModelTemplate:
        if self.input.text and self.runtime != "python":
            raise ValueError(
                f"input.dtype {self.input.dtype!r} needs runtime 'python' (got "
                f"{self.runtime!r}, whose models take numeric tensors)"
            )
        return self

    @model_validator(mode="after")
    def _partitioned_on_its_own_workers(self) -> ModelTemplate:
        if self.partition is None:
            return self
        clash = [
            f"{key} {value!r}"
            for key, value, wanted in (
                ("runtime", self.runtime, "onnx"),
                ("pool", self.pool, None),
                ("placement", self.placement, "workers"),
                ("device", self.device, "cpu"),
            )
            if value != wanted
        ]
        if clash:
            raise ValueError(
                "partition needs an onnx model on a dedicated pool of CPU workers (runtime "
                "'onnx', no pool, placement 'workers', device 'cpu'); got " + ", ".join(clash)
            )
        if self.resources.num_cpus <= 0:
            raise ValueError(
                "partition needs resources.num_cpus > 0: the leader's bundle of its placement "
                f"group holds them (got {self.resources.num_cpus:g})"
            )
        return self

    @model_validator(mode="after")
    def _lanes_of_whole_models(self) -> ModelTemplate:
        if self.lanes > 1 and self.partition is not None:
            raise ValueError(
                f"lanes {self.lanes} of a partitioned model: its leader runs one batch at a time "
                "across its shards; give `replicas` instead"
            )
        return self

    @model_validator(mode="after")
    def _partitioned_replicas_stay(self) -> ModelTemplate:
        if self.partition is not None and self.autoscaling is not None:
            raise ValueError(
                "autoscaling of a partitioned model: its replicas' placement groups are planned "
                "once, at start; give `replicas` instead"
            )
        return self

    @model_validator(mode="after")
    def _serf_profiles_on_cpus(self) -> ModelTemplate:
        serf = self.autoscaling is not None and self.autoscaling.policy == "serf"
        if serf and self.device != "cpu":
            raise ValueError(
                f"autoscaling.policy 'serf' with device {self.device!r}: it profiles the "
                "model's threads on the ingress's CPUs; use 'analytic' or 'reactive'"
            )
        return self

    @model_validator(mode="after")
    def _pooled_takes_the_pools_workers(self) -> ModelTemplate:
        worker_keys = (
            "device",
            "replicas",
            "autoscaling",
            "resources",
            "placement",
            "pipeline_depth",
            "lanes",
        )
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
        if self.runtime == "onnx" and is_import_path(self.source):
            raise ValueError(f"onnx source must be a .onnx file, got {self.source!r}")
        return self

    def weight_bytes(self) -> int | None:
        """The bytes its weights take in a worker: ``weights_mb`` if given, else its source
        file's size; None when neither is known before a load, or the model is partitioned
        (its leader holds only its shards)."""
        if self.weights_mb is not None:
            return int(self.weights_mb * MIB)
        if self.partition is not None:
            return None
        if is_import_path(self.source) or not os.path.isfile(self.source):
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


def is_import_path(source: str) -> bool:
    """Whether a model's ``source`` names ``pkg.mod:attr`` rather than a file."""
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", source))


class PoolSpec(_Strict):
    """A shared pool: ``workers`` identical workers that load the models naming it on demand
    and unload the least recently used ones to stay within ``memory_mb`` of weights each."""

    name: str = Field(pattern=_NAME, description="The pool's name, which models give as `pool`.")
    workers: int = Field(
        1, ge=1, le=1024, description="Workers in the pool (with autoscaling: at start)."
    )
    device: Literal["cpu", "gpu"] = Field("cpu", description="Where the workers run.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per worker.")
    placement: Placement = Field("workers", description=_PLACEMENT)
    memory_mb: float = Field(
        gt=0.0, description="Model weights one worker may hold, in MiB; never exceeded."
    )
    pipeline_depth: int = Field(
        2, ge=1, le=8, description="Actions a worker may have in flight (1 running)."
    )
    autoscaling: AutoscalingSpec | None = Field(
        None,
        description="Workers added and removed live between min and max (`workers`: at "
        "start): 'analytic' or 'reactive'.",
    )

    @model_validator(mode="after")
    def _serf_needs_a_dedicated_model(self) -> PoolSpec:
        if self.autoscaling is not None and self.autoscaling.policy == "serf":
            raise ValueError(
                f"pool {self.name!r}: autoscaling.policy 'serf' profiles one model's threads "
                "before it serves, and a shared pool's models load on demand; use 'analytic' "
                "or 'reactive'"
            )
        return self

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
    placement: Placement = "workers"
    autoscaling: AutoscalingSpec | None = None
    lanes: int = 1

    @property
    def shape(self) -> tuple[int, int]:
        """A worker process's intra-op threads and lanes, as deployed."""
        return self.resources.threads, self.lanes

    @property
    def kind(self) -> str:
        """What run times are recorded under: the device and threads of a worker."""
        return f"{self.device}/{self.resources.threads}t"

    def worker_model(self, model: ModelSpec) -> ModelSpec:
        """``model`` as this pool's workers load it: on their device, with their resources
        (threads, GPUs), and no longer naming the pool, whose workers' settings it now carries
        (a worker validates it again)."""
        if model.pool is None:
            return model
        update = {"device": self.device, "resources": self.resources, "pool": None}
        return model.model_copy(update=update)


def resolve_pools(pools: list[PoolSpec], models: list[ModelSpec]) -> list[ResolvedPool]:
    """Every pool the models run on: the shared ones, then one dedicated pool per model that
    names none."""
    shared = [
        ResolvedPool(
            p.name,
            _starting(p.workers, p.autoscaling),
            p.device,
            p.resources,
            int(p.memory_mb * MIB),
            p.pipeline_depth,
            placement=p.placement,
            autoscaling=p.autoscaling,
        )
        for p in pools
    ]
    dedicated = [
        ResolvedPool(
            m.name,
            _starting(m.replicas, m.autoscaling),
            m.device,
            m.resources,
            None,
            m.pipeline_depth,
            (m,),
            m.placement,
            m.autoscaling,
            m.lanes,
        )
        for m in models
        if m.pool is None
    ]
    return shared + dedicated


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


def _no_duplicates(kind: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{kind} names must be unique, repeated: {dupes}")


def _starting(replicas: int, autoscaling: AutoscalingSpec | None) -> int:
    """The workers a pool starts with: ``replicas`` (a shared pool's ``workers``), within the
    autoscaler's bounds, and one at the least (a pool that may stop starts with one, and stops
    once idle)."""
    if autoscaling is None:
        return replicas
    return max(1, autoscaling.min, min(replicas, autoscaling.max))
