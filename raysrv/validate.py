"""``raysrv validate``: check a config file without starting Ray, reporting every problem.

Accepts a Ray Serve config (``applications: [...]``) whose raysrv applications carry the spec in
``args``, a KubeRay RayService manifest that embeds one as ``spec.serveConfigV2``, or a bare
raysrv spec (``models:``, ``apps:``). Besides raysrv's own schema it checks
what Serve lets through silently: unknown keys at the top level, in an application and in a
deployment override, deployment names that match nothing, and the ingress ``user_config``.
Each problem names its field path and the offending value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from raysrv._model_spec import is_import_path
from raysrv._plugins import import_object
from raysrv.config import (
    HIDDEN,
    SECRET_FIELDS,
    LiveConfig,
    ModelSetSpec,
    ModelSpec,
    RaysrvSpec,
    looks_secret,
)

__all__ = ["BUILDER", "Problem", "validate_document", "validate_file"]

BUILDER = "raysrv.app:build_app"


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    value: Any = None

    def __str__(self) -> str:
        shown = repr(self.value)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        return f"{self.path or '<root>'}: {self.message} (value: {shown})"


def _join(prefix: str, loc: Iterable[Any]) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _from_validation(prefix: str, error: ValidationError) -> list[Problem]:
    return [
        Problem(
            _join(prefix, e["loc"]),
            e["msg"].removeprefix("Value error, "),
            HIDDEN if any(part in SECRET_FIELDS for part in e["loc"]) else e.get("input"),
        )
        for e in error.errors()
    ]


def _unknown_keys(prefix: str, data: Any, schema: type[BaseModel]) -> list[Problem]:
    """Keys ``schema`` does not know, with their values unless their names speak of keys or
    secrets (a misspelled ``api_keys`` holds keys)."""
    if not isinstance(data, dict):
        return []
    known = set(schema.model_fields) | {f.alias for f in schema.model_fields.values() if f.alias}
    message = f"unknown key; known keys: {', '.join(sorted(known))}"
    return [
        Problem(_join(prefix, [key]), message, HIDDEN if looks_secret(str(key)) else data[key])
        for key in data
        if key not in known
    ]


def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``X`` or ``Optional[X]``), if any."""
    candidates = (annotation, *getattr(annotation, "__args__", ()))
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _check_spec(
    prefix: str, args: Any, deployments: Sequence[Any], root: Path | None, sources: bool
) -> list[Problem]:
    try:
        spec = RaysrvSpec.model_validate(args)
    except ValidationError as exc:
        return _from_validation(prefix + ".args" if prefix else "", exc)
    names = {"ingress"}
    at = prefix + ".args" if prefix else ""
    problems = _check_partitions(at, spec, root)
    if sources:
        base = _base(spec, root)
        problems += _check_sources(at, spec.models, spec.model_sets, base)
    for i, deployment in enumerate(deployments):
        where = f"{prefix}.deployments[{i}]"
        name = deployment.get("name") if isinstance(deployment, dict) else None
        if name not in names:
            problems.append(
                Problem(
                    where + ".name", f"no such deployment; raysrv deploys {sorted(names)}", name
                )
            )
        elif name == "ingress" and "user_config" in deployment:
            live = deployment["user_config"]
            found = _check_live(where + ".user_config", live, spec)
            if sources and not found:
                catalog = LiveConfig.model_validate(live).catalog
                at = where + ".user_config.catalog"
                found = _check_sources(at, catalog.models, catalog.model_sets, _base(spec, root))
            problems += found
    return problems


def _base(spec: RaysrvSpec, root: Path | None) -> Path:
    """Where the spec's relative model paths are read from."""
    return Path(spec.root).expanduser() if spec.root else (root or Path.cwd())


def _check_sources(
    prefix: str, models: Sequence[ModelSpec], model_sets: Sequence[ModelSetSpec], base: Path
) -> list[Problem]:
    """What a deploy would first find missing: each model's file exists (or its ``build``
    hook imports), each import path imports what it should, and each model set matches
    files. Importing runs the modules' code, as the workers will."""
    problems = []
    for i, model in enumerate(models):
        problems += _model_sources(_join(prefix, ["models", i]), model, base)
    for j, model_set in enumerate(model_sets):
        try:
            model_set.expand(base)
        except ValueError as exc:
            at = _join(prefix, ["model_sets", j, "source"])
            problems.append(Problem(at, str(exc), model_set.source))
    return problems


def _model_sources(prefix: str, model: ModelSpec, base: Path) -> list[Problem]:
    """The model's code imports, or its file exists, or its ``build`` hook, which a deploy
    calls only for a missing file, imports."""
    if model.runtime == "python" or (model.runtime == "torch" and is_import_path(model.source)):
        predicts = model.runtime == "python"
        problem = _importable(prefix + ".source", model.source, predicts)
        return [problem] if problem else []
    path = Path(model.source).expanduser()
    path = path if path.is_absolute() else base / path
    if path.is_file():
        return []
    if model.build is None:
        return [Problem(prefix + ".source", f"no such file: {path}", model.source)]
    problem = _importable(prefix + ".build", model.build)
    return [problem] if problem else []


def _importable(at: str, path: str, predicts: bool = False) -> Problem | None:
    """None if ``path`` imports as something callable (with ``predicts``, a factory or a
    class with ``predict_batch``), else the problem, at ``at``."""
    try:
        found = import_object(path)
    except ValueError as exc:
        return Problem(at, str(exc), path)
    except Exception as exc:  # the module's own code failed as it was imported
        return Problem(at, f"importing it raised {type(exc).__name__}: {exc}", path)
    if not callable(found):
        return Problem(at, f"of type {type(found).__name__}, not a class or a function", path)
    lacks = isinstance(found, type) and not callable(getattr(found, "predict_batch", None))
    if predicts and lacks:
        return Problem(at, f"class {found.__name__} has no predict_batch(inputs) method", path)
    return None


def _check_partitions(prefix: str, spec: RaysrvSpec, root: Path | None) -> list[Problem]:
    """Each partitioned model whose file is there fits its memory limit in some plan, a model
    set's every file included (a model built at its first start is checked by ``raysrv plan``,
    which builds it)."""
    base = _base(spec, root)
    found = [(["models", i], model) for i, model in enumerate(spec.models)]
    for j, model_set in enumerate(spec.model_sets):
        if model_set.template.partition is None:
            continue
        try:
            members = model_set.expand(base)
        except ValueError:  # no file yet: nothing to plan
            continue
        found += [(["model_sets", j, "template"], model) for model in members]
    problems = []
    for where, model in found:
        part = model.partition
        path = base / Path(model.source).expanduser()
        if part is None or not path.is_file():
            continue
        from raysrv.partitioning.planner import check_fits

        try:
            check_fits(path, part.workers, part.memory_limit_mb)
        except ValueError as exc:
            at = _join(prefix, [*where, "partition", "memory_limit_mb"])
            problems.append(Problem(at, f"{model.name}: {exc}", part.memory_limit_mb))
    return problems


def _check_live(prefix: str, data: Any, spec: RaysrvSpec) -> list[Problem]:
    try:
        LiveConfig.model_validate(data).check_against(spec)
    except ValidationError as exc:
        return _from_validation(prefix, exc)
    except ValueError as exc:
        return [Problem(prefix, str(exc), data)]
    return []


def _check_serve(doc: dict[str, Any], root: Path | None, sources: bool) -> list[Problem]:
    from ray.serve.schema import DeploymentSchema, ServeApplicationSchema, ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(doc)
    except ValidationError as exc:
        return _from_validation("", exc)
    problems = _unknown_keys("", doc, ServeDeploySchema)
    for key, field in ServeDeploySchema.model_fields.items():
        nested = _model_class(field.annotation)
        if nested is not None and key != "applications":
            problems += _unknown_keys(key, doc.get(key), nested)
    for i, app in enumerate(doc["applications"]):
        prefix = f"applications[{i}]"
        problems += _unknown_keys(prefix, app, ServeApplicationSchema)
        deployments = app.get("deployments") or []
        for j, deployment in enumerate(deployments):
            problems += _unknown_keys(f"{prefix}.deployments[{j}]", deployment, DeploymentSchema)
        if app.get("import_path") == BUILDER:
            problems += _check_spec(prefix, app.get("args") or {}, deployments, root, sources)
    return problems


def validate_document(doc: Any, root: Path | None = None, sources: bool = True) -> list[Problem]:
    """Every problem of a parsed config document (empty when it is valid); relative model
    paths are read from ``root`` (the file's directory), else the working directory. Without
    ``sources``, model files and import paths are not looked for (a config written for
    another machine)."""
    if isinstance(doc, dict) and doc.get("kind") == "RayService":
        return _check_ray_service(doc, root, sources)
    if isinstance(doc, dict) and "applications" in doc:
        return _check_serve(doc, root, sources)
    if isinstance(doc, dict) and {"models", "model_sets", "apps", "pools"} & set(doc):
        return _check_spec("", doc, [], root, sources)
    return [
        Problem(
            "",
            "expected a Serve config with 'applications' or a raysrv spec with 'models' and 'apps'",
            doc,
        )
    ]


def _check_ray_service(doc: dict[str, Any], root: Path | None, sources: bool) -> list[Problem]:
    """A KubeRay RayService manifest: the Serve config it embeds as ``spec.serveConfigV2``."""
    at = "spec.serveConfigV2"
    text = (doc.get("spec") or {}).get("serveConfigV2")
    if not isinstance(text, str):
        return [Problem(at, "a RayService needs its Serve config here, as a YAML string", text)]
    try:
        embedded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [Problem(at, f"not valid YAML: {exc}", None)]
    found = validate_document(embedded, root, sources)
    return [Problem(f"{at}.{p.path}" if p.path else at, p.message, p.value) for p in found]


def validate_file(path: str | Path, sources: bool = True) -> list[Problem]:
    """Every problem of the YAML file at ``path`` (``sources``: as in
    :func:`validate_document`)."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        return [Problem(str(path), f"cannot read file: {exc.strerror}", str(path))]
    except yaml.YAMLError as exc:
        return [Problem(str(path), f"not valid YAML: {exc}", None)]
    return validate_document(doc, Path(path).resolve().parent, sources)
