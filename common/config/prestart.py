"""The master's interpreter, started by `herder run` before it loads click (the launch's
critical path), and handed to the watchdog through the exec.

`herder run` spends its first ~200 ms on click and the configuration, and only then execs the
watchdog, which starts the master (watchdog/early.py): the master's interpreter and its
imports (rq and redis) came after all of it. Started first instead (`begin`, from
herder.supervisor.ctl.prestart), the master loads while `herder run` resolves and validates,
and runs nothing until it is handed the result: it reads its environment and configuration
from a pipe (`hand_over`), and exits at once on that pipe's end of file. So a configuration
that is refused (exit 78, the key named), a held state dir (exit 75), a usage error or any
other exit of `herder run` ends it before anything of herder has started (`dismiss`, at
exit); the watchdog then adopts the one handed over (`adopt`), as it adopts an early master.

Only the plain case starts early: Linux, no user to run as (a master that drops to another
user is started by the watchdog), and a Redis URL that looks given (an embedded Redis must run
first). A prestarted master that turns out to need either is dismissed before the exec.
Standard library only (the watchdog imports it), and light: it runs before anything else of
`herder run`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

ENV_GO_FD = "HERDER_PRESTART_FD"  # in the prestarted master: the pipe its hand-over comes on
ENV_EARLY_MASTER = "HERDER_EARLY_MASTER"  # in the watchdog: "PID,FD" of the master and its stdout
TOKEN_ENV = "HERDER_HTTP_TOKEN"  # the dashboard's token (herder.supervisor.control.http_auth.ENV_TOKEN)
# What `herder run` keeps out of the environment of everything it starts, the prestarted master
# included (what /proc shows of it for its life): the variables of
# herder.common.config.SECRET_KEYS and the dashboard's token, which go in the config instead
# (tests/test_prestart.py holds this to those).
SECRET_ENV = frozenset({"HERDER_REDIS_URL", "HERDER_ON_EVENT_URL", TOKEN_ENV})
# Where a Redis URL can come from without an embedded Redis: the flag, its variable, a file.
URL_FLAGS = ("--redis-url", "--config")
URL_ENV = ("HERDER_REDIS_URL", "HERDER_CONFIG")


class Prestarted:
    """A master's interpreter `herder run` started, loading, waiting for its hand-over."""

    def __init__(self, pid: int, go: int, stdout: int) -> None:
        self.pid = pid
        self.go = go  # our end of the pipe it waits on
        self.stdout = stdout  # the read end of its stdout: the watchdog's line from it
        self.done = False

    def hand_over(self, env: dict[str, str]) -> dict[str, str]:
        """Start it: `env` is its whole environment, its config under ENV_RESOLVED
        (herder.common.handover.accept takes it into memory). Returns what the watchdog's
        environment needs to adopt it (its stdout's read end is inheritable for the exec), or
        nothing if it is gone (it died loading): the watchdog then starts the master itself."""
        import json

        view = memoryview(json.dumps({"env": env}).encode())
        try:
            while view:
                view = view[os.write(self.go, view) :]
        except OSError:
            self.dismiss()
            return {}
        os.close(self.go)
        self.done = True
        os.set_inheritable(self.stdout, True)
        return {ENV_EARLY_MASTER: f"{self.pid},{self.stdout}"}

    def dismiss(self) -> None:
        """End it and reap it (`herder run` exits, or the watchdog's loop must start the master)."""
        if self.done:
            return
        self.done = True
        os.close(self.go)
        os.close(self.stdout)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


_started: list[Prestarted] = []


def wanted(argv: list[str], env: Mapping[str, str]) -> bool:
    """Whether this is `herder run` in the plain case (see the module's docstring)."""
    if len(argv) < 2 or argv[1] != "run" or os.path.basename(argv[0]) != "herder":
        return False
    args = argv[2:]
    if sys.platform != "linux" or "-h" in args or "--help" in args:
        return False
    if os.geteuid() == 0 and (flagged(args, ("--user",)) or env.get("HERDER_USER")):
        return False
    return flagged(args, URL_FLAGS) or any(env.get(k) for k in URL_ENV)


def flagged(args: list[str], flags: tuple[str, ...]) -> bool:
    return any(a in flags or a.startswith(tuple(f + "=" for f in flags)) for a in args)


def begin(argv: list[str]) -> Prestarted | None:
    """`herder run`'s first act: the master's interpreter, started (None if not wanted or it
    cannot start: the watchdog then starts the master as before)."""
    if _started or not wanted(argv, os.environ):
        return None
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return None  # no /proc to find strays by: the watchdog starts the master, as before
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    env[ENV_GO_FD] = str(go_r)  # last: the master drops it (supervisor/__main__.py says why)
    actions: list[tuple] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
    ]
    # Only stdin, stdout, stderr and its pipe go through (as Popen's close_fds would have it).
    mine = {go_r, go_w, out_r, out_w}
    for fd in open_fds:
        if fd > 2 and fd not in mine:
            try:
                if os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:
                pass  # the listing's own descriptor, closed by now
    os.set_inheritable(go_r, True)
    try:
        # Its own process group, as the watchdog's masters: a Ctrl-C at the terminal reaches
        # only `herder run` (and then the watchdog, which forwards it once).
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-P", "-m", "herder.supervisor"],
            env,
            file_actions=actions,
            setpgroup=0,
        )
    except OSError:
        for fd in mine:
            os.close(fd)
        return None
    os.close(go_r)
    os.close(out_w)
    started = Prestarted(pid, go_w, out_r)
    _started.append(started)
    import atexit

    atexit.register(started.dismiss)  # any exit before the hand-over: it goes too
    return started


def taken() -> Prestarted | None:
    """The master `begin` started in this process and not yet handed over or dismissed."""
    return _started[0] if _started and not _started[0].done else None


class Adopted:
    """A master the watchdog did not start (`herder run` did, before its exec), as much of
    subprocess.Popen as the watchdog uses: the watchdog reaps it itself (Watchdog.reap)."""

    def __init__(self, pid: int, stdout: int) -> None:
        self.pid = pid
        self.stdout = open(stdout, "rb", buffering=0)  # noqa: SIM115 - the watchdog closes it
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = -1
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # unreaped, so the pid is still this master's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def adopt() -> Adopted | None:
    """In the watchdog: the master `herder run` started and handed over, or None."""
    text = os.environ.pop(ENV_EARLY_MASTER, "")
    if not text:
        return None
    pid, fd = (int(x) for x in text.split(","))
    os.set_inheritable(fd, False)  # the watchdog's later children do not get it
    return Adopted(pid, fd)
