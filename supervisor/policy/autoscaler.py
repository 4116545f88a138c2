"""Autoscaling glue: folds each load reading into the pure policy (herder.supervisor.policy.scaling)
and turns its decision into this host's target, taking the cluster's grant into account.

The policy decides for the whole cluster when there is a cluster cap (each host then runs
its deterministic share, within what Redis granted it), else for this host alone. This
object also keeps the per-queue figures `herder status` shows.
"""

from __future__ import annotations

import logging

from herder.common.config import Config
from herder.supervisor.policy.scaling import (
    Load,
    ScaleConfig,
    ScaleState,
    clamp,
    decide,
    learn_rate,
    smoothed_growth,
)
from herder.supervisor.redis_side.cluster import share_of
from herder.supervisor.redis_side.load_reader import Reading
from herder.supervisor.views.snapshot import QueueStats

log = logging.getLogger("herder")


def policy_config(cfg: Config) -> ScaleConfig:
    """The policy counts job slots (a worker runs `threads` jobs at once): its bounds are the
    pool's worker bounds times that, and its decision is divided back (Autoscaler.workers)."""
    n = cfg.threads
    return ScaleConfig(
        floor=cfg.floor * n,
        ceiling=(cfg.cluster_max_workers or cfg.ceiling) * n,
        scale_down_delay=cfg.scale_down_delay,
        drain_target=cfg.drain_target,
        max_wait=cfg.max_wait,
    )


class Autoscaler:
    def __init__(self, cfg: Config, host_id: str) -> None:
        self.cfg = cfg
        self.host_id = host_id
        self.policy = policy_config(cfg)
        self.state = ScaleState()
        self.slot_target = cfg.floor * cfg.threads  # the policy's target: job slots, cluster-wide with a cap
        self.demand: int | None = None  # workers the load calls for before any bound; None: not read yet
        # The cluster's grant: None without a cluster cap; 0 (spawn nothing) until it answers.
        self.grant: int | None = 0 if cfg.cluster_max_workers is not None else None
        self.queues: dict[str, QueueStats] = {}
        self._queue_loads: dict[str, Load] = {}
        self._done_seen = (0, 0.0)  # jobs and busy seconds already folded into the rate

    @property
    def has_reading(self) -> bool:
        return self.state.last is not None

    def describe(self) -> str:
        cfg = self.cfg
        cluster = f", host {self.host_id} in a cluster of at most {cfg.cluster_max_workers}"
        return f"autoscaling between {cfg.floor} and {cfg.ceiling} workers" + (
            cluster if cfg.cluster_max_workers is not None else ""
        )

    def configure(self, cfg: Config) -> None:
        """New bounds or timings (herder scale, reload): clamp what was decided into them."""
        self.cfg = cfg
        self.policy = policy_config(cfg)
        self.slot_target = clamp(self.slot_target, self.policy)
        self.queues = {k: v for k, v in self.queues.items() if k in cfg.queues}

    def fold(
        self, reading: Reading, jobs: int, busy_seconds: float, current: int, paused: bool = False
    ) -> int:
        """The target for this host after this reading (`jobs` and `busy_seconds`: the
        fleet's totals so far, for the learned per-worker job rate). While every worker is
        paused (`rq suspend`, `herder pause`) the queue grows by design: no scale-up."""
        self._record_queues(reading)
        if not self.cfg.autoscale:
            return current
        seen_jobs, seen_busy = self._done_seen
        self._done_seen = (jobs, busy_seconds)
        state = learn_rate(self.state, jobs - seen_jobs, busy_seconds - seen_busy, self.policy)
        load = reading.load
        if load is not None and state.per_worker is not None:
            completions = load.running * state.per_worker  # cluster-wide: every host's busy workers
        else:
            completions = (jobs - seen_jobs) / self.cfg.scale_interval
        decision, self.state = decide(state, load, self.slot_target, completions, self.policy)
        self.slot_target = decision.target
        if load is not None:
            self.demand = self.workers(decision.demand)
        target = self.workers(decision.target)
        if self.cfg.cluster_max_workers is not None:
            hosts = reading.grant.hosts if reading.grant else (self.host_id,)
            share = share_of(target, hosts, self.host_id)  # this host's share
            target = self.cfg.bound(share)
            if reading.grant is not None:
                self.grant = reading.grant.granted
        if paused and target > current:
            return current
        if target != current:
            granted = f", cluster grant {self.grant}" if self.grant is not None else ""
            log.info("scale: %d -> %d workers (%s%s)", current, target, decision.reason, granted)
        return target

    def workers(self, slots: int) -> int:
        """Job slots as worker processes: each runs `threads` jobs at once."""
        return -(-slots // self.cfg.threads)

    def _record_queues(self, reading: Reading) -> None:
        if reading.load is None:
            return
        at = reading.load.at
        for name, backlog, running, oldest in reading.per_queue:
            load = Load(at, backlog, running, oldest)
            previous = self.queues.get(name)
            growth = smoothed_growth(
                previous.growth if previous else 0.0,
                self._queue_loads.get(name),
                load,
                self.policy.drain_target,
            )
            self._queue_loads[name] = load
            self.queues[name] = QueueStats(backlog, running, growth, oldest)
