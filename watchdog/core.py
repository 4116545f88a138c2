"""The watchdog: keeps one master alive. Standard library only, and small, on purpose:
it must be very hard to crash, and if it dies the service manager restarts it.

It watches the master the way the master watches workers: a pipe, a line protocol
(docs/protocol.md, "uplink"), a deadline. Silence past the deadline means hung; EOF or
exit means dead. Either way it starts a new master, with exponential backoff, and gives
up (exit 1, so systemd or launchd takes over) past max_restarts within restart_window.

On Linux it is a child subreaper: when a master dies, its workers (finishing their last
job) become the watchdog's children, so the watchdog reaps them and, when asked to
stop, waits for them before it exits (under systemd's KillMode=mixed, exiting early
would get them SIGKILLed mid-job).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import time
from collections import deque
from enum import StrEnum
from typing import TYPE_CHECKING

from herder.common import handover
from herder.common.exits import EX_CONFIG, describe
from herder.common.lines import LineSplitter
from herder.common.prctl import become_subreaper
from herder.common.transitions import move
from herder.common.uplink_protocol import MASTER_RESTARTS_ENV, parse_uplink
from herder.watchdog.notify import Notifier
from herder.watchdog.upgrade import Upgrader

if TYPE_CHECKING:  # imported by __main__ only with embedded_redis on
    from herder.common.config.prestart import Adopted
    from herder.watchdog.embedded_redis import EmbeddedRedis

log = logging.getLogger("herder.watchdog")

TICK = 0.25


class MasterState(StrEnum):
    """What the watchdog knows of its current master: STARTING (started, no `ready` yet) ->
    READY (systemd's watchdog is fed while it keeps talking); KILLED: SIGKILLed for running
    past the stop's grace (once: the exit comes next). A new master starts at STARTING."""

    STARTING = "starting"
    READY = "ready"
    KILLED = "killed"


MASTER_TRANSITIONS: dict[MasterState, frozenset[MasterState]] = {
    # STARTING again: a master that died is replaced by a new one, ready or not.
    MasterState.STARTING: frozenset({MasterState.STARTING, MasterState.READY, MasterState.KILLED}),
    MasterState.READY: frozenset({MasterState.STARTING, MasterState.KILLED}),
    MasterState.KILLED: frozenset(),  # only while stopping: no master starts after it
}


# A master silent because it waits for a CPU is spared for this many heartbeat timeouts.
STARVED_TIMEOUTS = 4
# Signals whose default would end the watchdog at once and strand an embedded Redis: SIGUSR1
# upgrades in place (`herder upgrade`, watchdog/upgrade.py), SIGUSR2 is forwarded (the master
# writes every thread's stack to its log).
STRAY = (signal.SIGUSR1, signal.SIGUSR2)


def run_state(pid: int) -> tuple[bool, float] | None:
    """Whether any thread of the process is runnable (R in /proc: running or waiting for a CPU),
    and the CPU seconds of all its threads; None where the kernel does not say (macOS). Any
    thread, not the main one alone: a starved master's loop often waits for the GIL (state S)
    that another of its threads, runnable, holds."""
    try:
        letters = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    letters.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:  # the thread ended meanwhile
                continue
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime: every thread's
        return "R" in letters, ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Phase(StrEnum):
    """The watchdog's own life: RUNNING (it keeps a master alive) --a stop (a signal, the
    master's `stopping`, or giving up)--> STOPPING (no new master; it waits for the children)."""

    RUNNING = "running"
    STOPPING = "stopping"


PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.RUNNING: frozenset({Phase.STOPPING}),
    Phase.STOPPING: frozenset(),
}


class Watchdog:
    def __init__(
        self,
        master_argv: list[str],
        heartbeat_timeout: float = 15.0,
        max_restarts: int = 5,
        restart_window: float = 60.0,
        stop_grace: float = 60.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 10.0,
        ping_grace: float = 3.0,
        redis: EmbeddedRedis | None = None,
        user: str = "",
        config: str | None = None,
        state_dir: str = "",
    ) -> None:
        self.master_argv = master_argv
        self.config = config  # the resolved config each master is handed (herder.common.handover)
        self.heartbeat_timeout = heartbeat_timeout
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.stop_grace = stop_grace
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.ping_grace = ping_grace  # master silence after which systemd's watchdog is no longer fed
        self.notify = Notifier()
        self.redis = redis
        self.run_as = RunAs.named(user) if user and os.geteuid() == 0 else None
        if self.redis and self.run_as:
            self.redis.run_as = self.run_as
        self._last_extend = 0.0
        self.master: subprocess.Popen[bytes] | Adopted | None = None
        self.master_seen = 0.0
        # The master's CPU seconds when it was last heard (starved()), and when.
        self._cpu_at_seen: float | None = None
        self._cpu_seen_at = -1.0
        self._starved_said = False
        self.master_state = MasterState.STARTING  # changed only through master_becomes()
        self.restarts: deque[float] = deque()
        self.master_starts = 0
        self.ever_ready = False  # a master said `ready` once: systemd has had READY=1
        self.next_start = 0.0
        self.phase = Phase.RUNNING  # changed only through begin_stop()
        self.stop_started = 0.0
        self.exit_code = 0
        self._lines = LineSplitter()
        self._signals: list[int] = []
        self.upgrader = Upgrader(self, state_dir)  # `herder upgrade`: A's hand-over to B
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    @property
    def stopping(self) -> bool:
        return self.phase == Phase.STOPPING

    def begin_stop(self, now: float) -> None:
        """STOPPING: no master starts again; the one running drains its workers."""
        self.phase = move(PHASES, self.phase, Phase.STOPPING, "watchdog")
        self.stop_started = now

    def master_becomes(self, new: MasterState) -> None:
        self.master_state = move(MASTER_TRANSITIONS, self.master_state, new, "watchdog: master")

    @property
    def master_ready(self) -> bool:
        return self.master_state == MasterState.READY

    def reinstate(self, master: subprocess.Popen[bytes] | Adopted) -> None:
        """`herder upgrade` (watchdog/upgrade.py): a master that was ready is the master again."""
        self.master, self.master_seen, self.ever_ready = master, time.monotonic(), True
        if self.master_state != MasterState.READY:  # READY: B had said `ready` (not A)
            self.master_becomes(MasterState.READY)

    # ---- signals ---------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, *STRAY):
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self._wake_w)
        # `herder run` blocked these across its exec (a PID 1 drops what it has no handler
        # for), `herder upgrade` the strays too: what arrived meanwhile is delivered now.
        signal.pthread_sigmask(
            signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, *STRAY}
        )

    def handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if sig == signal.SIGCHLD:
                continue
            name = signal.Signals(sig).name
            if sig == signal.SIGUSR1:
                self.upgrader.request()
                continue
            if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT) and not self.stopping:
                self.begin_stop(time.monotonic())
                self.notify.stopping()
                log.info("%s: stopping (the master drains its workers)", name)
            if self.master and self.master.returncode is None:
                log.info("forwarding %s to master %d", name, self.master.pid)
                try:
                    self.master.send_signal(sig)
                except ProcessLookupError:
                    pass
            self.upgrader.signal_old(sig)  # A, still handing over, drains too

    # ---- master --------------------------------------------------------------------

    def start_master(self, extra: dict[str, str] | None = None) -> None:
        kwargs = self.run_as.popen_kwargs() if self.run_as else {}
        # How many times this watchdog restarted the master: the master reports it (metrics).
        env = dict(kwargs.get("env", os.environ), **{MASTER_RESTARTS_ENV: str(self.master_starts)})
        env.update(extra or {})  # `herder upgrade`: the master it takes over from
        if self.config is not None:
            env[handover.ENV_RESOLVED] = self.config
        with handover.handed(env) as (kwargs["env"], fds):
            master = subprocess.Popen(
                self.master_argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                close_fds=True,
                pass_fds=fds,
                # Own process group: a Ctrl-C at the terminal reaches only the watchdog,
                # which forwards it once; the master must not see it twice.
                process_group=0,
                **kwargs,
            )
        self.adopt_master(master)

    def adopt_master(self, master: subprocess.Popen[bytes] | Adopted, early: bool = False) -> None:
        """Watch a master just started: by start_master, or (`early`) before the watchdog
        loaded, by watchdog/early.py or by `herder run` (common/config/prestart.py), with the same
        pipe, group and settings."""
        assert master.stdout
        self.master = master
        self.master_starts += 1
        os.set_blocking(master.stdout.fileno(), False)
        self.master_seen = time.monotonic()
        self.master_becomes(MasterState.STARTING)
        self._lines = LineSplitter()
        log.info("master %d started", master.pid)
        if early:
            by = "watchdog/early.py" if isinstance(master, subprocess.Popen) else "herder run"
            log.debug("master %d was started before the watchdog loaded (%s)", master.pid, by)

    def read_master(self) -> None:
        assert self.master and self.master.stdout
        try:
            chunk = os.read(self.master.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.master.stdout.close()
            return
        for line, _cut in self._lines.feed(chunk):
            self.on_master_line(line)

    def on_master_line(self, raw: bytes) -> None:
        self.master_seen = time.monotonic()  # any line is a sign of life
        msg = parse_uplink(raw)
        if msg is None:
            return
        verb = msg.verb
        if verb == "stopping" and not self.stopping:
            # A stop asked of the master itself (herder stop): do not restart it.
            self.begin_stop(time.monotonic())
            self.notify.stopping()
            log.info("master %d is stopping on request", self.master.pid if self.master else -1)
        elif verb == "ready":
            if self.master_state == MasterState.STARTING:
                log.info("master %d ready", self.master.pid if self.master else -1)
                self.master_becomes(MasterState.READY)
                self.ever_ready = True
                self.upgrader.on_ready()
            self.notify.ready()
        elif verb == "status":
            self.notify.status(msg.text)
        elif verb == "reloading":
            self.notify.reloading()

    def master_stdout_open(self) -> bool:
        return bool(self.master and self.master.stdout and not self.master.stdout.closed)

    def reap(self) -> None:
        """Reap every child: the master, and orphaned workers we adopted as subreaper."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.master and pid == self.master.pid:
                self.master.returncode = os.waitstatus_to_exitcode(status)
                self.on_master_exit(self.master.returncode)
            elif self.redis and self.redis.proc and pid == self.redis.proc.pid:
                self.redis.proc.returncode = os.waitstatus_to_exitcode(status)
                if not self.stopping:
                    log.error(
                        "embedded redis %d exited (%s): starting it again",
                        pid,
                        describe(self.redis.proc.returncode),
                    )
                    self.restart_redis()
            elif not self.upgrader.reaped(pid, status):  # A, or the check (`herder upgrade`)
                log.debug("reaped adopted process %d", pid)

    def has_children(self) -> bool:
        """Any child left but the embedded Redis (which is stopped last), running or unreaped."""
        redis_pid = self.redis.pid if self.redis else None
        if redis_pid is None:
            try:
                os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return False
            return True
        return any(pid != redis_pid for pid in child_pids())

    def restart_redis(self) -> None:
        assert self.redis
        try:
            self.redis.proc = None
            self.redis.start()
        except (OSError, RuntimeError) as exc:
            log.error("cannot restart the embedded redis: %s; giving up", exc)
            self.exit_code = 1
            self.begin_stop(time.monotonic())

    def on_master_exit(self, code: int) -> None:
        assert self.master
        pid = self.master.pid
        if self.master.stdout and not self.master.stdout.closed:
            self.master.stdout.close()
        if not self.stopping and self.upgrader.master_exited(code):
            return
        if self.stopping:
            log.info("master %d exited (%s) while stopping", pid, describe(code))
            self.exit_code = 0 if code in (0, -signal.SIGTERM) else 1
            return
        self.schedule_restart(f"master {pid} exited unexpectedly ({describe(code)})")

    def schedule_restart(self, why: str) -> None:
        now = time.monotonic()
        while self.restarts and now - self.restarts[0] > self.restart_window:
            self.restarts.popleft()
        if len(self.restarts) >= self.max_restarts:
            log.error(
                "%s; %d restarts within %g s already: giving up so the service manager takes over",
                why,
                len(self.restarts),
                self.restart_window,
            )
            self.exit_code = 1
            self.begin_stop(now)
            return
        delay = min(self.backoff_max, self.backoff_initial * 2 ** len(self.restarts))
        self.restarts.append(now)
        self.next_start = now + delay
        log.warning("%s; restarting it in %.2f s", why, delay)

    def check_silence(self) -> None:
        if not self.master or self.master.returncode is not None:
            return
        if self.master_seen != self._cpu_seen_at:  # heard since the last look: count from here
            seen = run_state(self.master.pid)
            self._cpu_seen_at, self._cpu_at_seen = self.master_seen, seen[1] if seen else None
            self._starved_said = False
        silent = time.monotonic() - self.master_seen
        if silent <= self.heartbeat_timeout:
            return
        if self.starved(silent):
            if not self._starved_said:
                self._starved_said = True
                log.warning("master %d silent for %.1f s, but waiting for a CPU: this host is overloaded "
                            "(see worker_nice); not killed before %g s", self.master.pid, silent,
                            STARVED_TIMEOUTS * self.heartbeat_timeout)  # fmt: skip
            return
        log.error(
            "master %d silent for %.1f s (deadline %g s): SIGKILL; its workers finish their jobs "
            "and exit by themselves",
            self.master.pid,
            silent,
            self.heartbeat_timeout,
        )
        self.master_seen = time.monotonic()  # do not repeat while it dies
        try:
            self.master.kill()
        except ProcessLookupError:
            pass

    def starved(self, silent: float) -> bool:
        """Silent because it waits for a CPU, not because it hangs: a thread of it is runnable
        (state R) yet it ran for less than half the silence (a host overloaded by its own busy
        workers). Killing it would stop the whole fleet and help nothing, so it is spared, for up
        to STARVED_TIMEOUTS heartbeat timeouts, and systemd's watchdog is still fed meanwhile. A
        frozen, blocked or deadlocked master is not runnable, and a spinning one on a host with
        CPU to spare runs: both are killed at the deadline, as is every master where the kernel
        does not say."""
        assert self.master
        now, before = run_state(self.master.pid), self._cpu_at_seen
        if now is None or before is None or silent > STARVED_TIMEOUTS * self.heartbeat_timeout:
            return False
        runnable, cpu = now
        return runnable and cpu - before < silent / 2

    def feed_service_manager(self, now: float) -> None:
        master_running = self.master is not None and self.master.returncode is None
        # Healthy: up and heartbeating. The first master is up once it said ready (no WATCHDOG=1
        # before READY=1); a replacement is vouched for while it starts: herder's watchdog owns
        # its start, and a restart by systemd would kill every running job and help nothing.
        # Silent but starved of CPU is spared (check_silence) and vouched for too: systemd must
        # not restart a fleet the watchdog deliberately keeps (up to 4 heartbeat timeouts).
        # A hung master, or a hung watchdog, gets no ping.
        up = self.master_state == MasterState.READY or (
            self.ever_ready and self.master_state == MasterState.STARTING
        )
        silent = now - self.master_seen
        healthy = master_running and up and not self.stopping
        self.notify.ping_if_due(healthy and (silent < self.ping_grace or self.starved(silent)))
        self.notify.flush()  # what waited for room, and the newest STATUS= once a second
        # While a drain waits on long jobs, ask systemd for more time, a little at a
        # time, as long as something is still finishing (our own stop_grace bounds it).
        if self.stopping and (master_running or self.has_children()) and now - self._last_extend >= 5.0:
            self._last_extend = now
            self.notify.extend_timeout(15.0)

    # ---- loop ----------------------------------------------------------------------

    def run(self) -> int:
        self.install_signals()
        if become_subreaper():
            log.debug("watchdog %d is a child subreaper", os.getpid())
        if self.redis:
            try:
                self.redis.start()
            except (OSError, RuntimeError) as exc:
                log.error("cannot start the embedded redis: %s", exc)
                return EX_CONFIG if isinstance(exc, FileNotFoundError) else 1
        try:
            return self.loop()
        finally:
            self.notify.close()
            if self.redis:
                self.redis.stop()

    def loop(self) -> int:
        while True:
            self.handle_signals()
            self.reap()
            now = time.monotonic()
            self.upgrader.step(now)
            master_running = self.master is not None and self.master.returncode is None
            if not master_running and not self.stopping and now >= self.next_start:
                self.start_master()
                master_running = True
            if self.stopping and not master_running:
                if not self.has_children():
                    return self.exit_code
                if now - self.stop_started > 2 * self.stop_grace:
                    log.error(
                        "orphaned workers still running %g s after the stop began: leaving them",
                        2 * self.stop_grace,
                    )
                    return self.exit_code
            if self.stopping and master_running and now - self.stop_started > self.stop_grace:
                assert self.master
                if self.master_state != MasterState.KILLED:
                    log.error(
                        "master %d still running %g s after the stop began: SIGKILL",
                        self.master.pid,
                        self.stop_grace,
                    )
                    self.master.kill()
                    self.master_becomes(MasterState.KILLED)
            if not self.stopping:
                self.check_silence()
            self.feed_service_manager(now)
            fds = [self._wake_r]
            if self.master_stdout_open():
                assert self.master and self.master.stdout
                fds.append(self.master.stdout.fileno())
            try:
                readable, _, _ = select.select(fds + self.upgrader.fds(), [], [], TICK)
            except InterruptedError:
                continue
            self.upgrader.read_old(readable)
            if self._wake_r in readable:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if len(fds) > 1 and fds[1] in readable:
                self.read_master()


class RunAs:
    """Who the master, its workers and the embedded Redis run as, when root starts herder."""

    def __init__(self, name: str, uid: int, gid: int, groups: list[int], home: str) -> None:
        self.name, self.uid, self.gid, self.groups, self.home = name, uid, gid, groups, home

    @classmethod
    def named(cls, name: str) -> RunAs:
        import pwd

        entry = pwd.getpwnam(name)
        return cls(name, entry.pw_uid, entry.pw_gid, os.getgrouplist(name, entry.pw_gid), entry.pw_dir)

    def popen_kwargs(self) -> dict:
        env = dict(os.environ, HOME=self.home, USER=self.name, LOGNAME=self.name)
        return {"user": self.uid, "group": self.gid, "extra_groups": self.groups, "env": env}


def child_pids() -> list[int]:
    """Our children, from /proc (Linux, where the watchdog adopts orphans as subreaper)."""
    me = str(os.getpid())
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == me:
            pids.append(int(entry))
    return pids
