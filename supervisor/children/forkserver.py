"""Warm workers: the master's side of the fork server (herder.worker.template).

`ForkServerLauncher` is the Launcher the master uses by default. It keeps one template
process, a child like any other (started, watched, reaped, restarted with backoff), and asks
it for each worker: one round trip of a few milliseconds instead of a fresh interpreter's
~0.2 s of imports. Whenever the template cannot serve (warming up, dead, slow to answer, or
fork is wrong here) a worker is spawned the plain way, so workers keep starting, slower.

The master is a child subreaper, so the workers the template double-forks become its own
children (docs/design.md, "Warm workers"). A subreaper also inherits orphans of its
descendants (a job's daemonised grandchild, the template's middle process): `tend` reaps
any child that is not a process the master watches.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from herder.common.config import Config
from herder.common.prctl import become_subreaper
from herder.common.worker_protocol import ENV_POOL
from herder.supervisor.children.fleet import ProcessHandle
from herder.supervisor.children.launcher import SubprocessLauncher, worker_env
from herder.supervisor.children.workerproc import WATCHED, ForkedChild, WorkerProcess

log = logging.getLogger("herder")

WARM_TIMEOUT = 30.0  # seconds the template may take to import (the user's --preload too)
ANSWER_TIMEOUT = 2.0  # seconds a fork may take before the template counts as broken
RETIRE_GRACE = 5.0  # seconds a replaced template has to exit on EOF before SIGKILL
SPARE_EXIT_WAIT = 1.0  # seconds the master's exit waits for children it does not watch (a spare)
RESTART_DELAYS = (0.5, 1, 2, 4, 8, 16, 30)  # after the template died or failed, in a row
TEMPLATE_ARGV = [sys.executable, "-P", "-m", "herder.worker.template"]


def why_no_fork_server(cfg: Config) -> str | None:
    """Why workers are spawned plainly here, or None if they can come from the template."""
    if not cfg.fork_server:
        return "--no-fork-server"
    if cfg.worker_command:
        return "--worker-command runs a program of its own"
    if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return "this platform has no fork"
    if not become_subreaper():
        return "this platform cannot make the master a child subreaper (Linux only)"
    return None


def reap_strays(wait: float = 0.0) -> int:
    """Reap exited children the master does not watch; how many. Watched ones are left
    alone: their owner reaps them, and their pid must stay reserved until it does. `wait`:
    seconds to wait for unwatched children still running to exit (at the master's exit)."""
    reaped, deadline = 0, time.monotonic() + wait
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None and time.monotonic() < deadline:
            time.sleep(0.005)
            continue
        if info is None or info.si_pid in WATCHED:
            return reaped  # none exited, or a watched one is first: the next pass sees the rest
        try:
            os.waitpid(info.si_pid, 0)
            reaped += 1
        except ChildProcessError:
            pass


def stdio_pipes() -> tuple[list[int], list[int]]:
    """A forked child's stdin, stdout and stderr as pipes: (the child's ends, the master's)."""
    pipes = [os.pipe() for _ in range(3)]
    return [pipes[0][0], pipes[1][1], pipes[2][1]], [pipes[0][1], pipes[1][0], pipes[2][0]]


def fork_template(env: dict[str, str], sock_fd: int) -> ForkedChild:
    """The template forked from this process (the master, still single-threaded), with pipes
    for its stdio as a spawned one has: it shares the master's imports, rq and redis among them.
    Linux does not pass the subreaper flag on, so the template's middle processes still hand
    workers to the master."""
    theirs, ours = stdio_pipes()
    sys.stdout.flush()
    sys.stderr.flush()  # or the child writes what the master had buffered once more
    # The imports so far move out of the collector's reach in the master too: its collections
    # would write to every object's header and so copy the pages it shares with the template.
    gc.freeze()
    try:
        pid = os.fork()
    except OSError:
        for fd in theirs + ours:
            os.close(fd)
        raise
    if pid == 0:
        from herder.worker.template import main_forked

        main_forked(env, theirs, sock_fd)  # never returns
    for fd in theirs:
        os.close(fd)
    try:
        os.setpgid(pid, pid)  # as the child does itself: whichever runs first, it exists
    except OSError:
        pass
    return ForkedChild(pid, *ours)


class Template:
    """One template process and the socket to it. `fork`: forked from the master (only while
    it has no thread but its main one), else a new interpreter."""

    def __init__(self, cfg: Config, wake: Callable[[], None], fork: bool = False) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = worker_env(cfg, -1)
        env["HERDER_FORK_SOCKET"] = str(theirs.fileno())
        env["HERDER_MASTER_PID"] = str(os.getpid())
        self.forked = fork and threading.active_count() == 1
        try:
            if self.forked:
                child = fork_template(env, theirs.fileno())
                self.proc = WorkerProcess.watch(child, -1, wake, kind="fork server")
            else:
                self.proc = WorkerProcess.spawn(
                    TEMPLATE_ARGV, env, -1, wake, kind="fork server", pass_fds=(theirs.fileno(),)
                )
        finally:
            theirs.close()
        self.sock = ours
        self.started = time.monotonic()
        self.ready = False
        self.broken = ""  # why it will not be asked again
        self.retired_at = 0.0

    def check_ready(self) -> bool:
        if not self.ready and not self.broken:
            try:
                self.ready = self.sock.recv(64, socket.MSG_DONTWAIT) == b"ready"
            except BlockingIOError:
                pass
            except OSError as exc:
                self.broken = f"its socket failed: {exc}"
        return self.ready

    def fork(self, env: dict[str, str], argv: list[str], kind: str = "worker") -> ForkedChild:
        """A worker (or the scheduler: `kind`) forked from the template; OSError (and the
        template marked broken) if not."""
        theirs, ours = stdio_pipes()
        try:
            socket.send_fds(
                self.sock, [json.dumps({"env": env, "argv": argv, "kind": kind}).encode()], theirs
            )
            readable, _, _ = select.select([self.sock], [], [], ANSWER_TIMEOUT)
            if not readable:
                raise OSError(f"no answer within {ANSWER_TIMEOUT:g} s")
            reply = json.loads(self.sock.recv(4096) or b'{"error": "it closed its socket"}')
            if "pid" not in reply:
                raise OSError(reply.get("error", "no pid in its answer"))
        except (OSError, ValueError) as exc:
            self.broken = str(exc)
            for fd in ours:
                os.close(fd)
            raise OSError(f"fork server: {exc}") from None
        finally:
            for fd in theirs:
                os.close(fd)
        return ForkedChild(int(reply["pid"]), *ours)

    def close(self) -> None:
        """Close the socket (it exits on EOF); the launcher reaps it."""
        self.sock.close()
        self.broken = self.broken or "replaced"


class ForkServerLauncher:
    """Workers from a warm template; plain spawns whenever it cannot serve."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.wake: Callable[[], None] = lambda: None  # the master's, from the first tend()
        self.plain = SubprocessLauncher()
        self.template: Template | None = None
        self.retired: list[Template] = []  # closed, not yet reaped
        self.failures = 0  # template deaths or failures in a row
        self.next_start = 0.0
        self.disabled = why_no_fork_server(cfg)
        self.forked = self.spawned_plain = 0
        # The first template is forked from the master (sharing its imports); later ones (new
        # code at a rolling restart, or after a death, when the master has threads) are spawned.
        self.fork_first = True
        if self.disabled:
            log.info("workers start as new interpreters: %s", self.disabled)

    # ---- the Launcher --------------------------------------------------------------------

    def spawn(
        self, argv: list[str], env: dict[str, str], slot: int, wake: Callable[[], None]
    ) -> ProcessHandle:
        t = self.template
        if t is not None and t.check_ready() and not t.broken:
            try:
                proc = WorkerProcess.watch(t.fork(env, argv), slot, wake, pool=env.get(ENV_POOL, ""))
                self.forked += 1
                self.failures = 0
                return proc
            except OSError as exc:
                log.warning("%s; this worker starts as a new interpreter", exc)
                self.retire(failed=True)
        self.spawned_plain += 1
        return self.plain.spawn(argv, env, slot, wake)

    def spawn_scheduler(
        self, argv: list[str], env: dict[str, str], wake: Callable[[], None]
    ) -> ProcessHandle:
        """RQ's scheduler process, forked from the template as a worker is (it then shares the
        template's imports instead of holding its own interpreter's: about 16 MB less), or
        spawned as `argv` when the template cannot serve."""
        t = self.template
        if t is not None and t.check_ready() and not t.broken:
            try:
                return WorkerProcess.watch(t.fork(env, argv, kind="scheduler"), -1, wake, kind="scheduler")
            except OSError as exc:
                log.warning("%s; the scheduler starts as a new interpreter", exc)
                self.retire(failed=True)
        return WorkerProcess.spawn(argv, env, -1, wake, kind="scheduler")

    def warming(self) -> bool:
        """True while the template is importing and has time left: spawns wait for it."""
        t = self.template
        if t is None or t.broken or t.check_ready():
            return False
        if time.monotonic() - t.started > WARM_TIMEOUT:
            log.warning("fork server: not ready after %g s; workers start as new interpreters", WARM_TIMEOUT)
            t.broken = "not ready in time"
            self.retire(failed=True)
            return False
        return not t.proc.has_exited()

    def tend(self, wake: Callable[[], None]) -> None:
        """Each loop pass: start the template, reap a dead one (a new one follows, backing
        off), end a retired one, and reap strays."""
        self.wake = wake
        t = self.template
        if t is not None and (t.broken or t.proc.has_exited()):
            self.retire(failed=True)
        for old in list(self.retired):
            if time.monotonic() - old.retired_at > RETIRE_GRACE:
                old.proc.signal_group(signal.SIGKILL)  # stuck in a --preload import, say
            if old.proc.has_exited():
                code = old.proc.reap()
                self.retired.remove(old)
                if old.broken != "replaced":
                    log.warning("fork server pid %d exited (code %d)", old.proc.pid, code)
        if self.template is None and not self.disabled and time.monotonic() >= self.next_start:
            self.start_template()
        reap_strays()

    def renew(self, cfg: Config) -> None:
        """A rolling restart: a new template with the new code and settings."""
        self.cfg = cfg
        self.disabled = why_no_fork_server(cfg)
        self.retire(failed=False)
        self.failures, self.next_start = 0, 0.0
        self.fork_first = False  # a fork of this master would carry its old code

    def close(self) -> None:
        self.retire(failed=False)
        for old in self.retired:
            old.proc.signal_group(signal.SIGKILL)
            old.proc.reap()
        self.retired.clear()
        reap_strays(wait=SPARE_EXIT_WAIT)  # a template's spare exits when it sees the template gone

    # ---- the template's life ---------------------------------------------------------------

    def start_template(self) -> None:
        try:
            fork, self.fork_first = self.fork_first, False
            self.template = Template(self.cfg, lambda: self.wake(), fork=fork)  # self.wake: set by tend()
            log.info("fork server pid %d: starting%s (preload: %s)", self.template.proc.pid,
                     " (forked from the master)" if self.template.forked else "",
                     ", ".join(self.cfg.preload) or "herder, rq, redis")  # fmt: skip
        except OSError as exc:
            log.error("fork server: cannot start (%s); workers start as new interpreters", exc)
            self.template = None
            self.failures += 1
            self.next_start = time.monotonic() + RESTART_DELAYS[min(self.failures, len(RESTART_DELAYS)) - 1]

    def retire(self, failed: bool) -> None:
        t, self.template = self.template, None
        if t is None:
            return
        if failed:
            self.failures += 1
            delay = RESTART_DELAYS[min(self.failures, len(RESTART_DELAYS)) - 1]
            self.next_start = time.monotonic() + delay
            log.warning("fork server pid %d: %s; a new one in %g s", t.proc.pid,
                        t.broken or "exited", delay)  # fmt: skip
        t.close()  # a template that serves exits on EOF; one still importing is killed
        t.retired_at = time.monotonic()
        if failed or not t.ready:
            t.proc.signal_group(signal.SIGKILL)
        self.retired.append(t)
