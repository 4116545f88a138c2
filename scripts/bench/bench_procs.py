"""The processes the bench starts: the subreaper, the open files limit they inherit, the private
redis-server, and ending them all.

Every process it starts (Redis, the pools and whatever they spawn) is ended in `finally`,
on Ctrl-C and on error as well: the bench makes itself a child subreaper, so even workers
orphaned by a dying pool stay its descendants and are found.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import psutil
import redis
from redis import Redis

from bench_base import BenchError, Interrupted, say

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of our children (workers of a master that died) get re-parented to us."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def take_charge() -> None:
    """For a scenario's whole run: SIGTERM and SIGHUP unwind as Ctrl-C does (through every
    `finally`, so whatever it started is ended), and this process becomes the subreaper of
    everything it starts."""

    def on_signal(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    if not become_subreaper():
        say("warning: could not become a child subreaper; orphaned workers may escape the cleanup")


def child_pids(pid: int) -> set[int]:
    """The pids of `pid`'s children, from /proc/PID/task/*/children: one small read per thread,
    where psutil's children() reads the status of every process on the machine (some ms,
    more under load). Falls back to psutil where the kernel lacks those files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tasks = []
    found: set[int] = set()
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return {p.pid for p in psutil.Process(pid).children()}  # no such file: an older kernel
        except OSError:
            continue
    if not tasks:
        return {p.pid for p in psutil.Process(pid).children()}  # raises NoSuchProcess if it is gone
    return found


def raise_open_files(workers: int) -> str | None:
    """Raise our soft limit on open files (inherited by Redis and every pool) to what pools of
    `workers` need, within the hard limit: a master holds pipes to each worker, and Redis a
    connection or more per worker. Returns what it did, or None if the limit was enough."""
    need = 1024 + 16 * workers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if new <= soft:
        return f"{soft} (hard limit {hard}); pools of {workers} may want {need}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return f"raised from {soft} to {new} for pools of up to {workers} workers"


def child_env() -> dict[str, str]:
    """Our environment minus herder's and RQ's settings, so nothing leaks into a contender."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("HERDER_", "RQ_"))}


class Processes:
    """Every process the bench starts, and the means to end them all."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or child_env(),
                close_fds=True,
                # Its own session: a Ctrl-C at the terminal reaches only the bench, which
                # then ends everything itself, in order.
                start_new_session=True,
            )
        self.popens.append(popen)
        return popen

    def stop(self, popen: subprocess.Popen[bytes], timeout: float, spare: Iterable[int] = ()) -> int | None:
        """SIGTERM (every contender's graceful stop), up to `timeout` s for `popen` to exit, then
        SIGKILL whatever of ours is left but `spare`. Returns its exit code (None: killed)."""
        if popen.poll() is None:
            with contextlib.suppress(OSError):
                popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=timeout)
        code = popen.poll()
        self.kill_all(spare=set(spare))
        return code

    def kill_all(self, spare: set[int], extra: Iterable[psutil.Process] = ()) -> int:
        """SIGKILL every descendant of ours (adopted orphans included, as we are a subreaper)
        and its process group, plus `extra`, except the processes in `spare`. Returns how
        many live processes it hit. Exited children are only known by their unreaped pid or
        as psutil objects, so a recycled pid is never signalled."""
        procs: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            for q in psutil.Process().children(recursive=True):
                procs.setdefault(q.pid, q)
        for q in extra:
            with contextlib.suppress(psutil.Error):
                if q.is_running():
                    procs.setdefault(q.pid, q)
                    for k in q.children(recursive=True):
                        procs.setdefault(k.pid, k)
        for pid in spare:
            procs.pop(pid, None)
        spare_groups = set()
        for pid in spare:
            with contextlib.suppress(OSError):
                spare_groups.add(os.getpgid(pid))
        alive = []
        for p in procs.values():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        groups = set()
        for p in alive:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(p.pid))
        for g in groups - spare_groups - {os.getpgrp(), 0, 1}:
            with contextlib.suppress(OSError):
                os.killpg(g, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()  # psutil refuses if the pid was reused by another process
        psutil.wait_procs(alive, timeout=5)
        self.reap(spare)
        return len(alive)

    def reap(self, spare: set[int]) -> None:
        for popen in self.popens:
            if popen.pid not in spare:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=1)
        tracked = {p.pid for p in self.popens}
        for child in psutil.Process().children():
            if child.pid not in tracked and child.pid not in spare:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(child.pid, os.WNOHANG)  # an adopted orphan's zombie


class RedisServer:
    def __init__(self, binary: str, workdir: Path, procs: Processes) -> None:
        self.binary = binary
        self.workdir = workdir
        self.procs = procs
        self.popen: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else -1

    @staticmethod
    def free_port() -> int:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port != 6379:
                return port

    def start(self) -> Redis:
        for _attempt in range(5):
            self.port = self.free_port()
            argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            argv += ["--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"]
            self.popen = self.procs.start(argv, self.workdir / "redis-server.log")
            conn = Redis(host="127.0.0.1", port=self.port, db=0)
            deadline = time.monotonic() + 10
            while self.popen.poll() is None and time.monotonic() < deadline:
                try:
                    conn.ping()
                    return conn
                except redis.ConnectionError:
                    time.sleep(0.02)
            self.stop()  # lost the port to someone else, or too slow: try another
        raise BenchError(f"could not start {self.binary}; see {self.workdir / 'redis-server.log'}")

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()  # redis saves nothing: `--save ''` and no AOF
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


def start_redis(workdir: Path, procs: Processes, binary: str = "redis-server") -> tuple[RedisServer, Redis]:
    """A private redis-server in `workdir` (made if need be), and a connection to it."""
    workdir.mkdir(parents=True, exist_ok=True)
    server = RedisServer(binary, workdir, procs)
    return server, server.start()


def end_all(procs: Processes, server: RedisServer | None) -> None:
    """The last cleanup: every leftover process but Redis, then Redis, then anything still around."""
    hit = procs.kill_all(spare={server.pid} if server else set())
    if hit:
        say(f"cleanup: killed {hit} leftover process(es)")
    if server:
        server.stop()
    procs.kill_all(spare=set())
