"""`herder upgrade` in the watchdog: re-exec itself from the installed code keeping its pid,
then start master B beside master A, which hands its workers over slot by slot
(docs/design.md, "Upgrading in place"; the master's side: supervisor/control/takeover.py and
supervisor/control/handoff.py).

One attempt's way, as `<state dir>/upgrade.json` says it to `herder upgrade`:

- CHECKING: the installed code is checked in a child of its own (`python -m herder.watchdog
  --check-upgrade`: the watchdog's and the master's modules import, the configuration parses).
  It fails: A goes on untouched, nothing was exec'd, the check's stderr is the error.
- the watchdog execs itself (same pid: systemd's MainPID and launchd's job never change, no
  restart is counted), handing itself A's pid and pipe, the state dir's lock and the config on
  descriptors (ENV_STATE); the embedded Redis, a child, is adopted again by its socket.
- STARTING: master B starts with ENV_FROM; its first workers must be ready within GATE_SECONDS.
  B exits or misses the gate: B is killed, A is the master again, FAILED.
- HANDING_OVER: B said `ready`; A's workers stop one by one as B's take their places.
- DONE: A exited, its last worker with it.

Standard library only (the watchdog's rule).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, TYPE_CHECKING, Protocol

from herder.common import handover, statelock
from herder.common import upgrade_protocol as up
from herder.common.exits import describe

if TYPE_CHECKING:
    from herder.common.config.prestart import Adopted

log = logging.getLogger("herder.watchdog")

CHECK_SECONDS = 60.0
# Blocked across the exec, as `herder run` blocks the stop signals across its own, and SIGUSR1
# and SIGUSR2, whose default would end the watchdog before its handlers are in place (a second
# `herder upgrade`): the new watchdog unblocks them then (Watchdog.install_signals).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}


class Supervising(Protocol):
    """What the upgrade asks of the watchdog (watchdog/core.py's Watchdog)."""

    master: subprocess.Popen[bytes] | Adopted | None
    master_starts: int
    config: str | None

    @property
    def stopping(self) -> bool: ...

    @property
    def master_ready(self) -> bool: ...

    def adopt_master(self, master: subprocess.Popen[bytes] | Adopted, early: bool = False) -> None: ...

    def reinstate(self, master: subprocess.Popen[bytes] | Adopted) -> None: ...

    def start_master(self, extra: dict[str, str] | None = None) -> None: ...


class Upgrader:
    def __init__(self, dog: Supervising, state_dir: str) -> None:
        self.dog = dog
        self.state_dir = state_dir
        self.lock_fd: int | None = None  # the state dir's lock, handed across the exec
        self.seq = 0
        self.state = ""  # "" (none yet) or one of upgrade_protocol's states
        self.old: subprocess.Popen[bytes] | Adopted | None = None  # master A while B takes over
        self.deadline = 0.0
        self._check: subprocess.Popen[bytes] | None = None
        self._check_err: IO[bytes] | None = None
        self._check_out: IO[bytes] | None = None  # the config the installed herder read
        self._start_b = False  # set by resume(): B starts on the loop's first pass

    @property
    def busy(self) -> bool:
        return self.state in (up.CHECKING, up.STARTING, up.HANDING_OVER)

    def say(self, state: str, **more: object) -> None:
        self.state = state
        if self.state_dir:
            record = {"seq": self.seq, "state": state, "watchdog": os.getpid(), "at": time.time(), **more}
            try:
                up.write_result(self.state_dir, record)
            except OSError as exc:
                log.error("upgrade: cannot write %s: %s", up.result_path(self.state_dir), exc)

    def fail(self, why: str) -> None:
        log.error("upgrade failed: %s", why)
        self.say(up.FAILED, error=why)

    # ---- asked (SIGUSR1) ----------------------------------------------------------------

    def request(self) -> None:
        if self.busy or self.old is not None or self._start_b:
            log.warning("upgrade asked while one is under way (%s): ignored", self.state)
            return
        self.seq += 1
        dog = self.dog
        if dog.stopping or dog.master is None or dog.master.returncode is not None:
            self.fail("herder is stopping" if dog.stopping else "no master is running")
            return
        if not dog.master_ready:
            self.fail(f"master {dog.master.pid} is not ready yet: try again once it is")
            return
        log.info("upgrade: checking the installed herder")
        self._check_err = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed by checking()
        self._check_out = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed by checking()
        env = dict(os.environ)
        if dog.config is not None:
            env[handover.ENV_RESOLVED] = dog.config
        with handover.handed(env) as (env, fds):
            self._check = subprocess.Popen(
                [sys.executable, "-P", "-m", "herder.watchdog", "--check-upgrade"],
                stdin=subprocess.DEVNULL,
                stdout=self._check_out,
                stderr=self._check_err,
                close_fds=True,
                pass_fds=fds,
                env=env,
            )
        self.deadline = time.monotonic() + CHECK_SECONDS
        self.say(up.CHECKING)

    # ---- each pass of the watchdog's loop -------------------------------------------------

    def step(self, now: float) -> None:
        if self.dog.stopping and self.busy:  # a stop wins: no exec, no new master; both drain
            if self._check is not None:
                self._check.kill()
                self._check.wait()
                self._check = None
            self._start_b = False
            self.fail("herder is stopping")
            return
        if self._start_b:
            self._start_b = False
            self.start_b()
        if self._check is not None:
            self.checking(now)
        elif self.state == up.STARTING and now > self.deadline:
            self.give_up(f"master B was not ready within {up.GATE_SECONDS:g} s")

    def checking(self, now: float) -> None:
        assert self._check is not None and self._check_err is not None and self._check_out is not None
        code = self._check.poll()
        if code is None and now < self.deadline:
            return
        if code is None:
            self._check.kill()
            self._check.wait()
        self._check = None
        self._check_err.seek(0)
        err = self._check_err.read().decode(errors="replace").strip()
        self._check_err.close()
        self._check_out.seek(0)
        config = self._check_out.read().decode()
        self._check_out.close()
        m = self.dog.master
        if code == 0 and (m is None or m.returncode is not None or m.stdout is None or m.stdout.closed):
            self.fail("the master exited during the check; try again once the watchdog has restarted it")
            return
        if code == 0:
            if config.strip():  # the config file as the installed herder reads it
                self.dog.config = config
            self.reexec()
            return
        tail = "\n".join(err.splitlines()[-15:]) or describe(code if code is not None else -9)
        self.fail(f"the installed herder cannot start (A goes on):\n{tail}")

    def reexec(self) -> None:
        """The watchdog again, from the installed code, in this process: what it must keep
        travels on inheritable descriptors, named in ENV_STATE."""
        dog = self.dog
        assert dog.master is not None and dog.master.stdout is not None
        keep = [dog.master.stdout.fileno()]
        env = dict(os.environ)
        env[up.ENV_STATE] = json.dumps(
            {"seq": self.seq, "pid": dog.master.pid, "fd": keep[0], "starts": dog.master_starts}
        )
        if dog.config is not None:
            cfg_fd = handover.sealed(dog.config)
            keep.append(cfg_fd)
            env[handover.ENV_CONFIG_FD] = str(cfg_fd)
        if self.lock_fd is not None:
            keep.append(self.lock_fd)
            env[statelock.ENV_LOCK_FD] = str(self.lock_fd)
        for fd in keep:
            os.set_inheritable(fd, True)
        log.info("upgrade: the watchdog execs the installed herder (pid %d stays)", os.getpid())
        for handler in logging.getLogger().handlers:
            handler.flush()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
        except OSError as exc:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            for fd in keep[1:]:
                if fd != self.lock_fd:
                    os.close(fd)
            self.fail(f"cannot exec {sys.executable}: {exc}")

    # ---- after the exec ------------------------------------------------------------------

    def resume(self, state: dict) -> None:
        """In the new watchdog, before its loop: A is the master again (ready), and B starts
        on the loop's first pass (after the embedded Redis is adopted)."""
        from herder.common.config.prestart import Adopted

        dog = self.dog
        self.seq = int(state["seq"])
        os.set_inheritable(int(state["fd"]), False)
        dog.adopt_master(Adopted(int(state["pid"]), int(state["fd"])))
        dog.master_starts = int(state["starts"])
        dog.reinstate(dog.master)
        self._start_b = True
        self.state = up.STARTING  # busy from here: a signal that waited out the exec is refused

    def start_b(self) -> None:
        dog = self.dog
        self.old = dog.master
        assert self.old is not None
        if self.old.returncode is not None:
            self.old = None
            self.fail("master A exited while the watchdog was re-exec'd")
            return
        dog.start_master({up.ENV_FROM: str(self.old.pid)})
        assert dog.master is not None
        log.info("upgrade: master %d (new) starts beside master %d (old)", dog.master.pid, self.old.pid)
        self.deadline = time.monotonic() + up.GATE_SECONDS
        self.say(up.STARTING, old=self.old.pid, new=dog.master.pid)

    def on_ready(self) -> None:
        """B said `ready`: its first workers are, and A's start to go."""
        if self.state != up.STARTING or self.dog.master is None:
            return
        b = self.dog.master.pid
        if self.old is None:  # A died meanwhile: B is all there is
            self.say(up.DONE, new=b)
            return
        log.info("upgrade: master %d ready; master %d hands its workers over", b, self.old.pid)
        self.say(up.HANDING_OVER, old=self.old.pid, new=b)

    def give_up(self, why: str) -> None:
        """B failed its gate: it goes (its workers finish their jobs and exit by themselves),
        A is the master again."""
        dog = self.dog
        a, b, self.old = self.old, dog.master, None
        assert b is not None
        if b.returncode is None:  # unreaped, it is reaped later as any other child
            try:
                os.killpg(b.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                b.kill()
        if a is None:  # A died meanwhile: B, killed, is restarted as any master that dies
            self.fail(f"{why}; the old master had exited")
            return
        dog.reinstate(a)
        self.fail(f"{why}; master {a.pid} goes on")

    def master_exited(self, code: int) -> bool:
        """The watchdog's master (B while it takes over) exited: True if that ends an attempt
        here (A is the master again), False for the watchdog's own handling."""
        if self.old is None or self.state not in (up.STARTING, up.HANDING_OVER):
            return False
        # During the hand-over A takes back what it gave when B's channel to it closes.
        when = "before it was ready" if self.state == up.STARTING else "during the hand-over"
        self.give_up(f"master B exited ({describe(code)}) {when}")
        return True

    def reaped(self, pid: int, status: int) -> bool:
        """A child reaped by the watchdog's reaper (waitpid(-1)): True if it was the check, whose
        Popen would take a child already reaped for a success, or master A."""
        if self._check is not None and pid == self._check.pid:
            self._check.returncode = os.waitstatus_to_exitcode(status)
            return True
        if self.old is None or pid != self.old.pid:
            return False
        self.old.returncode = os.waitstatus_to_exitcode(status)
        if self.old.stdout and not self.old.stdout.closed:
            self.old.stdout.close()
        log.info("upgrade: master %d (old) exited (%s)", pid, describe(self.old.returncode))
        self.old = None
        if self.state == up.HANDING_OVER:
            self.say(up.DONE, new=self.dog.master.pid if self.dog.master else None)
        return True

    def fds(self) -> list[int]:
        """Master A's pipe, while it hands over: for the watchdog's select."""
        old = self.old
        return [old.stdout.fileno()] if old and old.stdout and not old.stdout.closed else []

    def read_old(self, readable: list[int]) -> None:
        """A's lines: drained (A's status and heartbeats are not the service's any more)."""
        if not self.fds() or self.fds()[0] not in readable:
            return
        assert self.old is not None and self.old.stdout is not None
        try:
            chunk = os.read(self.old.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.old.stdout.close()

    def signal_old(self, sig: int) -> None:
        if self.old is not None and self.old.returncode is None:
            try:
                self.old.send_signal(sig)
            except ProcessLookupError:
                pass
