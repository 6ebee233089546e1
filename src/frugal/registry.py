"""Named registries: how frugal chooses a backend, model or method by name without if-chains.

A `Registry[T]` maps a name ("rocksdb", "tiny-gpt", "ours") to an entry of type T (a
factory, a spec). Each area keeps one registry and registers its built-in entries where they
are defined; adding an engine or model is one new module plus one `register` call. Lookups of
an unknown name raise a `ConfigError` (a `ValueError`) that names the value and every valid choice.

Users add entries from their own code in two ways that reach every process of a job (the
torchrun workers are fresh processes, so a `register` call in the launching script alone does
not): modules named in the `FRUGAL_PLUGINS` environment variable (comma-separated, importable
on `sys.path`; importing them runs their `register` calls), and installed packages' entry
points in a registry's group (`[project.entry-points."frugal.recsys.datasets"]`, name = entry).
Both load on the first lookup a registry cannot answer. A registry may also resolve names of
the form `package.module:attribute` itself (its `resolver`; the tgraph models do), so that
`--model my_pkg.models:MyTGNN` works without any registration code.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from frugal import ConfigError

__all__ = ["PLUGINS_ENV", "Registry", "import_object", "load_plugin_modules"]

T = TypeVar("T")

PLUGINS_ENV = "FRUGAL_PLUGINS"
"""Environment variable naming modules to import (comma-separated) for their registrations."""
_imported: set[str] = set()


def load_plugin_modules() -> tuple[str, ...]:
    """Import every module `FRUGAL_PLUGINS` names (once per process); return their names.

    Raises:
        ConfigError: If a module cannot be imported (names it, the variable and the fix).
    """
    names = tuple(n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip())
    for name in names:
        if name in _imported:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(
                f"{PLUGINS_ENV} names module {name!r}, which cannot be imported ({exc}); put "
                "its folder on PYTHONPATH (or install it), or remove it from the variable"
            ) from exc
        _imported.add(name)
    return names


def import_object(reference: str, *, field: str = "name") -> object:
    """The object a `package.module:attribute` reference names (`attribute` may be dotted).

    As uvicorn and gunicorn resolve `module:app`, the module is imported from `sys.path`, and
    from the current folder when it is not there (a console script does not put it there).

    Args:
        reference: `package.module:attribute`.
        field: The setting the reference was given in, for messages ("model").

    Returns:
        The attribute.

    Raises:
        ConfigError: If the reference is malformed, the module cannot be imported or has no
            such attribute (the message names which, and the fix).
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute or " " in reference or ":" in attribute:
        raise ConfigError(
            f"{field}={reference!r} is not a 'package.module:attribute' reference; write it "
            "as my_pkg.models:MyModel"
        )
    cwd = os.getcwd()
    try:
        if cwd not in sys.path and importlib.util.find_spec(module_name.split(".")[0]) is None:
            sys.path.insert(0, cwd)
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{field}={reference!r}: module {module_name!r} cannot be imported ({exc}); run "
            "from the folder that holds it, put that folder on PYTHONPATH, or install it"
        ) from exc
    except Exception as exc:  # the user's module itself fails: a syntax error, a raise
        raise ConfigError(
            f"{field}={reference!r}: importing module {module_name!r} failed with "
            f"{type(exc).__name__}: {exc}; fix the module (python -c 'import {module_name}' "
            "shows the traceback)"
        ) from exc
    value: object = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            public = sorted(n for n in vars(module) if not n.startswith("_"))
            raise ConfigError(
                f"{field}={reference!r}: module {module_name!r} has no attribute {attribute!r}; "
                f"it defines {', '.join(public) or 'nothing public'}"
            )
        value = getattr(value, part)
    return value


class Registry(Generic[T]):
    """Entries of one kind by name, in registration order.

    Args:
        kind: What the entries are, for messages ("store backend", "planner method").
        field: The setting users name an entry in, for messages ("backend", "method").
        entry_point_group: Installed packages' entry points in this group are registered on
            a missed lookup.
        resolver: Called on a missed lookup of a name with a ':' (`package.module:attr`);
            returns the entry to register under that name, or raises `ConfigError`.

    Example:
        >>> codecs: Registry[int] = Registry("codec", field="codec")
        >>> codecs.register("fp32", 32)
        32
        >>> codecs.get("fp32")
        32
    """

    def __init__(
        self,
        kind: str,
        *,
        field: str,
        entry_point_group: str | None = None,
        resolver: Callable[[str], T] | None = None,
    ) -> None:
        self.kind = kind
        self.field = field
        self.entry_point_group = entry_point_group
        self.resolver = resolver
        self._entries: dict[str, T] = {}
        self._plugins_loaded = False

    def _load_plugins(self) -> None:
        """Import `FRUGAL_PLUGINS` modules and register this group's entry points (once)."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        load_plugin_modules()
        if self.entry_point_group is None:
            return
        for point in entry_points(group=self.entry_point_group):
            if point.name in self._entries:
                continue
            try:
                entry = point.load()
            except Exception as exc:
                raise ConfigError(
                    f"the {self.kind} entry point {point.name!r} = {point.value!r} (group "
                    f"{self.entry_point_group!r}) fails to load: {exc!r}; fix or uninstall the "
                    "package that declares it"
                ) from exc
            self.register(point.name, entry)

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add `entry` under `name`; return it (so it also works as a decorator's body).

        Raises:
            ValueError: If `name` is empty or already registered (unless `replace`).
        """
        if not name or name != name.strip():
            raise ValueError(f"{self.kind} name {name!r} must be non-empty, without spaces")
        if name in self._entries and not replace:
            raise ValueError(
                f"{self.kind} {name!r} is already registered; pick another name or pass "
                "replace=True"
            )
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return the entry registered as `name` (see `get` for the error)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def decorator(self, name: str) -> Callable[[T], T]:
        """`@registry.decorator("name")` registers the decorated object under `name`."""

        def add(entry: T) -> T:
            return self.register(name, entry)

        return add

    def get(self, name: str) -> T:
        """The entry registered as `name`.

        Raises:
            ConfigError: If no entry has that name (the message lists every registered one).
        """
        if name not in self._entries:
            self._load_plugins()
        if name not in self._entries and self.resolver is not None and ":" in name:
            self._entries[name] = self.resolver(name)
        try:
            return self._entries[name]
        except KeyError:
            where = f" or an entry point in group {self.entry_point_group!r}" * bool(
                self.entry_point_group
            )
            raise ConfigError(
                f"{self.field}={name!r} is not a registered {self.kind}; choose one of "
                f"{', '.join(self._entries)}, or register it from a module named in "
                f"{PLUGINS_ENV}{where}"
                + " (or name it as package.module:attribute)"
                * (self.resolver is not None)
            ) from None

    def check(self, name: str) -> str:
        """`name` itself when registered (for config validation); see `get` for the error."""
        self.get(name)
        return name

    def names(self) -> tuple[str, ...]:
        """Every registered name (plugins' included), in registration order."""
        self._load_plugins()
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        """Whether `name` is registered or resolves (a reference that fails to resolve: False)."""
        if name not in self._entries:
            self._load_plugins()
        if name not in self._entries and self.resolver is not None and isinstance(name, str):
            try:
                self.get(name)
            except ConfigError:
                return False
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
