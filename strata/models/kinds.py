"""Layer kinds: each attention kind's weight reader and its class in each implementation, put here
by the modules that define them, so that adding a kind touches its own files (and the spec that
names it), not a table in the loader or the executor.

    @reader(GQA)                        # in the torch reference's module: reads a layer's weights
    def read_gqa(cls, w, arch, hp, spec, rope): ...     # and builds cls (either implementation)
    @implements(GQA, "torch")           # on the torch reference class
    @implements(GQA, "native")          # on the native executor class (strata.models.executor)
    layer = build(spec, w, arch, hp, rope)              # the loader: the kind's reader, the class of w.impl

Modules are found, not listed: the first lookup imports every module of strata.models and of
strata.models.executor, whose decorators fill the table.
Must not: decide which implementation a layer gets (the reader's `impl`, from the compute, does).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class LayerKind:
    """One attention kind: `read` (cls, w, arch, hp, spec, rope) -> the layer built as cls;
    `classes`: implementation name ("torch", "native") -> its class."""

    name: str
    read: Callable | None = None
    classes: dict[str, type] = field(default_factory=dict)


_KINDS: dict[str, LayerKind] = {}
_found = False


def _kind(name: str) -> LayerKind:
    return _KINDS.setdefault(name, LayerKind(name))


def reader(kind: str) -> Callable:
    """Decorator: the function that reads a layer of `kind` from a file and builds it."""
    def put(fn: Callable) -> Callable:
        _kind(kind).read = fn
        return fn
    return put


def implements(kind: str, implementation: str) -> Callable:
    """Class decorator: the class of `kind` in `implementation` ("torch" or "native")."""
    def put(cls: type) -> type:
        _kind(kind).classes[implementation] = cls
        return cls
    return put


def _discover() -> None:
    """Import every module of strata.models and strata.models.executor once (their decorators
    register the kinds)."""
    global _found
    if _found:
        return
    for package in ("strata.models", "strata.models.executor"):
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{package}.{info.name}")
    _found = True


def get(name: str) -> LayerKind:
    """The registered kind `name`, or a ValueError naming the kinds there are."""
    _discover()
    kind = _KINDS.get(name)
    if kind is None or kind.read is None:
        raise ValueError(f"layer kind {name!r} has no reader (registered: {', '.join(names())})")
    return kind


def names() -> list[str]:
    """Every kind with a reader, sorted."""
    _discover()
    return sorted(k.name for k in _KINDS.values() if k.read is not None)


def native_classes() -> set[type]:
    """Every kind's native executor class."""
    return {get(name).classes["native"] for name in names()}


def build(spec, w, arch, hp, rope):
    """Layer spec.index's attention half, as its spec's kind reads it, in the reader's implementation
    (`w.impl.name`)."""
    kind = get(spec.attention.kind)
    cls = kind.classes.get(w.impl.name)
    if cls is None:
        raise ValueError(f"layer kind {kind.name!r} has no {w.impl.name} implementation")
    return kind.read(cls, w, arch, hp, spec, rope)


__all__ = ["LayerKind", "build", "get", "implements", "names", "native_classes", "reader"]
