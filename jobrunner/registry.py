"""One registry type for every plug-in kind: engines, quantizers, executors and data formats.

A registry maps a name to an object. Each registry's built-ins are registered in one place (the
module that owns the registry), never by importing a module for its side effect. An entry may
be a `"module:attr"` string, imported on first lookup: that keeps a heavy package (ray) out of
the import of everything that only lists the names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from jobrunner.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects by name. `what` names the setting that chooses one, for errors (`model.quantization`)."""

    def __init__(self, what: str, entries: dict[str, T] | None = None) -> None:
        self.what = what
        self._entries: dict[str, T] = dict(entries or {})
        self._lazy: dict[str, str] = {}  # name -> "module:attr", imported on first lookup

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """`reg.register("x", obj)`, or `@reg.register("x")` as a decorator."""
        if obj is not None:
            self._entries[name] = obj
            return obj

        def deco(o: T) -> T:
            self._entries[name] = o
            return o

        return deco

    def register_lazy(self, name: str, target: str) -> None:
        """Register `"module:attr"`, imported when `name` is first looked up."""
        self._lazy[name] = target

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._lazy.pop(name, None)

    def get(self, name: str) -> T:
        """The object registered as `name`; a ConfigError naming the known names otherwise."""
        if name in self._lazy:
            module, _, attr = self._lazy[name].partition(":")
            self._entries[name] = getattr(importlib.import_module(module), attr)
            del self._lazy[name]
        if name not in self._entries:
            raise ConfigError(f"{self.what}: {name!r} is not one of {', '.join(self.names())}")
        return self._entries[name]

    def values(self) -> list[T]:
        return [self.get(n) for n in self.names()]

    def names(self) -> list[str]:
        return [*self._entries, *self._lazy]

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries) + len(self._lazy)
