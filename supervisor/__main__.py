"""The master process: python -P -m herder.supervisor, started by the watchdog.

Composes the master from its parts: the real launcher and clock, the Redis-facing threads
(when there is a Redis), the uplink to the watchdog. Everything it needs comes from the
resolved Config in the environment.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from herder.common import handover
from herder.common.config import Config
from herder.common.config.prestart import ENV_GO_FD
from herder.supervisor import logs
from herder.supervisor.forkserver import ForkServerLauncher

if TYPE_CHECKING:
    from redis import Redis

    from herder.supervisor.control import ControlServer

SWITCH_INTERVAL = 0.001  # seconds a thread holds the GIL while another waits (Python's: 0.005)


def open_control(cfg: Config, started_at: float) -> ControlServer | None:
    """The control socket, right after the fork server is started: `herder status` answers
    `starting` while the rest of the master loads; requests that change things wait for the
    loop's first pass."""
    if not cfg.state_dir:
        return None
    from herder.supervisor.control import ControlServer

    def early(body: dict) -> dict | None:
        if body["cmd"] == "ping":
            return {"ok": True, "pid": os.getpid()}
        if body["cmd"] == "status":
            from herder.supervisor.views.status import starting_status

            return starting_status(cfg, started_at)
        return None  # queued for the loop

    control = ControlServer(cfg.state_dir, lambda: None, early)
    try:
        control.start()
    except OSError as exc:
        logging.getLogger("herder").error("cannot open the control socket %s: %s", control.path, exc)
        return None
    return control


# `herder run` blocks these across its exec of the watchdog (a PID 1 would drop them meanwhile);
# a master the watchdog starts first thing (watchdog/early.py) inherits that mask. Unblocked
# before anything is forked: the template and its workers must take a SIGTERM.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


def await_hand_over() -> bool:
    """A master `herder run` started before it loaded click (herder.common.config.prestart): load
    what needs no configuration (rq and redis, which the template shares), then wait for the
    environment and the validated configuration on its pipe. False on the pipe's end of file:
    `herder run` exits (a refused configuration, say) or the watchdog's loop starts the master."""
    fd = int(os.environ.pop(ENV_GO_FD))  # its environment's last: see below
    import herder.common.redis_connect  # noqa: F401
    import herder.common.rq_seam  # noqa: F401

    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    try:
        env = json.loads(b"".join(chunks))["env"]
    except (ValueError, KeyError, TypeError):
        return False  # nothing, or cut short: `herder run` died while it handed over
    # Only what differs is changed (`herder run` started it with the same environment, but the
    # config and the restarts count): the template and workers forked from here retitle
    # themselves (setproctitle) in the room of the process's first argv and environment, which
    # ends where an entry was replaced or removed (so this one's descriptor came last).
    env = handover.accept(env)  # its config in memory, not in its environment
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    return True


def main() -> int:
    if ENV_GO_FD in os.environ and not await_hand_over():
        return 0
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    cfg = Config.handed_over()
    # The dashboard's token (HERDER_HTTP_TOKEN, which `herder run` moved into the config): out of
    # the config before any child (the fork server first) is handed it (herder.supervisor.http_auth).
    http_token, cfg = cfg.http_token, replace(cfg, http_token="")
    logs.setup(cfg.log_level, cfg.log_format)
    # `kill -USR2 <master>` prints every thread's stack to the log: what a stuck loop waits on.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    started_at = time.time()
    # rq and redis, which this process needs too, come before the fork server: the template is
    # forked from this process (while it has no other thread) and shares their pages with it;
    # it imports herder's worker while this process imports the rest. Plain spawns with
    # --no-fork-server or where fork is wrong.
    import herder.common.redis_connect  # noqa: F401
    import herder.common.rq_seam  # noqa: F401

    launcher = ForkServerLauncher(cfg)
    launcher.tend(lambda: None)  # the loop hands it the real wake-up on its first pass
    control = open_control(cfg, started_at)
    from herder.common.config import all_queues, pool_configs
    from herder.common.redis_connect import connect, retry_resets
    from herder.common.uplink_protocol import MASTER_RESTARTS_ENV
    from herder.supervisor.launcher import SystemClock
    from herder.supervisor.launchers import Launchers
    from herder.supervisor.master import Master, Start
    from herder.supervisor.redis_side.load_reader import ClusterSettings, LoadReader
    from herder.supervisor.redis_side.recovery import RecoveryThread
    from herder.supervisor.redis_side.scheduler_locks import SchedulerLocks
    from herder.supervisor.scheduler import SchedulerKeeper
    from herder.supervisor.uplink import Uplink

    host_id = cfg.host_id or f"{socket.gethostname()}:{os.getpid()}"
    recovery = reader = locks = None
    if cfg.redis_url:  # status shows queue lengths even for a fixed count

        def client() -> Redis:  # one per thread: each blocks on its own socket
            # A reset connection is tried again on a new one: one broken connection is not an
            # outage. A timeout is not (a frozen Redis), so no call waits more than 5 s.
            return connect(cfg.redis_url or "", socket_timeout=5, socket_connect_timeout=3, **retry_resets(1))

        pools = pool_configs(cfg)
        rq_workers = all(pc.worker_command is None for pc in pools.values())
        recovery = RecoveryThread(client(), cfg, sweeping=rq_workers)
        clusters = {
            name: ClusterSettings(host_id, pc.cluster_max_workers, pc.host_ttl, cfg.kill_budget_window)
            for name, pc in pools.items()
            if pc.cluster_max_workers is not None
        }
        interval = min(pc.scale_interval for pc in pools.values())
        reader = LoadReader(client(), all_queues(cfg), interval, clusters=clusters)
        locks = SchedulerLocks(client(), all_queues(cfg))  # also read with the setting off: status says who
    # The loop waits for the GIL after each wake-up while the pipe hub parses a busy fleet's
    # lines: a millisecond at most, not Python's default five (a death is handled at once).
    sys.setswitchinterval(SWITCH_INTERVAL)
    clock = SystemClock()
    master = Master(
        cfg,
        # A pool whose imports differ gets a fork server of its own.
        Launchers(launcher, cfg, new=ForkServerLauncher),
        clock,
        recovery=recovery,
        reader=reader,
        sched=SchedulerKeeper(
            locks, clock, host_id, spawn=launcher.spawn_scheduler, can_spawn=lambda: not launcher.warming()
        ),
        start=Start(
            host_id=host_id,
            restarts=int(os.environ.get(MASTER_RESTARTS_ENV, "0") or 0),
            started_at=started_at,
            control=control,
            uplink=Uplink(),
            http_token=http_token,
        ),
    )
    return master.run()


if __name__ == "__main__":
    sys.exit(main())
