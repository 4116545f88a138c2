"""A pool: one fleet inside the master, with its own settings (a whole Config, from
herder.common.config.pools), target, autoscaler, recycling and culling, generation (a
rolling restart of this pool only) and pause. The master's loop runs every pool; the slots,
the workers limit, the kill budget and the loop itself are the host's. With no `[pools.*]`
in the file there is one pool, `default`, and herder behaves as it always did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from herder.common.config import Config
from herder.common.transitions import move
from herder.supervisor.autoscaler import Autoscaler
from herder.supervisor.fleet import Worker
from herder.supervisor.redis_side.recovery import Recovery
from herder.supervisor.retirement import Retirement
from herder.supervisor.states import LEAVING

if TYPE_CHECKING:
    from herder.supervisor.launcher import Launcher

log = logging.getLogger("herder")

# A pool's worker bounds: what `herder scale` may set over the file's values.
BOUND_KEYS = ("workers", "min_workers", "max_workers")


class PoolState(StrEnum):
    """ACTIVE <--pause/resume--> PAUSED; either --a reload removes it--> DRAINING (final: its
    workers finish their jobs and stop, then the master drops it)."""

    ACTIVE = "active"
    PAUSED = "paused"  # `herder pause [--pool]`: its workers take no new jobs
    DRAINING = "draining"


POOL_TRANSITIONS: dict[PoolState, frozenset[PoolState]] = {
    PoolState.ACTIVE: frozenset({PoolState.PAUSED, PoolState.DRAINING}),
    PoolState.PAUSED: frozenset({PoolState.ACTIVE, PoolState.DRAINING}),
    PoolState.DRAINING: frozenset(),
}


@dataclass
class Pool:
    """One fleet's state. Its settings in force (`cfg`) are one owner's: the file's and flags'
    (`configured`, which a reload replaces) with the operator's `herder scale` over their
    bounds (`scaled`); everything else reads `cfg`, and only `configure` and `scale` change it."""

    name: str
    cfg: Config  # in force: `configured` with `scaled` over it
    scaler: Autoscaler
    retirement: Retirement
    target: int
    configured: Config  # as the file and flags say (a reload's new values land here)
    scaled: dict[str, int] = field(default_factory=dict)  # `herder scale`'s bounds, {}: none
    generation: int = 0  # bumped by a rolling restart of this pool
    state: PoolState = PoolState.ACTIVE  # changed only through change_state
    # Where its workers come from (the master hands it over at its first spawn): a restart
    # renews it, so new workers load new code.
    launcher: Launcher | None = None

    @property
    def paused(self) -> bool:
        return self.state == PoolState.PAUSED

    @property
    def draining(self) -> bool:
        return self.state == PoolState.DRAINING

    def change_state(self, new: PoolState) -> None:
        """The one place a pool's state changes, checked against POOL_TRANSITIONS."""
        if new != self.state:
            self.state = move(POOL_TRANSITIONS, self.state, new, f"pool {self.name}")

    @classmethod
    def build(
        cls, name: str, cfg: Config, host_id: str, recovery: Recovery | None, tickets: Iterator[int]
    ) -> Pool:
        """`tickets`: the master's cull-ticket numbers, unique across its pools."""
        retirement = Retirement(cfg, recovery, tickets=tickets)
        return cls(name, cfg, Autoscaler(cfg, host_id), retirement, cfg.floor, configured=cfg)

    def configure(self, cfg: Config) -> None:
        """The file's settings anew (a reload). `herder scale`'s bounds stay over them unless the
        file changed the bounds itself: then the file's are in force again."""
        if self.scaled and any(getattr(cfg, k) != getattr(self.configured, k) for k in BOUND_KEYS):
            log.info(
                "pool %s: the file's new worker bounds replace herder scale's %s", self.name, self.scaled
            )
            self.scaled = {}
        self.configured = cfg
        self._apply(replace(cfg, **self.scaled))

    # ---- what an operator asks of a pool (commands.py translates each request) ----

    def restart(self) -> None:
        """A rolling restart: every worker of an older generation is replaced (the loop's roll),
        by new workers from a renewed launcher."""
        self.generation += 1
        if self.launcher is not None:
            self.launcher.renew(self.cfg)

    def pause(self, paused: bool) -> bool:
        """`herder pause` / `resume`: True if that changed the pool (its workers are told by
        the caller, which knows them)."""
        if self.paused == paused:
            return False
        self.change_state(PoolState.PAUSED if paused else PoolState.ACTIVE)
        return True

    def scale(self, bounds: dict[str, int]) -> None:
        """`herder scale`: new bounds over the file's (workers, or min_workers and max_workers)."""
        self.scaled = {k: v for k, v in bounds.items() if k in BOUND_KEYS}
        self._apply(replace(self.configured, **self.scaled))

    def _apply(self, cfg: Config) -> None:
        """The target moves into the new bounds at once; autoscaling turned on starts from the
        count running so far."""
        self.target = cfg.bound(self.target) if cfg.autoscale else cfg.workers
        self.scaler.configure(cfg)
        self.cfg = cfg

    @property
    def launch_key(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Pools that agree on these share a fork server (what its template imports)."""
        return tuple(self.cfg.paths), tuple(self.cfg.preload)


# ---- the host's figures over its pools (the loop and the snapshot's builder read these) ----


def active(pools: Iterable[Pool]) -> list[Pool]:
    """The pools that run: not draining away after a reload removed them."""
    return [p for p in pools if not p.draining]


def host_target(pools: Iterable[Pool]) -> int:
    """The workers this host keeps: every running pool's target."""
    return sum(p.target for p in active(pools))


def host_floor(pools: Iterable[Pool]) -> int:
    """The fewest workers this host runs: every running pool's minimum."""
    return sum(p.cfg.floor for p in active(pools))


def live(workers: Iterable[Worker], pool: str | None = None) -> list[Worker]:
    """Workers that count towards a target (not on their way out); of one pool, or of all."""
    return [w for w in workers if w.state not in LEAVING and (pool is None or w.pool == pool)]


def share_limit(wants: list[tuple[str, int, int]], limit: int) -> dict[str, int]:
    """How many workers each pool may run under the host's workers limit (its share). `wants`:
    (pool, floor, target). Each pool gets its floor first (the config guarantees the floors fit),
    then what is left goes one worker at a time, in turn, to the pools that want more, so a
    surge in one pool never starves another below its minimum nor takes all the room."""
    caps = {name: min(floor, target) for name, floor, target in wants}
    left = limit - sum(caps.values())
    hungry = [name for name, _, target in wants if target > caps[name]]
    targets = {name: target for name, _, target in wants}
    while left > 0 and hungry:
        for name in list(hungry):
            if left <= 0:
                break
            caps[name] += 1
            left -= 1
            if caps[name] >= targets[name]:
                hungry.remove(name)
    return caps
