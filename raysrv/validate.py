"""``raysrv validate``: check a config file without starting Ray, reporting every problem.

Accepts a Ray Serve config (``applications: [...]``) whose raysrv applications carry the spec in
``args``, or a bare raysrv spec (``models:``, ``apps:``). Besides raysrv's own schema it checks
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

from raysrv.config import HIDDEN, SECRET_FIELDS, LiveConfig, RaysrvSpec, looks_secret

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
    prefix: str, args: Any, deployments: Sequence[Any], root: Path | None
) -> list[Problem]:
    try:
        spec = RaysrvSpec.model_validate(args)
    except ValidationError as exc:
        return _from_validation(prefix + ".args" if prefix else "", exc)
    names = {"ingress"}
    problems = _check_partitions(prefix + ".args" if prefix else "", spec, root)
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
            problems += _check_live(where + ".user_config", deployment["user_config"], spec)
    return problems


def _check_partitions(prefix: str, spec: RaysrvSpec, root: Path | None) -> list[Problem]:
    """Each partitioned model whose file is there fits its memory limit in some plan, a model
    set's every file included (a model built at its first start is checked by ``raysrv plan``,
    which builds it)."""
    base = Path(spec.root) if spec.root else (root or Path.cwd())
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


def _check_serve(doc: dict[str, Any], root: Path | None) -> list[Problem]:
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
            problems += _check_spec(prefix, app.get("args") or {}, deployments, root)
    return problems


def validate_document(doc: Any, root: Path | None = None) -> list[Problem]:
    """Every problem of a parsed config document (empty when it is valid); relative model
    paths are read from ``root`` (the file's directory), else the working directory."""
    if isinstance(doc, dict) and "applications" in doc:
        return _check_serve(doc, root)
    if isinstance(doc, dict) and {"models", "model_sets", "apps", "pools"} & set(doc):
        return _check_spec("", doc, [], root)
    return [
        Problem(
            "",
            "expected a Serve config with 'applications' or a raysrv spec with 'models' and 'apps'",
            doc,
        )
    ]


def validate_file(path: str | Path) -> list[Problem]:
    """Every problem of the YAML file at ``path``."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        return [Problem(str(path), f"cannot read file: {exc.strerror}", str(path))]
    except yaml.YAMLError as exc:
        return [Problem(str(path), f"not valid YAML: {exc}", None)]
    return validate_document(doc, Path(path).resolve().parent)
