"""herder's private Redis, for when no Redis URL is configured.

Owned by the watchdog, so a master restart does not lose the queue: a redis-server on a
Unix socket in the state dir (no TCP port), append-only persistence in the same
directory so queued jobs survive a restart of herder, started before the master and
stopped after it. Standard library only (the watchdog's rule); PING is spoken by hand.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from herder.common import processes

log = logging.getLogger("herder.watchdog")

SOCKET_NAME = "redis.sock"
INSTALL_HINT = (
    "herder needs a Redis: pass --redis-url (or HERDER_REDIS_URL), or install redis-server so herder can "
    "run a private one (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"
)


def socket_path(state_dir: str) -> str:
    return os.path.join(state_dir, SOCKET_NAME)


def url_for(state_dir: str) -> str:
    return f"unix://{socket_path(state_dir)}?db=0"


def ping(path: str, timeout: float = 1.0) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedRedis:
    def __init__(self, state_dir: str, executable: str | None = None) -> None:
        self.state_dir = state_dir
        self.data_dir = os.path.join(state_dir, "redis")
        self.socket = socket_path(state_dir)
        self.pidfile = os.path.join(self.data_dir, "redis.pid")
        self.executable = executable or shutil.which("redis-server")
        self.proc: subprocess.Popen[bytes] | None = None
        self.adopted_pid: int | None = None
        self.run_as = None  # set by the watchdog when root starts herder with --user

    def argv(self) -> list[str]:
        assert self.executable
        return [
            self.executable,
            "--port",
            "0",  # no TCP: only the Unix socket, inside the 0700 state dir
            "--unixsocket",
            self.socket,
            "--unixsocketperm",
            "700",
            "--dir",
            self.data_dir,
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--pidfile",
            self.pidfile,
            "--logfile",
            os.path.join(self.data_dir, "redis.log"),
        ]

    def start(self, timeout: float = 15.0) -> None:
        if self.executable is None:
            raise FileNotFoundError(INSTALL_HINT)
        Path(self.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.run_as:
            os.chown(self.data_dir, self.run_as.uid, self.run_as.gid)
        if ping(self.socket):
            # A previous watchdog died and left its Redis running: keep using it.
            self.adopted_pid = self._read_pid()
            log.info(
                "embedded redis already running at %s (pid %s): adopting it", self.socket, self.adopted_pid
            )
            return
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
            process_group=0,
            **(self.run_as.popen_kwargs() if self.run_as else {}),
        )
        deadline = time.monotonic() + timeout
        while not ping(self.socket):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.proc.returncode}; see {self.data_dir}/redis.log"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"redis-server did not answer within {timeout:g} s; see {self.data_dir}/redis.log"
                )
            time.sleep(0.05)
        log.info(
            "embedded redis %d at %s (append-only file in %s)", self.proc.pid, self.socket, self.data_dir
        )

    def _read_pid(self) -> int | None:
        try:
            return int(Path(self.pidfile).read_text().strip())
        except (OSError, ValueError):
            return None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else self.adopted_pid

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM: Redis flushes its append-only file and exits."""
        pid = self.pid
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None:
                if self.proc.poll() is not None:
                    break
            elif not processes.exists(pid):
                break
            time.sleep(0.05)
        else:
            log.error("embedded redis %d did not stop within %g s: SIGKILL", pid, timeout)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.info("embedded redis %d stopped", pid)
