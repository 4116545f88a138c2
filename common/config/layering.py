"""Layering: defaults (the dataclass) < RQ's settings module < TOML file < HERDER_* environment
< flags, each value coerced with its key and source; and what `herder config` prints of the
result. The environment and flag layers come from click (herder.supervisor.ctl.cli), which
hands them over as one layer. Standard library only."""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from typing import Any
from urllib.parse import quote

from herder.common.config.limits import default_workers_limit
from herder.common.config.pools import coerce_pools, validate_pools
from herder.common.config.schema import KEYS, Config, ConfigError, normalize_key
from herder.common.config.values import coerce, redact_setting, validate
from herder.common.rq_support import unsupported_rq_setting


def rq_settings_layer(module: str, paths: list[str]) -> dict[str, tuple[Any, str]]:
    """RQ's settings module (`rq worker -c`), read as `rq worker` reads it: REDIS_URL, or
    SENTINEL, or REDIS_HOST, REDIS_PORT, REDIS_DB, REDIS_PASSWORD and REDIS_SSL; and QUEUES."""
    source = f"rq settings module {module}"
    settings = import_settings("rq_config", module, paths)
    out: dict[str, tuple[Any, str]] = {}
    url = settings.get("REDIS_URL")
    if url is None and settings.get("SENTINEL") is not None:
        url = sentinel_url(settings["SENTINEL"])
    if url is None and any(k in settings for k in ("REDIS_HOST", "REDIS_PORT", "REDIS_DB", "REDIS_PASSWORD")):
        ssl = str(settings.get("REDIS_SSL", False)).lower() in ("1", "y", "yes", "t", "true")
        password = settings.get("REDIS_PASSWORD")
        auth = f":{quote(str(password), safe='')}@" if password else ""
        host, port = settings.get("REDIS_HOST", "localhost"), settings.get("REDIS_PORT", 6379)
        url = f"{'rediss' if ssl else 'redis'}://{auth}{host}:{port}/{settings.get('REDIS_DB', 0)}"
    if url is not None:
        out["redis_url"] = (coerce("redis_url", url, source), source)
    if settings.get("QUEUES") is not None:
        out["queues"] = (coerce("queues", list(settings["QUEUES"]), source), source)
    return out


def import_settings(key: str, module: str, paths: list[str]) -> dict[str, Any]:
    """A settings module's names, imported with the job paths (and the current directory) on
    sys.path, as `rq worker -c` and `manage.py` find theirs."""
    added = [os.path.abspath(p) for p in [*paths, "."] if os.path.abspath(p) not in sys.path]
    sys.path[:0] = added
    try:
        return vars(importlib.import_module(module))
    except Exception as exc:  # whatever the user's module raises, it is a config error
        raise ConfigError(key, f"cannot import {module}: {exc.__class__.__name__}: {exc}") from None
    finally:
        del sys.path[: len(added)]


def django_rq_url(name: str, conf: dict[str, Any]) -> str:
    """One entry of django-rq's RQ_QUEUES as a Redis URL (URL, or HOST/PORT/DB/USERNAME/
    PASSWORD/SSL, or SENTINELS/MASTER_NAME)."""
    if conf.get("URL"):
        return str(conf["URL"])
    if conf.get("SENTINELS"):
        return sentinel_url(
            {
                "INSTANCES": conf["SENTINELS"],
                "MASTER_NAME": conf.get("MASTER_NAME", "mymaster"),
                "DB": conf.get("DB", 0),
                "USERNAME": conf.get("USERNAME"),
                "PASSWORD": conf.get("PASSWORD"),
                "SSL": conf.get("SSL"),
                "SENTINEL_KWARGS": conf.get("SENTINEL_KWARGS"),
            }
        )
    if conf.get("USE_REDIS_CACHE"):
        raise ConfigError("redis_url", f"RQ_QUEUES[{name!r}] uses USE_REDIS_CACHE: give --redis-url instead")
    user = quote(str(conf.get("USERNAME") or ""), safe="")
    password = conf.get("PASSWORD")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else ""
    scheme = "rediss" if conf.get("SSL") else "redis"
    return f"{scheme}://{auth}{conf.get('HOST', 'localhost')}:{conf.get('PORT', 6379)}/{conf.get('DB', 0)}"


def django_layer(module: str, paths: list[str]) -> dict[str, tuple[Any, str]]:
    """django-rq's RQ_QUEUES in a Django settings module: its queues, and the one Redis they
    live on, just above the defaults (the file, the environment and flags win)."""
    source = f"django settings module {module}"
    queues = import_settings("django_settings", module, paths).get("RQ_QUEUES")
    if not queues:
        return {}
    if not isinstance(queues, dict) or not all(isinstance(c, dict) for c in queues.values()):
        raise ConfigError("django_settings", "RQ_QUEUES must map queue names to dicts (django-rq)", source)
    urls = {name: django_rq_url(name, conf) for name, conf in queues.items()}
    if len(set(urls.values())) > 1:
        raise ConfigError(
            "redis_url",
            f"RQ_QUEUES puts queues on {len(set(urls.values()))} Redis servers; one herder serves one "
            "Redis: give --redis-url and the --queue names that live there",
            source,
        )
    return {
        "redis_url": (coerce("redis_url", next(iter(urls.values())), source), source),
        "queues": (coerce("queues", list(queues), source), source),
    }


def sentinel_url(sentinel: dict[str, Any]) -> str:
    """RQ's SENTINEL setting as herder's redis+sentinel:// URL (herder.common.redis_connect)."""
    hosts = ",".join(f"{h}:{p}" for h, p in sentinel.get("INSTANCES", [("localhost", 26379)]))
    auth = ""
    if sentinel.get("PASSWORD"):
        user = quote(str(sentinel.get("USERNAME") or ""), safe="")
        auth = f"{user}:{quote(str(sentinel['PASSWORD']), safe='')}@"
    query = [("ssl", "true")] if sentinel.get("SSL") else []
    if (sentinel.get("SENTINEL_KWARGS") or {}).get("password"):
        query.append(("sentinel_password", quote(str(sentinel["SENTINEL_KWARGS"]["password"]), safe="")))
    tail = "?" + "&".join(f"{k}={v}" for k, v in query) if query else ""
    master, db = sentinel.get("MASTER_NAME", "mymaster"), sentinel.get("DB", 0)
    return f"redis+sentinel://{auth}{hosts}/{master}/{db}{tail}"


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
    pools = data.pop("pools", None)  # [pools.NAME] tables, beside [herder] (or the top level)
    table = data.get("herder", data)
    if not isinstance(table, dict):
        raise ConfigError("herder", "must be a table", source)
    stray = sorted(data.keys() - {"herder"}) if table is not data else []
    if stray:  # beside a [herder] table, a setting would be silently ignored
        raise ConfigError(
            stray[0], "belongs in the [herder] table (or give no [herder] table at all)", source
        )
    out: dict[str, tuple[Any, str]] = {}
    for raw_key, value in table.items():
        key = normalize_key(raw_key)
        out[key] = (coerce(key, value, source), source)
    if pools is not None:
        out["pools"] = (coerce_pools(pools, source), source)
    return out


def resolve(layers: list[dict[str, tuple[Any, str]]]) -> tuple[Config, dict[str, str]]:
    """Apply layers in order (later wins) over the defaults; validate; return config and sources."""
    cfg = Config()
    sources: dict[str, str] = {}
    for layer in layers:
        for key, (value, source) in layer.items():
            setattr(cfg, key, value if key == "pools" else coerce(key, value, source))
            sources[key] = source
    if layers and "workers" in layers[-1] and "max_workers" in sources:
        # A fixed count given last (flags, environment) would silently lose to autoscaling.
        raise ConfigError(
            "workers", "a fixed count conflicts with max_workers (autoscaling)", sources["workers"]
        )
    validate(cfg, sources)
    validate_pools(cfg, sources.get("pools", "default"))
    return cfg, sources


def describe(cfg: Config, sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, value, source) for every setting, secrets redacted: what `herder config` prints."""
    rows = []
    for key in KEYS:
        value = getattr(cfg, key)
        shown = redact_setting(key, value)
        if key == "workers_limit" and value is None:
            shown = f"{cfg.limit} ({default_workers_limit()[1]})"
        if isinstance(shown, list):
            shown = ", ".join(map(str, shown)) if key != "worker_command" else " ".join(shown)
        rows.append((key, "" if shown is None else str(shown), sources.get(key, "default")))
    for name, values in cfg.pools.items():  # what each pool sets over the defaults above
        for key, value in values.items():
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            rows.append((f"pools.{name}.{key}", str(shown), f"{sources.get('pools', 'file')} [pools.{name}]"))
    return rows


def example_file() -> str:
    """A commented TOML file with every setting at its default."""
    lines = ["# herder configuration (TOML). Flags and HERDER_* variables override these.", "[herder]"]
    for key in KEYS:
        value = getattr(Config(), key)
        unsupported = unsupported_rq_setting(key, value)
        if unsupported:  # a default the installed rq cannot serve: off here, said why
            lines.append(f"# {key}: {unsupported}")
            lines.append(f"# {key} = {'true' if value else 'false'}")
        elif value is None or value == "" or value == []:
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
