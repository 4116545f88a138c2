"""The kill guard: herder's judgement that a worker is hung spends a token from the kill
budget (herder.supervisor.redis_side.budget), so a widespread fault never takes every worker
down at once. No token: the worker is left alone, health is degraded, a person is told.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from herder.common.config import Config
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.states import KillStage, change_kill
from herder.supervisor.redis_side.budget import ClusterView, KillBudget, cluster_keys
from herder.supervisor.redis_side.recovery import Recovery

log = logging.getLogger("herder")


class KillGuard:
    def __init__(self, cfg: Config, recovery: Recovery | None) -> None:
        self.budget = KillBudget(window=cfg.kill_budget_window, fraction=cfg.kill_budget)
        self.cluster_cap = cfg.cluster_max_workers
        self.cluster = ClusterView() if cfg.cluster_max_workers is not None else None
        self.recovery = recovery  # counts kills cluster-wide, off the loop
        self.degraded = ""  # why health is degraded, or ""

    def configure(self, cfg: Config, wall: float) -> None:
        """A reload's budget. Kills already counted stay counted: a new window length starts
        with the old window's count, so a reload never hands out a fresh budget."""
        old = self.budget
        if cfg.kill_budget_window != old.window:
            index = int(wall // cfg.kill_budget_window)
            carried = math.ceil(old.local_count(wall))
            self.budget = KillBudget(cfg.kill_budget_window, cfg.kill_budget)
            self.budget.carry(index, carried)
        self.budget.fraction = cfg.kill_budget
        self.cluster_cap = cfg.cluster_max_workers  # a new value only: on/off needs a restart

    def cluster_read(self, kills: tuple[int, int, float] | None) -> None:
        """The cluster-wide kill counters as the load reader last read them."""
        if kills is not None and self.cluster is not None:
            self.cluster = ClusterView(*kills)

    def allow(self, w: Worker, reason: str, fleet: int, wall: float) -> bool:
        """Take a kill token, or leave the worker alone and say why (once per worker)."""
        cluster = None
        if self.cluster is not None and self.cluster_cap is not None:
            cluster = (self.cluster, self.cluster_cap)
        if self.budget.take(fleet, now=wall, cluster=cluster):
            if cluster is not None and self.recovery is not None:
                self.recovery.count_kill(cluster_keys(wall, self.budget.window)[0], self.budget.window)
            if w.spared:
                change_kill(w, KillStage.NONE)  # its kill follows
            return True
        if not w.spared:
            change_kill(w, KillStage.SPARED)
            where = "cluster-wide" if cluster else "on this host"
            self.degraded = (
                f"kill budget spent {where}: {self.budget.limit(fleet)} kills per "
                f"{self.budget.window:g} s; unresponsive workers are left alone"
            )
            log.error(
                "slot %d pid %d: would kill it (%s), but %s. A widespread fault? Leaving it for a person; "
                "health degraded",
                w.slot,
                w.pid,
                reason,
                self.degraded,
            )
        return False

    def responsive(self, w: Worker) -> None:
        if w.spared:
            change_kill(w, KillStage.NONE)
            log.warning("slot %d pid %d: responsive again", w.slot, w.pid)

    def settle(self, workers: Iterable[Worker]) -> None:
        """Health is ok again once no worker waits on the budget."""
        if self.degraded and not any(w.spared for w in workers):
            log.warning("health ok again: no worker is waiting on the kill budget")
            self.degraded = ""
