"""Config dataclasses: strict loading from TOML and dicts, `--set` overrides, TOML/JSON output.

Every frugal component owns a frozen, kw-only dataclass `Config` whose `__post_init__`
validates its fields (see STYLE.md, section 2.1). This module turns plain data (a TOML file,
a JSON document, `--set a.b=value` strings) into such Config trees and back. Loading is strict:
an unknown key, a missing required key or a value of the wrong type raises `ConfigError` naming
the source, the dotted key and what is allowed.

Supported field types: `bool`, `int`, `float` (an int is accepted), `str`, `Literal[...]`,
`tuple[X, ...]`, `tuple[X, Y, ...]`, `X | None` and nested Config dataclasses.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import itertools
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import tomli_w

from frugal import ConfigError

__all__ = [
    "ConfigError",
    "apply_overrides",
    "check_types",
    "config_from_dict",
    "config_to_commented_toml",
    "config_to_dict",
    "config_to_json",
    "config_to_toml",
    "field_docs",
    "load_config",
]

T = TypeVar("T")
_UTF8_BOM = b"\xef\xbb\xbf"


def _is_config_class(tp: object) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _describe(tp: object) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if _is_config_class(tp):
        return f"a table ({getattr(tp, '__qualname__', tp)})"
    return str(tp).replace("typing.", "") if not isinstance(tp, type) else tp.__name__


def _convert(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check `value` against the annotation `tp`; convert lists to tuples, tables to Configs."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = get_args(tp)
        if value is None and type(None) in members:
            return None
        errors = []
        for member in members:
            if member is type(None):
                continue
            try:
                return _convert(value, member, key, source)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(
            f"{source}: {key} = {value!r} is not {_describe(tp)}; " + "; ".join(errors)
        )
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed or type(value) is not type(allowed[0]):
            raise ConfigError(
                f"{source}: {key} = {value!r} is not allowed; choose one of "
                + ", ".join(repr(a) for a in allowed)
            )
        return value
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {key} = {value!r} must be an array ({_describe(tp)})")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(
                f"{source}: {key} = {value!r} must have {len(args)} items ({_describe(tp)})"
            )
        return tuple(
            _convert(v, a, f"{key}[{i}]", source)
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if _is_config_class(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{source}: {key} must be {_describe(tp)}, got {value!r}; set its fields with "
                f"dotted keys (e.g. {key}.FIELD=VALUE)"
            )
        return config_from_dict(tp, value, source=source, prefix=key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} = {value!r} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key} = {value!r} must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {key} = {value!r} must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(
                f"{source}: {key} = {value!r} must be a string (on the command line, quote "
                f"it: --set '{key}=\"...\"')"
            )
        return value
    raise TypeError(f"config field {key} has unsupported annotation {tp!r}")


def config_from_dict(
    cls: type[T], data: Mapping[str, Any], *, source: str = "<dict>", prefix: str = ""
) -> T:
    """Build a Config of class `cls` from plain data, strictly.

    Args:
        cls: A dataclass Config class.
        data: Keys are field names; nested Configs are nested mappings.
        source: Where the data came from (a file name), used in error messages.
        prefix: Dotted key of `data` inside the root table, used in error messages.

    Returns:
        A validated instance of `cls`.

    Raises:
        ConfigError: On an unknown key, a missing required key, a value of the wrong type, or
            a value that the Config's own validation rejects.
        TypeError: If `cls` is not a dataclass or a field has an unsupported annotation.
    """
    if not _is_config_class(cls):
        raise TypeError(f"{cls!r} is not a Config dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {prefix or 'the config'} must be a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    where = f"{prefix}." if prefix else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key {where}{unknown[0]}; allowed keys"
            f"{' in [' + prefix + ']' if prefix else ''}: {', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            value = data[name]
            default = _field_default(field)
            if isinstance(value, Mapping) and _is_config_instance(default):
                # A nested table overrides the keys it names of the field's default (e.g.
                # `embedding_optimizer.lr` keeps the default's kind), not of its class.
                value = {**config_to_dict(default), **value}
            kwargs[name] = _convert(value, hints[name], f"{where}{name}", source)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required key {where}{name}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        if message.startswith(f"{source}:"):  # already names its source (a nested table)
            raise
        raise ConfigError(f"{source}: {f'[{prefix}] ' if prefix else ''}{message}") from exc


def _field_default(field: dataclasses.Field[Any]) -> Any:
    """A field's default value (calling its default_factory), or MISSING."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _is_config_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def check_types(config: object) -> None:
    """Check every field of a Config instance against its annotation (call in __post_init__).

    Catches what a type checker cannot see at run time: a Literal given another string, a
    float where an int is declared, a string where a number is, NaN or infinity in a float.

    Raises:
        ConfigError: Naming the class, the field, the value and what is allowed.
    """
    cls = type(config)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, field.name)
        _convert(value, hints[field.name], field.name, cls.__qualname__)
        _check_finite(value, field.name, cls.__qualname__)


def _check_finite(value: Any, where: str, owner: str) -> None:
    """Raise on NaN or infinity in a float field or in any item of a tuple/list field.

    Nested Configs are not entered: they check themselves.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{owner}: {where} = {value} must be finite")
    if isinstance(value, (tuple, list)):
        for k, item in enumerate(value):
            _check_finite(item, f"{where}[{k}]", owner)


def config_to_dict(config: object) -> dict[str, Any]:
    """Return the Config as plain data (tuples become lists; `None` fields are kept).

    Raises:
        TypeError: If `config` is not a dataclass instance.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{config!r} is not a Config instance")

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value

    result: dict[str, Any] = plain(config)
    return result


def config_to_json(config: object) -> str:
    """Return the Config as a JSON document (sorted keys, 2-space indent)."""
    return json.dumps(config_to_dict(config), indent=2, sort_keys=True)


def config_to_toml(config: object) -> str:
    """Return the Config as a TOML document; fields that are `None` are left out.

    TOML has no null, so an omitted optional field loads back as its default (None).
    """

    def drop_none(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: drop_none(v) for k, v in value.items() if v is not None}
        return value

    return tomli_w.dumps(drop_none(config_to_dict(config)))


_FIELD_DOCS: dict[type[Any], dict[str, str]] = {}


def field_docs(cls: type[Any]) -> dict[str, str]:
    """The attribute docstrings of a Config class: field name -> its docstring.

    The docstring of a field is the string literal under it (see STYLE.md, section 2.1),
    read from the source of `cls` and of its dataclass bases. A field without one is absent;
    a class whose source cannot be read gives no docs.

    Args:
        cls: A Config dataclass.

    Returns:
        The cleaned docstring of each documented field, in field order.
    """
    if cls not in _FIELD_DOCS:  # the source is parsed once per class
        _FIELD_DOCS[cls] = _read_field_docs(cls)
    return dict(_FIELD_DOCS[cls])


def _read_field_docs(cls: type[Any]) -> dict[str, str]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source: a built or generated class
            continue
        body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef)), [])
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    names = [f.name for f in dataclasses.fields(cls)]
    return {name: docs[name] for name in names if name in docs}


def config_to_commented_toml(config: object) -> str:
    """Return the Config as a TOML document with each field's docstring as a comment above it.

    What `--print-config` prints: the resolved settings of a command, ready to save, edit and
    pass back with `--config FILE`; `load_config(type(config), FILE)` gives an equal Config.
    Each table starts with its class's summary line. A field that is `None` (TOML has no null)
    is shown as a comment and loads back as its default.

    Args:
        config: A Config dataclass instance.

    Returns:
        The TOML text.

    Raises:
        TypeError: If `config` is not a dataclass instance.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{config!r} is not a Config instance")
    lines: list[str] = []

    def comment(text: str) -> None:
        lines.extend(f"# {line}".rstrip() for line in text.splitlines())

    def table(value: object, path: tuple[str, ...], doc: str | None) -> None:
        cls: type[Any] = type(value)
        docs = field_docs(cls)
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        if path:
            lines.append("")
        if doc:  # the parent's docstring of this field
            comment(doc)
        elif summary and not summary.startswith(f"{cls.__name__}("):  # not dataclass' own
            comment(summary)
        if path:
            lines.append("[" + ".".join(_toml_key(part) for part in path) + "]")
        children = []
        for field in dataclasses.fields(value):  # type: ignore[arg-type]
            item = getattr(value, field.name)
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                children.append((field.name, item))
                continue
            if field.name in docs:
                comment(docs[field.name])
            if item is None:
                lines.append(f"# {_toml_key(field.name)} is unset (None)")
            else:
                plain = config_to_dict(value)[field.name]
                lines.append(tomli_w.dumps({field.name: plain}).rstrip("\n"))
        for name, child in children:
            table(child, (*path, name), docs.get(name))

    table(config, (), None)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_key(key: str) -> str:
    """A TOML key: bare when it may be, quoted otherwise."""
    bare = key and all(c.isalnum() or c in "-_" for c in key) and key.isascii()
    return key if bare else json.dumps(key)


def _parse_override_value(text: str) -> Any:
    """Parse the right-hand side of `--set key=value` as a TOML value, else as a bare string."""
    if text.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `data` with `a.b=value` overrides applied.

    Values are parsed as TOML (`3`, `0.5`, `true`, `[1, 2]`, `"x"`); anything that does not
    parse is taken as a string, and `none` clears an optional field.

    Raises:
        ConfigError: If an override has no `=` or an empty key.
    """
    result: dict[str, Any] = json.loads(json.dumps(dict(data)))  # deep copy of plain data
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(
                f"--set {item!r} must look like key=value or table.key=value, e.g. --set seed=1"
            )
        table = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = table.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part} is a value, not a table")
            table = child
        table[parts[-1]] = _parse_override_value(raw.strip())
    return result


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    base: Mapping[str, Any] | None = None,
    base_source: str = "preset",
    flags: Mapping[str, Any] | None = None,
) -> T:
    """Load a Config from a preset, an optional TOML file, `--set` overrides and flags, in order.

    The result is validated once, after everything is applied, so a setting may depend on a
    flag given beside it (`--stages 2 --set gpt.num_layers=2`).

    Args:
        cls: The Config class to build.
        path: A TOML file whose tables follow the Config's nesting; None for defaults only.
        overrides: `a.b=value` strings applied after the file.
        base: Plain data of a preset (e.g. a `--quick` Config) that the file and overrides
            refine; None starts from the class defaults.
        base_source: What `base` came from (a file name), for error messages.
        flags: Command-line flags by the (dotted) setting each sets, applied last; a flag not
            given is None (or []).

    Returns:
        The validated Config.

    Raises:
        ConfigError: If the file cannot be read or parsed, or the data does not fit `cls`.
    """
    data: dict[str, Any] = dict(base or {})
    source = base_source if base else "--set"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as fh:
                data = _deep_merge(data, tomllib.load(fh))
        except FileNotFoundError as exc:
            raise ConfigError(
                f"config file {path} does not exist; check the --config path"
            ) from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            has_bom = Path(path).read_bytes().startswith(_UTF8_BOM)
            hint = " (it starts with a byte-order mark; save it as UTF-8 without BOM)"
            raise ConfigError(f"{path}: not valid TOML: {exc}{hint if has_bom else ''}") from exc
        except IsADirectoryError as exc:
            raise ConfigError(f"config file {path} is a folder; give a TOML file") from exc
    if overrides:
        data = apply_overrides(data, overrides)
        # a named file (--config, a cluster) is worth naming; the built-in preset is not
        named = path is not None or (base and base_source != "preset")
        source = f"{source} with --set" if named else "--set"
    given = {key: value for key, value in (flags or {}).items() if value not in (None, [])}
    if given:
        data = copy.deepcopy(data)
        for key, value in given.items():
            *parents, leaf = key.split(".")
            node = data
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
        source = f"{source} and the command line" if source != "preset" else "command line"
    return config_from_dict(cls, data, source=source)
