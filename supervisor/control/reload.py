"""`herder reload` and SIGHUP: re-read the config file and hand each setting to the part that
uses it, all or nothing.

Settings pinned by the environment or flags stay. A changed key that only a restart of herder
applies refuses the whole reload (herder.common.config.reload_plan); so does a pool that would
turn its cluster cap on or off. Pools added start, pools removed drain, a changed pool is
resized or rolled alone. Runs in the reconcile loop (commands.py hands it the request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from herder.common.config import (
    KEYS,
    WORKERS,
    Config,
    ConfigError,
    all_queues,
    pool_configs,
    reload_plan,
    reload_policy,
    reread,
)
from herder.supervisor.policy.pool import Pool, PoolState
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.uplink import Uplink

log = logging.getLogger("herder")


class Reloadable(Protocol):
    """The few things a reload changes (herder.supervisor.master.Master has them): the settings
    in force, the pools, and every part that reads settings of its own."""

    cfg: Config
    started_cfg: Config  # what the watchdog started with: it never re-reads the file
    pools: dict[str, Pool]
    uplink: Uplink | None  # told `reloading`, then `ready`

    def new_pool(self, name: str, cfg: Config) -> Pool: ...

    @property
    def settings_readers(self) -> list[Callable[[Config], None]]:
        """Every part that keeps settings of its own (the kill guard, recovery, the load reader,
        the event hooks): each is handed the new Config, every reload."""
        ...


def reload(m: Reloadable, why: str, restart: Callable[[str], int]) -> dict:
    """Re-read the file and apply it; `restart(why)` rolls every pool's workers (returns how
    many it replaces), for keys only new workers take."""
    if not m.cfg.config_file:
        log.warning("%s: no config file to re-read (herder run had no --config)", why)
        return {"ok": False, "error": "herder run was started without --config: nothing to re-read"}
    if m.uplink:
        m.uplink.reloading()
    try:
        new = reread(m.cfg)
        plan = reload_plan(m.cfg, new, m.started_cfg)
        check_pool_caps(m, new)
    except ConfigError as exc:
        log.error("%s: keeping the running config: %s", why, exc)
        if m.uplink:
            m.uplink.ready()
        return {"ok": False, "error": str(exc)}
    pools_done = apply(m, new)
    changed = sorted(plan.applied + plan.restart_workers)
    log.info("%s: config re-read from %s; changed: %s", why, new.config_file, ", ".join(changed) or "nothing")
    for line in pools_done:
        log.info("%s: %s", why, line)
    replacing = restart(f"{why} ({', '.join(plan.restart_workers)} changed)") if plan.restart_workers else 0
    if m.uplink:
        m.uplink.ready()
    reply = {
        "ok": True,
        "changed": changed,
        "applied": plan.applied,
        "restart_workers": plan.restart_workers,
        "replacing": replacing,
    }
    return reply | ({"pools": pools_done} if pools_done else {})


def check_pool_caps(m: Reloadable, new: Config) -> None:
    """A pool that stays may not turn its cluster cap on or off on reload (how it reserves
    changes): ConfigError, and nothing changes. A pool added with a cap is fine."""
    for name, pc in pool_configs(new).items():
        pool = m.pools.get(name)
        stays = pool is not None and not pool.draining and bool(m.cfg.pools and new.pools)
        if stays and (pool.cfg.cluster_max_workers is None) != (pc.cluster_max_workers is None):
            raise ConfigError(
                f"pools.{name}.cluster_max_workers",
                "turning a pool's cluster cap on or off changes how this host reserves; "
                "only a restart of herder applies it; the running config is kept",
                f"file {new.config_file}",
            )


def apply(m: Reloadable, new: Config) -> list[str]:
    """Hand each setting to the part that uses it. Every part, every time: each setter is
    cheap and keeps what did not change, and no changed key can be forgotten. Settings
    read where they are used (deadlines, backoff, the workers limit) need only m.cfg.
    Returns what happened to pools (added, removed, rolled)."""
    done: list[str] = []
    old_cfg, fresh = m.cfg, pool_configs(new)
    for name, pool in list(m.pools.items()):
        if name not in fresh and not pool.draining:
            pool.change_state(PoolState.DRAINING)  # its workers stop after their jobs; then it goes
            done.append(f"pool {name} removed: its workers finish their jobs and stop")
    for name, pc in fresh.items():
        pool = m.pools.get(name)
        if pool is None or pool.draining:
            m.pools[name] = added = m.new_pool(name, pc)
            if pool is not None:  # back while its workers drain: they are still its own, leaving
                added.workers.update(pool.workers)
                added.slots.update(pool.slots)
            if new.pools:
                done.append(f"pool {name} added")
            continue
        was = pool.configured  # the file's last values: `herder scale`'s bounds are no change
        rolled = [k for k in KEYS if getattr(pc, k) != getattr(was, k) and reload_policy(k) == WORKERS]
        if new.pools and was != pc and old_cfg.pools.get(name) != new.pools.get(name):
            done.append(f"pool {name} changed" + (f" ({', '.join(rolled)}: rolled)" if rolled else ""))
            if rolled:
                pool.generation += 1
        pool.configure(pc)
        pool.retirement.configure(pc)
    m.cfg = new
    for configure in m.settings_readers:
        configure(new)
    logging.getLogger().setLevel(new.log_level.upper())
    return done


def reader_settings(reader: LoadReader, host_id: str) -> Callable[[Config], None]:
    """What the load reader keeps of a Config: the queues, the shortest scale interval, and
    each pool's cluster cap."""

    def configure(new: Config) -> None:
        fresh = pool_configs(new)
        reader.set_queues(all_queues(new))
        reader.set_interval(min(pc.scale_interval for pc in fresh.values()))
        for name, pc in fresh.items():
            if pc.cluster_max_workers is not None:
                reader.set_cluster(pc.cluster_max_workers, pc.host_ttl, new.kill_budget_window, name, host_id)

    return configure
