"""The master process: python -P -m herder.supervisor, started by the watchdog.

The one composition root: `compose` builds the master's parts, grouped by room (the
children, policy, the control surface, the views), wires them and hands them to the loop;
`main` gives it the real launcher and clock, the Redis-facing threads (when there is a
Redis) and the uplink to the watchdog. Everything it needs comes from the resolved Config
in the environment.
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
from herder.supervisor.children import logs
from herder.supervisor.children.forkserver import ForkServerLauncher

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis import Redis

    from herder.supervisor.children.launcher import Clock
    from herder.supervisor.children.launchers import Launchers
    from herder.supervisor.children.scheduler import SchedulerKeeper
    from herder.supervisor.control.http_endpoint import Publisher
    from herder.supervisor.control.server import ControlServer
    from herder.supervisor.control.takeover import Takeover
    from herder.supervisor.master import Master, Start
    from herder.supervisor.redis_side.load_reader import LoadReader
    from herder.supervisor.redis_side.recovery import Recovery
    from herder.supervisor.views.hooks import EventHooks
    from herder.supervisor.views.jobstats import JobStats
    from herder.supervisor.views.journal import Journal

SWITCH_INTERVAL = 0.001  # seconds a thread holds the GIL while another waits (Python's: 0.005)


def open_control(cfg: Config, started_at: float) -> ControlServer | None:
    """The control socket, right after the fork server is started: `herder status` answers
    `starting` while the rest of the master loads; requests that change things wait for the
    loop's first pass."""
    if not cfg.state_dir:
        return None
    from herder.supervisor.control.server import ControlServer

    def early(body: dict) -> dict | None:
        if body["cmd"] == "ping":
            return {"ok": True, "pid": os.getpid()}
        if body["cmd"] == "status":
            from herder.supervisor import __version__
            from herder.supervisor.views.status import starting_status

            return starting_status(cfg, started_at, __version__)
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


def compose(
    cfg: Config,
    launchers: Launchers,
    clock: Clock,
    recovery: Recovery | None = None,
    reader: LoadReader | None = None,
    sched: SchedulerKeeper | None = None,
    start: Start | None = None,
) -> Master:
    """The master from its parts, grouped by room (the children, policy, the control surface,
    the views): the one place they are built and wired (main below; the unit tests, with
    fakes). `launchers`: where workers come from; `recovery` and `reader`: the threads that
    talk to Redis (None without Redis); `sched`: RQ's scheduler process's keeper."""
    import itertools

    from herder.common.config import pool_configs
    from herder.supervisor.children.changes import Sweeps
    from herder.supervisor.children.counters import Counters
    from herder.supervisor.children.reaper import Reaper
    from herder.supervisor.children.scheduler import SchedulerKeeper
    from herder.supervisor.children.spawner import Spawner
    from herder.supervisor.control.server import ControlServer
    from herder.supervisor.events import Events
    from herder.supervisor.master import Children, Master, Policy, Start, Surface
    from herder.supervisor.policy.endings import Endings
    from herder.supervisor.policy.guard import KillGuard
    from herder.supervisor.policy.murder import Murderer
    from herder.supervisor.policy.pool import Pool, Workers, host_target, live, pool_of_queue
    from herder.supervisor.policy.pressure import KernelLog, MemoryWatch, OomWatch
    from herder.supervisor.views.build import Snapshots
    from herder.supervisor.views.evidence import EvidenceKeeper
    from herder.supervisor.views.health import HealthWatch
    from herder.supervisor.views.hooks import EventHooks
    from herder.supervisor.views.journal import Journal
    from herder.supervisor.views.publish import Views
    from herder.supervisor.views.sources import Sources
    from herder.supervisor.views.usage import SHARED

    start = start or Start()
    hostname = socket.gethostname()
    host_id = start.host_id or cfg.host_id or f"{hostname}:{os.getpid()}"
    started_at = clock.wall() if start.started_at is None else start.started_at
    master: Master | None = None  # the loop, built last: what it answers is its (late-bound below)
    tickets = itertools.count(1)  # cull tickets: unique across pools (retirement.py)
    pools = {name: Pool.build(name, pc, host_id, recovery, tickets) for name, pc in pool_configs(cfg).items()}
    workers, counters, events = Workers(pools), Counters(), Events(clock)
    # The views: what happened as sentences, the event hooks, the snapshot's parts (never the master).
    journal = Journal(clock.wall)
    hooks = EventHooks(cfg, host_id, counted=bool(cfg.http))  # --on-event, --on-event-url
    said = (hooks, journal)
    if recovery is not None:  # a job given up is an event (called from the recovery thread)
        recovery.on_give_up = lambda job_id, queue, why: hooks.emit(
            "job_given_up", job_id=job_id, queue=queue, pool=pool_of_queue(pools, queue), reason=why
        )

    def submit(body: dict) -> dict:  # the dashboard's controls, answered by the loop
        assert master is not None
        return master.commands.submit(body, events.wake)

    def upgrade() -> dict:  # the version and the hand-over, for the dashboard's JSON
        from herder.supervisor import __version__
        from herder.supervisor.control import handoff

        assert master is not None
        return {"version": __version__, "handover": handoff.view(master)}

    def answer(body: dict) -> dict | None:  # the control socket's requests answered off the loop
        assert master is not None
        return master.commands.answer_directly(body)

    policy = Policy(KillGuard(cfg, recovery), Endings(), MemoryWatch(), recovery, reader)
    sched = sched or SchedulerKeeper(None, clock, host_id)
    sources = Sources(
        clock, host_id, started_at, start.restarts, pools, workers, counters, policy.guard, recovery, reader,
        sched, HealthWatch(), policy.memory,
    )  # fmt: skip
    http, jobstats = (
        http_side(cfg, clock, said, reader, start.http_token, (submit, upgrade)) if cfg.http else (None, None)
    )
    snapshots = Snapshots(hostname, clock.wall, SHARED, journal, EvidenceKeeper(SHARED))
    views = Views(sources, snapshots, said, http, jobstats)

    def fleet_size() -> int:  # what the kill budget is a share of
        return max(host_target(pools.values()), len(live(workers.values())))

    children = Children(
        pools, launchers, sched,
        Spawner(clock, pools, launchers, counters, said, events.wake),
        Reaper(clock, hostname, pools, counters, recovery, (*said, OomWatch(kernel_log=KernelLog()))),
        Murderer(clock, pools, policy.guard, counters, said, fleet_size),
        tickets,
        Sweeps(start.changes),
    )  # fmt: skip
    control = start.control
    if control is None and cfg.state_dir:
        control = ControlServer(cfg.state_dir, events.wake, answer)
    if control is not None:
        control.hand_over(events.wake, answer)
    surface = Surface(events, control, start.uplink)
    master = Master(cfg, clock, children, policy, surface, views, replace(start, host_id=host_id))
    return master


def http_side(
    cfg: Config,
    clock: Clock,
    said: tuple[EventHooks, Journal],
    reader: LoadReader | None,
    http_token: str,
    loop: tuple[Callable[[dict], dict], Callable[[], dict]],
) -> tuple[Publisher, JobStats]:
    """/metrics and the dashboard, and the job metrics only it serves: with --http alone, only
    then does the master import prometheus-client and http.server (a master without is 1 MB
    smaller)."""
    from herder.supervisor.control.http_auth import Controls, read_token
    from herder.supervisor.control.http_endpoint import Feeds, Publisher
    from herder.supervisor.views.jobstats import JobStats

    try:
        token = read_token(cfg.http_token_file, http_token)
    except (OSError, ValueError) as exc:  # says which file, never what it holds
        logging.getLogger("herder").error(
            "http: cannot read http_token_file (%s): the dashboard stays read-only", exc
        )
        token = ""
    hooks, journal = said
    jobstats = JobStats()  # herder_job_duration_seconds
    http = Publisher(
        cfg.http,
        clock.monotonic,
        (jobstats.histogram, hooks.counts),
        Feeds(
            journal=journal,
            wall=clock.wall,
            hosts=reader.host_records if reader is not None else lambda: (0.0, []),
            controls=Controls(token),
            submit=loop[0],
            upgrade=loop[1],
        ),
    )
    return http, jobstats


def check_upgrade() -> int:
    """`herder upgrade`'s check of the installed code (watchdog/upgrade.py): the master's modules
    import and the configuration, pools and all, parses. Exit 0: the watchdog may exec it."""
    import herder.supervisor.control.takeover  # noqa: F401
    import herder.supervisor.master  # noqa: F401
    from herder.common.config import pool_configs

    pool_configs(Config.handed_over())
    return 0


def take_over(cfg: Config) -> Takeover | None:
    """`herder upgrade`: master A's state and listening sockets, when the watchdog started this
    master to take over from it (HERDER_UPGRADE_FROM); exits 1 if A will not hand over."""
    from herder.common.upgrade_protocol import ENV_FROM
    from herder.supervisor.control.takeover import Takeover, TakeoverRefused

    if not os.environ.pop(ENV_FROM, "") or not cfg.state_dir:
        return None
    try:
        takeover = Takeover.begin(cfg.state_dir)
    except TakeoverRefused as exc:
        logging.getLogger("herder").error("herder upgrade: cannot take over: %s", exc)
        sys.exit(1)
    logging.getLogger("herder").info("herder upgrade: taking over from master %d (herder %s)",
                                     takeover.a_pid, takeover.a_version)  # fmt: skip
    return takeover


def main() -> int:
    if sys.argv[1:] == ["--check-upgrade"]:
        return check_upgrade()
    if ENV_GO_FD in os.environ and not await_hand_over():
        return 0
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    cfg = Config.handed_over()
    # The dashboard's token (HERDER_HTTP_TOKEN, which `herder run` moved into the config): out of
    # the config before any child (the fork server first) is handed it (herder.supervisor.control.http_auth).
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

    takeover = take_over(cfg)
    launcher = ForkServerLauncher(cfg)
    launcher.tend(lambda: None)  # the loop hands it the real wake-up on its first pass
    control = open_control(cfg, started_at) if takeover is None else adopted_control(cfg, takeover)
    from herder.common.config import all_queues, pool_configs
    from herder.common.redis_connect import connect, retry_resets
    from herder.common.uplink_protocol import MASTER_RESTARTS_ENV
    from herder.supervisor.children.changes import CHANGED
    from herder.supervisor.children.launcher import SystemClock
    from herder.supervisor.children.launchers import Launchers
    from herder.supervisor.children.scheduler import SchedulerKeeper
    from herder.supervisor.master import Start
    from herder.supervisor.redis_side.load_reader import ClusterSettings, LoadReader
    from herder.supervisor.redis_side.recovery import RecoveryThread
    from herder.supervisor.redis_side.scheduler_locks import SchedulerLocks
    from herder.supervisor.uplink import Uplink

    host_id = takeover.host_id if takeover else cfg.host_id or f"{socket.gethostname()}:{os.getpid()}"
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
        locks.ride_with(reader)  # its reading in the load's: one wake-up, one round trip for both
    # The loop waits for the GIL after each wake-up while the pipe hub parses a busy fleet's
    # lines: a millisecond at most, not Python's default five (a death is handled at once). The
    # hub relaxes it while a big fleet is settled (pipes.RELAXED_SWITCH_INTERVAL).
    sys.setswitchinterval(SWITCH_INTERVAL)
    clock = SystemClock()
    master = compose(
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
            changes=CHANGED,
            takeover=takeover,
        ),
    )
    if takeover is not None:
        takeover.carry_over(master.pool_list())
        if master.views.http:  # served from the gate on (takeover.py)
            master.views.http.inherited, master.views.http.held = inherited_http(cfg, takeover), True
    return master.run()


def inherited_http(cfg: Config, takeover: Takeover) -> socket.socket | None:
    """A's HTTP listener, if it listens where this master's config says (an upgrade may move
    it: then this master binds its own, and A's closes with A)."""
    from herder.common.config import http_address

    sock = takeover.listeners.pop("http", None)
    if sock is not None and cfg.http and sock.getsockname()[:2] == http_address(cfg.http):
        return sock
    if sock is not None:
        sock.close()
    return None


def adopted_control(cfg: Config, takeover: Takeover) -> ControlServer | None:
    """The control socket master A handed over: served from B's gate on (takeover.py)."""
    from herder.supervisor.control.server import ControlServer

    sock = takeover.listeners.get("control")
    if sock is None or not cfg.state_dir:
        return None
    control = ControlServer(cfg.state_dir, lambda: None, lambda body: None)
    control.adopt(sock)
    return control


if __name__ == "__main__":
    sys.exit(main())
