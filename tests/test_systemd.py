"""herder under a service manager: sd_notify over a real datagram socket."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import wait_for


class FakeSystemd:
    """A NOTIFY_SOCKET that records every datagram, as systemd would receive them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            for field in data.decode().split("\n"):
                self.messages.append((time.monotonic(), field))

    def fields(self, prefix: str) -> list[tuple[float, str]]:
        return [(t, f) for t, f in self.messages if f.startswith(prefix)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def systemd(tmp_path: Path):
    fake = FakeSystemd(tmp_path / "notify.sock")
    yield fake
    fake.close()


def test_notify_ready_watchdog_stopping_in_order(herder, systemd):
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "1000000"}  # ping every 0.5 s
    h = herder(workers="2", env=env)
    h.wait_workers(2)
    wait_for(lambda: systemd.fields("READY=1"), 10, what="READY=1")
    wait_for(lambda: len(systemd.fields("WATCHDOG=1")) >= 3, 5, what="watchdog pings")
    assert any(f.startswith("STATUS=2/2 workers") for _, f in systemd.messages)
    h.stop_and_check()
    ready = systemd.fields("READY=1")[0][0]
    first_ping = systemd.fields("WATCHDOG=1")[0][0]
    stopping = systemd.fields("STOPPING=1")
    assert stopping, systemd.messages
    assert ready <= first_ping  # WATCHDOG=1 means healthy: not before the fleet is up
    assert systemd.fields("WATCHDOG=1")[2][0] < stopping[0][0]
    assert ready < stopping[0][0]


def test_a_hung_master_stops_the_watchdog_pings(herder, systemd):
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "1000000"}
    h = herder(workers="1", env=env, master_heartbeat_timeout="60")
    h.wait_workers(1)
    wait_for(lambda: len(systemd.fields("WATCHDOG=1")) >= 2, 5, what="watchdog pings")
    master = h.master()
    assert master is not None
    os.kill(master.pid, signal.SIGSTOP)
    time.sleep(4.0)  # past the ping grace (3 heartbeat intervals)
    before = len(systemd.fields("WATCHDOG=1"))
    time.sleep(3.0)
    assert len(systemd.fields("WATCHDOG=1")) == before, "pinged systemd for a hung master"
    os.kill(master.pid, signal.SIGCONT)
    wait_for(lambda: len(systemd.fields("WATCHDOG=1")) > before, 5, what="pings to resume")
    h.stop_and_check()


def test_reload_sends_reloading_then_ready(herder, systemd, tmp_path: Path):
    conf = tmp_path / "h.toml"
    conf.write_text("[herder]\nworkers = 1\n")
    h = herder(workers=None, config=str(conf), env={"NOTIFY_SOCKET": str(systemd.path)})
    h.wait_workers(1)
    wait_for(lambda: systemd.fields("READY=1"), 10, what="READY=1")
    conf.write_text("[herder]\nworkers = 2\n")
    h.signal(signal.SIGHUP)
    wait_for(lambda: systemd.fields("RELOADING=1"), 10, what="RELOADING=1")
    reloading_at = systemd.fields("RELOADING=1")[0][0]
    assert systemd.fields("MONOTONIC_USEC=")
    wait_for(
        lambda: [t for t, _ in systemd.fields("READY=1") if t >= reloading_at], 10, what="READY after reload"
    )
    h.stop_and_check()


def test_long_drain_extends_the_stop_timeout(herder, systemd, jobs):
    h = herder(workers="1", env={"NOTIFY_SOCKET": str(systemd.path)}, stop_timeout="30")
    h.wait_workers(1)
    job = jobs.enqueue("record", "long", 6)
    wait_for(lambda: jobs.started("long"), 10, what="the long job")
    h.stop_and_check()
    assert jobs.finished("long") == [job.id]
    assert len(systemd.fields("EXTEND_TIMEOUT_USEC=")) >= 1


def test_notify_reaches_an_abstract_namespace_socket():
    from herder.watchdog.notify import Notifier

    name = f"herder-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)  # NOTIFY_SOCKET=@name: Linux's abstract namespace
    sock.settimeout(2)
    try:
        Notifier({"NOTIFY_SOCKET": "@" + name}).ready("2/2 workers")
        assert sock.recv(1024).decode().split("\n") == ["READY=1", "STATUS=2/2 workers"]
    finally:
        sock.close()
    assert Notifier({}).address is None  # no NOTIFY_SOCKET: silent


def test_watchdog_usec_for_another_pid_is_ignored():
    from herder.watchdog.notify import Notifier

    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000"}).watchdog_interval == 1.0
    assert (
        Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}).watchdog_interval
        is None
    )
