"""Reload: the file read again over what the environment and flags pinned, and the plan of
what becomes of each changed setting (applied in place, rolled out to new workers, or the whole
reload refused because only a restart applies it). The master carries the plan out
(herder.supervisor.control.reload). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from herder.common.config.layering import load_file, resolve
from herder.common.config.schema import APPLY, KEYS, RESTART, WORKERS, Config, ConfigError


def reread(cfg: Config) -> Config:
    """`cfg` with its file layer read again (reload); keys pinned by environment or flags
    stay, and what `herder run` filled in itself (the state dir, the embedded Redis) stays
    while the file still does not set it. Every other difference is a change: reload_plan
    says what becomes of it."""
    assert cfg.config_file
    pinned = {k: (getattr(cfg, k), "environment or command line") for k in cfg.pinned}
    fresh, _ = resolve([load_file(cfg.config_file), pinned])
    fresh.config_file, fresh.pinned, fresh.defaulted = cfg.config_file, cfg.pinned, cfg.defaulted
    fresh.embedded_redis = cfg.embedded_redis
    if cfg.embedded_redis and fresh.redis_url is None:
        fresh.redis_url = cfg.redis_url  # the watchdog's private Redis stays where it is
    if fresh.state_dir:
        fresh.state_dir = str(Path(fresh.state_dir).absolute())  # as `herder run` made it
    elif "state_dir" in cfg.defaulted:
        fresh.state_dir = cfg.state_dir
    return fresh


@dataclass(frozen=True)
class ReloadPlan:
    applied: list[str]  # changed keys the master applies in place
    restart_workers: list[str]  # changed keys only new workers pick up: a rolling restart


# The limits reload_plan puts on keys it otherwise applies in place (docs/settings.md shows them).
RELOAD_LIMITS = {
    "cluster_max_workers": "a new value applies; turning the cap on or off is refused (restart herder)",
    "stop_timeout": "only while stop_timeout + kill_timeout stays within what herder started with",
    "kill_timeout": "only while stop_timeout + kill_timeout stays within what herder started with",
}


def reload_policy(key: str) -> str:
    return next(f.metadata["reload"] for f in fields(Config) if f.name == key)


def reload_plan(running: Config, new: Config, started: Config) -> ReloadPlan:
    """What a reload from `running` to `new` does, or ConfigError naming every changed key it
    cannot apply (then nothing changes). `started`: the config herder (and its watchdog,
    which never re-reads it) started with."""
    changed = [k for k in KEYS if getattr(new, k) != getattr(running, k)]
    refused = {k: "read once at start" for k in changed if reload_policy(k) == RESTART}
    if (running.cluster_max_workers is None) != (new.cluster_max_workers is None):
        refused["cluster_max_workers"] = "turning the cluster cap on or off changes how this host reserves"
    if new.drain_seconds > started.drain_seconds:
        why = (
            f"stop_timeout + kill_timeout would be {new.drain_seconds:g} s, more than the "
            f"{started.drain_seconds:g} s the watchdog allows a stop since herder started"
        )
        refused.update({k: why for k in ("stop_timeout", "kill_timeout") if k in changed})
    if refused:
        source = f"file {running.config_file}"
        reasons = "; ".join(f"{k}: {why}" for k, why in refused.items())
        raise ConfigError(
            ", ".join(refused),
            f"changed, but only a restart of herder applies it ({reasons}); the running config is kept "
            "(`herder upgrade` applies it without a dip)",
            source,
        )
    return ReloadPlan(
        applied=[k for k in changed if reload_policy(k) == APPLY],
        restart_workers=[k for k in changed if reload_policy(k) == WORKERS],
    )
