"""Where each setting comes from: defaults < TOML file < HERDER_* environment < flags.

Every value goes through `coerce`, which knows its key and its source, so a wrong type
or an impossible value anywhere produces one message naming both, and exit 78
(EX_CONFIG). The Config dataclass is the one place defaults live.
"""

from __future__ import annotations

import tomllib
import typing
from dataclasses import fields
from typing import Any

from supervisor.config import Config, ConfigError, parse_worker_command, redact_url

# Keys a user may write in a file or flag that map to another field name.
ALIASES = {"queue": "queues", "path": "paths"}
SECRET_KEYS = {"redis_url"}
# Bookkeeping fields herder fills in itself; not settings a user writes.
INTERNAL = {"config_file", "pinned", "embedded_redis"}
_TYPES = {k: v for k, v in typing.get_type_hints(Config).items() if k not in INTERNAL}
KEYS = [f.name for f in fields(Config) if f.name not in INTERNAL]


def normalize_key(key: str) -> str:
    key = key.strip().replace("-", "_")
    return ALIASES.get(key, key)


def _describe(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def coerce(key: str, value: Any, source: str) -> Any:
    """Turn a raw value (a string from the environment or a flag, or a TOML value) into the
    type the Config field has; raise ConfigError naming the key and the source."""
    if key not in _TYPES:
        raise ConfigError(key, f"unknown setting; known ones: {', '.join(sorted(KEYS))}", source)
    tp = _TYPES[key]
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if optional else tp
    origin = typing.get_origin(base)
    if key == "worker_command":
        if isinstance(value, str):
            return parse_worker_command(value)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(key, "must be a command line string or a list of strings", source)
    if origin is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
            raise ConfigError(key, f"must be a list of strings, got {value!r}", source)
        out = [part for v in items for part in (v.split(",") if key == "queues" else [v]) if part]
        return out
    if base is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be true or false, got {value!r}", source)
    if base in (int, float):
        if isinstance(value, bool):
            raise ConfigError(key, f"must be {_describe(base)}, got {value!r}", source)
        if isinstance(value, int | float) and (base is float or isinstance(value, int)):
            return base(value)
        if isinstance(value, str):
            try:
                return base(value.strip())
            except ValueError:
                pass
        raise ConfigError(key, f"must be {_describe(base)}, got {value!r}", source)
    if base is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, f"must be a string, got {value!r}", source)
    raise ConfigError(key, f"cannot be set from {source}", source)


def load_file(path: str) -> dict[str, tuple[Any, str]]:
    """The settings in a TOML file, as {key: (value, source)}. A [herder] table or top level."""
    source = f"file {path}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("config", f"no such file: {path}", "command line or HERDER_CONFIG") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", f"not valid TOML: {exc}", source) from None
    table = data.get("herder", data)
    if not isinstance(table, dict):
        raise ConfigError("herder", "must be a table", source)
    out: dict[str, tuple[Any, str]] = {}
    for raw_key, value in table.items():
        key = normalize_key(raw_key)
        out[key] = (coerce(key, value, source), source)
    return out


def resolve(layers: list[dict[str, tuple[Any, str]]]) -> tuple[Config, dict[str, str]]:
    """Apply layers in order (later wins) over the defaults; validate; return config and sources."""
    cfg = Config()
    sources: dict[str, str] = {}
    for layer in layers:
        for key, (value, source) in layer.items():
            setattr(cfg, key, coerce(key, value, source))
            sources[key] = source
    cfg.validate(sources)
    return cfg, sources


def describe(cfg: Config, sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, value, source) for every setting, secrets redacted: what `herder config` prints."""
    rows = []
    for key in KEYS:
        value = getattr(cfg, key)
        shown = redact_url(value) if key in SECRET_KEYS else value
        if isinstance(shown, list):
            shown = ", ".join(map(str, shown)) if key != "worker_command" else " ".join(shown)
        rows.append((key, "" if shown is None else str(shown), sources.get(key, "default")))
    return rows


def example_file() -> str:
    """A commented TOML file with every setting at its default."""
    lines = ["# herder configuration (TOML). Flags and HERDER_* variables override these.", "[herder]"]
    for key in KEYS:
        value = getattr(Config(), key)
        if value is None or value == "" or value == []:
            lines.append(f"# {key} = ")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, str):
            lines.append(f'{key} = "{value}"')
        elif isinstance(value, list):
            lines.append(f"{key} = [{', '.join(repr(v).replace(chr(39), chr(34)) for v in value)}]")
        else:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"
