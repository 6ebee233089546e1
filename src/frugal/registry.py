"""Named registries: how frugal chooses a backend, model or method by name without if-chains.

A `Registry[T]` maps a name ("rocksdb", "tiny-gpt", "ours") to an entry of type T (a
factory, a spec). Each area keeps one registry and registers its built-in entries where they
are defined; adding an engine or model is one new module plus one `register` call. Lookups of
an unknown name raise a `ConfigError` (a `ValueError`) that names the value and every valid choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from frugal import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind by name, in registration order.

    Args:
        kind: What the entries are, for messages ("store backend", "planner method").
        field: The setting users name an entry in, for messages ("backend", "method").

    Example:
        >>> codecs: Registry[int] = Registry("codec", field="codec")
        >>> codecs.register("fp32", 32)
        32
        >>> codecs.get("fp32")
        32
    """

    def __init__(self, kind: str, *, field: str) -> None:
        self.kind = kind
        self.field = field
        self._entries: dict[str, T] = {}

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
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"{self.field}={name!r} is not a registered {self.kind}; choose one of "
                f"{', '.join(self._entries)}"
            ) from None

    def check(self, name: str) -> str:
        """`name` itself when registered (for config validation); see `get` for the error."""
        self.get(name)
        return name

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
