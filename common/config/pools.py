"""Pools: several fleets in one herder, each with its own queues, sizing, timeouts and worker
code. A pool is a `[pools.NAME]` table of the file; the settings above it (`[herder]`, the
environment, the flags) are every pool's defaults. Each pool becomes a whole Config
(`pool_configs`), so every part that takes a Config today takes its pool's unchanged. With
no pools, today's settings are the one pool named `default`. Standard library only.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from herder.common.config.schema import Config, ConfigError, normalize_key
from herder.common.config.values import coerce, validate

DEFAULT_POOL = "default"

# What belongs to a fleet, and so may differ between pools: the settings the schema marks
# `pool=True`. Host-wide settings (Redis, the state dir, the workers limit, the watchdog's, the
# HTTP endpoint) are not.
POOL_KEYS = frozenset(f.name for f in fields(Config) if f.metadata.get("pool"))


def coerce_pools(raw: Any, source: str) -> dict[str, dict[str, Any]]:
    """The file's `pools` table: {name: {key: value}}, each value of its setting's type."""
    if not isinstance(raw, dict):
        raise ConfigError("pools", "must be tables like [pools.high]", source)
    out: dict[str, dict[str, Any]] = {}
    for name, table in raw.items():
        if not name.isidentifier():
            raise ConfigError(
                f"pools.{name}", "a pool's name must be a plain identifier (letters, digits, _)", source
            )
        if not isinstance(table, dict):
            raise ConfigError(f"pools.{name}", "must be a table of settings", source)
        where = f"{source} [pools.{name}]"
        values: dict[str, Any] = {}
        for raw_key, value in table.items():
            key = normalize_key(raw_key)
            if key not in POOL_KEYS:
                raise ConfigError(
                    f"pools.{name}.{raw_key}",
                    f"not a pool setting; a pool takes {', '.join(sorted(POOL_KEYS))}",
                    where,
                )
            try:
                values[key] = coerce(key, value, where)
            except ConfigError as exc:
                raise ConfigError(f"pools.{name}.{raw_key}", exc.message, where) from None
        out[name] = values
    return out


def pool_config(cfg: Config, values: dict[str, Any]) -> Config:
    """One pool's whole Config: its values over the defaults. A pool that gives a fixed
    `workers` count is fixed even when the defaults autoscale."""
    values = dict(values)
    if "workers" in values and not {"min_workers", "max_workers"} & values.keys():
        values.update(min_workers=None, max_workers=None, cluster_max_workers=None)
    return replace(cfg, pools={}, **values)


def pool_configs(cfg: Config) -> dict[str, Config]:
    """Every pool's Config by name; one pool, `default`, when the file names none."""
    if not cfg.pools:
        return {DEFAULT_POOL: cfg}
    return {name: pool_config(cfg, values) for name, values in cfg.pools.items()}


def validate_pools(cfg: Config, source: str) -> None:
    """Each pool valid on its own (errors name the pool and the key), no queue in two pools,
    and the pools' minimums within the host's workers limit."""
    if not cfg.pools:
        return
    owner: dict[str, str] = {}
    floors = 0
    for name, pc in pool_configs(cfg).items():
        where = f"{source} [pools.{name}]"
        try:
            validate(pc, dict.fromkeys(cfg.pools[name], where))
        except ConfigError as exc:
            raise ConfigError(f"pools.{name}.{exc.key}", exc.message, exc.source) from None
        if "workers" in cfg.pools[name] and "max_workers" in cfg.pools[name]:
            raise ConfigError(f"pools.{name}.workers", "a fixed count conflicts with max_workers", where)
        for q in pc.queues:
            if q in owner:
                raise ConfigError(
                    f"pools.{name}.queues",
                    f"queue {q!r} is already pool {owner[q]!r}'s: a queue belongs to one pool",
                    where,
                )
            owner[q] = name
        floors += pc.floor
    if floors > cfg.limit:
        raise ConfigError(
            "pools", f"the pools' minimums add up to {floors}, above {cfg.describe_limit()}", source
        )


def all_queues(cfg: Config) -> list[str]:
    """Every queue herder serves, pool by pool, each in its priority order."""
    return [q for pc in pool_configs(cfg).values() for q in pc.queues]
