"""The master process: python -P -m herder.supervisor, started by the watchdog.

Composes the master from its parts: the real launcher and clock, the Redis-facing threads
(when there is a Redis), the uplink to the watchdog. Everything it needs comes from the
resolved Config in the environment.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import TYPE_CHECKING

from herder.common.config import Config
from herder.supervisor import logs
from herder.supervisor.forkserver import ForkServerLauncher

if TYPE_CHECKING:
    from redis import Redis


def main() -> int:
    cfg = Config.from_env()
    logs.setup(cfg.log_level)
    # The fork server (plain spawns with --no-fork-server or where fork is wrong) starts
    # first: it imports rq and redis while this process does the same (~0.4 s each).
    launcher = ForkServerLauncher(cfg)
    launcher.tend(lambda: None)  # the loop hands it the real wake-up on its first pass
    from herder.common.redis_connect import connect
    from herder.common.uplink_protocol import MASTER_RESTARTS_ENV
    from herder.supervisor.launcher import Clock
    from herder.supervisor.master import Master
    from herder.supervisor.redis_side.load_reader import ClusterSettings, LoadReader
    from herder.supervisor.redis_side.recovery import Recovery
    from herder.supervisor.redis_side.scheduler_locks import SchedulerLocks
    from herder.supervisor.scheduler import SchedulerKeeper
    from herder.supervisor.uplink import Uplink

    host_id = cfg.host_id or f"{socket.gethostname()}:{os.getpid()}"
    recovery = reader = locks = None
    if cfg.redis_url:  # status shows queue lengths even for a fixed count

        def client() -> Redis:  # one per thread: each blocks on its own socket
            return connect(cfg.redis_url or "", socket_timeout=5, socket_connect_timeout=3)

        recovery = Recovery(client(), cfg, sweeping=cfg.worker_command is None)
        cluster = None
        if cfg.cluster_max_workers is not None:
            cluster = ClusterSettings(host_id, cfg.cluster_max_workers, cfg.host_ttl, cfg.kill_budget_window)
        reader = LoadReader(client(), cfg.queues, cfg.scale_interval, cluster)
        locks = SchedulerLocks(client(), cfg.queues)  # also read with the setting off: status says who
    clock = Clock()
    master = Master(
        cfg,
        launcher,
        clock,
        recovery=recovery,
        reader=reader,
        uplink=Uplink(),
        host_id=host_id,
        sched=SchedulerKeeper(locks, clock, host_id),
        restarts=int(os.environ.get(MASTER_RESTARTS_ENV, "0") or 0),
    )
    return master.run()


if __name__ == "__main__":
    sys.exit(main())
