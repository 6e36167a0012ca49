"""Name registries with an import-path escape hatch, shared by every pluggable family.

A config names a plugin either by its registered name (``aimd``) or by an import path
(``"mypkg.policies:MyPolicy"``). Unknown names fail with the list of known ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["LazyClasses", "import_object", "resolve"]


def import_object(path: str) -> Any:
    """Import ``"package.module:attribute"`` (or ``"package.module.attribute"``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path of the form 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} from {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None


def resolve(kind: str, name: str, registry: Mapping[str, type], base: type) -> type:
    """Return the class registered as ``name``, or imported from it if it is an import path."""
    if name in registry:
        return registry[name]
    if ":" not in name and "." not in name:
        known = ", ".join(sorted(registry))
        raise ValueError(
            f"unknown {kind} {name!r}; known: {known} (or an import path 'pkg.mod:Class')"
        )
    obj = import_object(name)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ValueError(
            f"{kind} {name!r} is not a subclass of {base.__module__}.{base.__qualname__}"
        )
    return obj


class LazyClasses(Mapping[str, type]):
    """A registry whose classes may be given as import paths, imported when first looked up."""

    def __init__(self, entries: Mapping[str, type | str]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> type:
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = import_object(entry)
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
