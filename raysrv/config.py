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

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from raysrv import policies
from raysrv._model_spec import (
    _NAME,
    MIB,
    BatchingSpec,
    Input,
    InputSpec,
    ModelSetSpec,
    ModelSpec,
    ModelTemplate,
    PartitionSpec,
    PoolSpec,
    ResolvedPool,
    ResourcesSpec,
    _check_params,
    _no_duplicates,
    _set_member,
    _Strict,
    check_pools,
    resolve_pools,
)

__all__ = [
    "AppLive",
    "AppSpec",
    "BatchingSpec",
    "CatalogSpec",
    "IngressSpec",
    "Input",
    "InputSpec",
    "LiveConfig",
    "ModelLive",
    "ModelSetSpec",
    "ModelSpec",
    "ModelTemplate",
    "PartitionSpec",
    "PoolSpec",
    "RaysrvSpec",
    "ResolvedPool",
    "ResourcesSpec",
    "SelectionSpec",
    "resolve_pools",
]


class SelectionSpec(_Strict):
    policy: str = Field(
        "single", description="Registered selection policy name or 'pkg.mod:Class'."
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the policy.")

    @model_validator(mode="after")
    def _params_fit_policy(self) -> SelectionSpec:
        _check_params("selection", policies.policy_class, self.policy, self.params)
        return self


MIN_KEY_CHARS = 16  # an API key's least length


def hard_to_guess(field: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` if each is at least ``MIN_KEY_CHARS`` printable ASCII characters without a
    space; else the error, which names the key by its place, never by its text."""
    for i, key in enumerate(keys):
        if len(key) < MIN_KEY_CHARS or not key.isascii() or not key.isprintable():
            raise ValueError(
                f"{field}[{i}] must be at least {MIN_KEY_CHARS} printable ASCII characters "
                f"(it has {len(key)})"
            )
        if " " in key:
            raise ValueError(f"{field}[{i}] must not hold spaces")
    return keys


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
    relabel: bool = Field(
        False,
        description="A second feedback for a query replaces the first: the selection takes the "
        "old label back and learns the new one. Off: one feedback a query, a second gets 409.",
    )
    feedback: bool = Field(
        True,
        description="Keep each answered query's input and predictions for a while (the state "
        "store's window) so that POST /v1/{name}/feedback can join a label with them. False: "
        "none is kept, a feedback gets 404, and each query costs the ingress less; only with a "
        "selection policy that does not learn, and without relabel or feedback_keys.",
    )
    feedback_keys: tuple[str, ...] = Field(
        (),
        repr=False,
        description="Keys of which a feedback to this app must carry one, as 'x-feedback-key: "
        "KEY' (else 401), compared in constant time: only those who hold one teach the app's "
        "selection. None: any caller of the feedback route may.",
    )

    @field_validator("feedback_keys")
    @classmethod
    def _feedback_keys_hard_to_guess(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return hard_to_guess("feedback_keys", keys)

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
        if not self.feedback:
            _without_feedback(self.name, self.selection, self.relabel, self.feedback_keys)
        if self.relabel and not cls.can_unobserve():
            raise ValueError(
                f"relabel: true needs a selection policy that can take a feedback back; "
                f"{self.selection.policy!r} defines no unobserve"
            )
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


def _without_feedback(
    app: str, selection: SelectionSpec, relabel: bool = False, keys: tuple[str, ...] = ()
) -> None:
    """``ValueError`` where an app that keeps no feedback (``feedback: false``) would need it."""
    if policies.policy_class(selection.policy).learns():
        raise ValueError(
            f"app {app!r} has feedback: false, but its selection policy {selection.policy!r} "
            f"learns from feedback; use a policy that does not learn, or feedback: true"
        )
    if relabel or keys:
        field = "relabel: true" if relabel else "feedback_keys"
        raise ValueError(f"app {app!r} has feedback: false: {field} needs feedback: true")


class IngressSpec(_Strict):
    replicas: int = Field(1, ge=1, le=64, description="Ingress replicas (each runs its pools).")
    num_cpus: float = Field(0.25, ge=0.0, description="Logical CPUs reserved per ingress replica.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies get 413.")
    max_inputs: int = Field(
        1024, ge=1, le=65_536, description="Inputs one request may carry ('inputs'); more get 413."
    )
    max_context_chars: int = Field(
        256,
        ge=1,
        le=1 << 20,
        description="Characters a query's context may have; a longer one gets 413 (every "
        "context an app has seen feedback for keeps a selection state).",
    )
    max_label_bytes: int = Field(
        65_536,
        ge=16,
        le=1 << 24,
        description="Bytes a feedback label may take as JSON; a larger one gets 413.",
    )
    store_budget_mb: float = Field(
        64.0,
        gt=0.0,
        le=1 << 20,
        description="MiB that each of the store's predictions, feedbacks and selection states "
        "may take in memory (state: memory, or Redis's fallback), per ingress replica, and "
        "that predictions and feedbacks may take in Redis, all replicas together; the oldest "
        "go first.",
    )
    api_keys: tuple[str, ...] = Field(
        (),
        repr=False,
        description="Keys of which a caller of the predict, infer and feedback routes must send "
        "one, as 'Authorization: Bearer KEY' or 'x-api-key: KEY' (else 401); compared in "
        "constant time. None: those routes are open, as on the examples' 127.0.0.1.",
    )
    max_ongoing_requests: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        256,
        description="Requests in flight per ingress replica before Serve queues them; 'auto': "
        "as many as its pools' workers answer within the SLO in full batches, each model timed "
        "where the application is built (for Serve's Python proxy, with max_queued_requests "
        "1; bench/RESULTS.md, 'Overload').",
    )
    health_check_period_s: float = Field(
        1.0,
        gt=0.0,
        le=3600.0,
        description="How often Serve checks each ingress replica: a replica that died is "
        "replaced within about this long (Serve's own default: 10 s).",
    )
    orphan_timeout_s: float = Field(
        60.0,
        gt=0.0,
        le=86_400.0,
        description="Seconds the worker actors of an ingress replica that died wait for a new "
        "replica to take them over, models loaded, before they exit.",
    )
    max_replicas_per_node: int | None = Field(
        None,
        ge=1,
        description="At most this many ingress replicas on one node (Serve's own option): 1 "
        "spreads them over the nodes, one a node.",
    )
    max_queued_requests: int = Field(
        128,
        ge=-1,
        description="Requests Serve queues for the ingress before answering 503 (-1: no bound).",
    )
    seed: int = Field(0, description="Seed of the selection policies' random generator.")
    plan_export_s: float = Field(
        15.0,
        ge=0.0,
        le=86_400.0,
        description="How often the ingress exports each model's predicted p99 latency "
        "(ray_raysrv_plan_predicted_p99_ms, as GET /v1/models/{model}/plan shows it) for the "
        "models queried since their last export, at most 8 at a time, those waiting longest "
        "first; 0: only when a plan is asked for.",
    )
    trip_back_quantile: float = Field(
        0.99,
        gt=0.0,
        le=1.0,
        description="For callers that send sent_at, what is kept back from each deadline for "
        "the answer's way back: this quantile (1: the longest) of the last 200 answers' trips "
        "from the workers to the ingress plus the shortest of the last 2,000 such queries' "
        "trips here, or this quantile of the last 200 trips here if less (alone until 20 "
        "answers are in).",
    )
    http_trip_back: Literal["replies", "loop"] = Field(
        "replies",
        description="For an answer over HTTP, 'loop' also keeps back, if less, the shortest "
        "of those trips plus trip_back_quantile of the last 200 waits of the ingress's "
        "scheduler for its event loop: on the many-model trace, 8-10 points more answered "
        "within the SLO, with 1-3 of 13,272 answers late (bench/RESULTS.md). 'replies': as "
        "for handle callers, no late answer in those runs.",
    )

    def store_budget_bytes(self) -> int:
        """``store_budget_mb`` in bytes."""
        return int(self.store_budget_mb * (1 << 20))

    @field_validator("max_queued_requests")
    @classmethod
    def _a_queue_serve_takes(cls, queued: int) -> int:
        if queued == 0:
            raise ValueError("must be -1 (no bound) or at least 1, as Serve takes it; got 0")
        return queued

    @field_validator("api_keys")
    @classmethod
    def _keys_hard_to_guess(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return hard_to_guess("api_keys", keys)


SECRET_FIELDS = ("api_keys", "feedback_keys")  # their values appear in no error
HIDDEN = "<hidden>"


def keys_hidden(error: ValidationError) -> ValidationError:
    """``error`` with every input that is, or holds, a value of ``SECRET_FIELDS`` hidden, and
    that of a key the spec does not know whose name speaks of keys or secrets (a misspelled
    ``api_keys`` holds keys)."""
    details = [
        InitErrorDetails(
            type=PydanticCustomError(e["type"], e["msg"]),
            loc=e["loc"],
            input=HIDDEN if _secret(e) else _masked(e["input"]),
        )
        for e in error.errors()
    ]
    return ValidationError.from_exception_data(error.title, details)


def _secret(error: Any) -> bool:
    if error["type"] == "extra_forbidden" and error["loc"]:
        return looks_secret(str(error["loc"][-1]))
    return any(p in SECRET_FIELDS for p in error["loc"])


def looks_secret(name: str) -> bool:
    """Whether an unknown key's name speaks of keys or secrets: its value is then not shown."""
    return any(word in name.lower() for word in ("key", "token", "secret", "password"))


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: HIDDEN if k in SECRET_FIELDS else _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value


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
    root: str | None = Field(
        None,
        description="Absolute directory that relative model paths (sources, model sets) are "
        "read from. `raysrv run FILE` sets it to FILE's directory; unset, the working "
        "directory of the process that builds the application (Serve's, wherever it runs).",
    )

    @field_validator("root")
    @classmethod
    def _root_absolute(cls, root: str | None) -> str | None:
        if root is not None and not Path(root).expanduser().is_absolute():
            raise ValueError(f"root must be an absolute directory, got {root!r}")
        return root

    @field_validator("state")
    @classmethod
    def _state_kind(cls, state: str) -> str:
        if state != "memory" and not re.match(r"^rediss?://", state):
            raise ValueError(f"state must be 'memory' or a redis:// URL, got {state!r}")
        return state

    @model_validator(mode="wrap")
    @classmethod
    def _keys_never_shown(cls, data: Any, handler: Any) -> RaysrvSpec:
        """Errors as pydantic gives them, but with the values of ``SECRET_FIELDS`` hidden in
        their inputs: Serve prints a spec's errors, and its logs would keep the keys."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise keys_hidden(exc) from None

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

    def base_dir(self) -> Path:
        """Where relative model paths are read from: ``root``, else the working directory."""
        return Path(self.root).expanduser() if self.root else Path.cwd()

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

    def ingress_resources(self) -> dict[str, float]:
        """What Ray reserves for each ingress replica: its own CPUs, and the CPUs, GPUs and
        memory of the workers of its colocated pools, which run in its process."""
        colocated = [p for p in self.resolved_pools() if p.placement == "colocated"]
        options = {"num_cpus": self.ingress.num_cpus}
        options["num_cpus"] += sum(p.workers * p.resources.num_cpus for p in colocated)
        if gpus := sum(p.workers * p.resources.num_gpus for p in colocated):
            options["num_gpus"] = gpus
        if memory_mb := sum(p.workers * (p.resources.memory_mb or 0) for p in colocated):
            options["memory"] = memory_mb * MIB
        custom: dict[str, float] = {}
        for pool in colocated:
            for name, amount in pool.resources.custom.items():
                custom[name] = custom.get(name, 0.0) + pool.workers * amount
        if custom:
            options["resources"] = custom
        return options


def check_apps(apps: list[AppSpec], models: list[ModelSpec]) -> None:
    """Every app names known models, all with one input."""
    by_name = {m.name: m for m in models}
    for app in apps:
        unknown = [m for m in app.models if m not in by_name]
        if unknown:
            raise ValueError(
                f"app {app.name!r} names unknown models {unknown}; known: {sorted(by_name)[:20]}"
            )
        inputs = {_input_kind(by_name[m].input) for m in app.models}
        if len(inputs) > 1:
            raise ValueError(
                f"app {app.name!r} mixes models with different inputs {sorted(inputs)}"
            )


def _input_kind(spec: InputSpec) -> tuple[Any, ...]:
    """What an app's models must agree on of their input: all but the profiling example."""
    return (spec.shape, spec.dtype) + ((spec.max_length,) if spec.text else ())


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

    Entries override the spec in ``args``; fields left out keep their ``args`` values. Serve
    hands the ingress the whole ``user_config`` each time, so a knob no longer listed goes
    back to its ``args`` value, whatever an earlier ``user_config`` set. The application
    builder deploys it empty: nothing overridden.
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
        for app in spec.apps:
            knobs = self.apps.get(app.name)
            if not app.feedback and knobs is not None and knobs.selection is not None:
                _without_feedback(app.name, knobs.selection)
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
