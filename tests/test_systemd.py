"""herder under a service manager: sd_notify over a real datagram socket."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from harness import SHORT_TIMEOUT_FLAGS, wait_for


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


@pytest.mark.slow
def test_notify_ready_watchdog_stopping_in_order(herder, systemd, jobs):
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "1000000"}  # ping every 0.5 s
    h = herder(workers="2", env=env)
    h.wait_workers(2)
    wait_for(lambda: systemd.fields("READY=1"), 10, what="READY=1")
    wait_for(lambda: len(systemd.fields("WATCHDOG=1")) >= 3, 5, what="watchdog pings")
    assert any(f.startswith("STATUS=2/2 workers") for _, f in systemd.messages)
    # STATUS= goes out at most once a second, the newest text: a 1.5 s job is still running
    # when its "busy" text's turn comes, however soon after the last STATUS= it starts (a
    # shorter one could start and end between two turns, and nothing would change); then
    # the idle text waits for its turn and goes out although nothing changes any more.
    before = len(systemd.fields("STATUS="))
    jobs.enqueue("record", "blip", 1.5)
    wait_for(lambda: jobs.finished("blip"), 10, what="the job")
    idle = "STATUS=2/2 workers, 0 busy, 0 queued"
    wait_for(lambda: systemd.fields("STATUS=")[-1][1] == idle, 5, what="the newest status")
    statuses = systemd.fields("STATUS=")
    assert len(statuses) >= before + 2, statuses  # the job showed, then idle again
    sent = [t for t, _ in statuses]
    assert all(b - a > 0.9 for a, b in zip(sent, sent[1:], strict=False)), statuses
    h.stop_and_check()
    ready = systemd.fields("READY=1")[0][0]
    first_ping = systemd.fields("WATCHDOG=1")[0][0]
    stopping = systemd.fields("STOPPING=1")
    assert stopping, systemd.messages
    assert ready <= first_ping  # WATCHDOG=1 means healthy: not before the fleet is up
    assert systemd.fields("WATCHDOG=1")[2][0] < stopping[0][0]
    assert ready < stopping[0][0]


@pytest.mark.slow
def test_a_hung_master_stops_the_watchdog_pings(herder, systemd):
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "1000000"}
    h = herder(workers="1", env=env, master_heartbeat_timeout="60")
    h.wait_workers(1)
    wait_for(lambda: len(systemd.fields("WATCHDOG=1")) >= 2, 5, what="watchdog pings")
    master = h.master()
    assert master is not None
    os.kill(master.pid, signal.SIGSTOP)
    ping_every = 0.5  # WATCHDOG_USEC / 2
    ping_grace = 3 * float(SHORT_TIMEOUT_FLAGS["--heartbeat-interval"])  # the watchdog's, for a silent master
    # The pings stop once the master has been silent for the ping grace: no ping for a
    # while longer than two ping intervals.
    wait_for(
        lambda: time.monotonic() - systemd.fields("WATCHDOG=1")[-1][0] > 2 * ping_every,
        ping_grace + 5,
        what="the watchdog pings to stop",
    )
    before = len(systemd.fields("WATCHDOG=1"))
    # An absence over time: for another ping grace, not one ping for the hung master.
    time.sleep(ping_grace)
    assert len(systemd.fields("WATCHDOG=1")) == before, "pinged systemd for a hung master"
    os.kill(master.pid, signal.SIGCONT)
    wait_for(lambda: len(systemd.fields("WATCHDOG=1")) > before, 5, what="pings to resume")
    h.stop_and_check()


@pytest.mark.slow
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


@pytest.mark.slow
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


def queue_is_full(path: Path) -> bool:
    """Whether a datagram socket's queue is full, as a sender sees it (EAGAIN)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.sendto(b"STATUS=probe", socket.MSG_DONTWAIT, str(path))
        except BlockingIOError:
            return True
    return False


@pytest.mark.slow
def test_a_service_manager_that_never_reads_cannot_block_the_stop(herder, jobs, tmp_path: Path):
    """A NOTIFY_SOCKET nobody reads (a stalled service manager): its queue fills up (10
    datagrams on Linux) while every job changes the STATUS= line, yet SIGTERM still drains
    herder and it exits 0 within the stop timeout."""
    path = tmp_path / "deaf.sock"
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    deaf.bind(str(path))  # bound, never read
    try:
        env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"}
        h = herder(workers="2", env=env, stop_timeout="10")
        h.wait_workers(2)
        for _ in range(3000):  # short jobs, so the status changes all the time, up to the SIGTERM
            jobs.enqueue("record", "short", 0.01)
        wait_for(lambda: queue_is_full(path), 20, interval=0.2, what="the notify socket's queue to fill")
        # The fault's length: for 2 s more, pings and status changes keep coming at the full
        # queue (and must neither block herder nor be logged each time).
        time.sleep(2.0)
        assert jobs.queue.count > 0, "the stream of jobs ended before the SIGTERM"
        took = h.stop_and_check(timeout=20)
        assert took < 10, f"took {took:.1f} s to stop, past the stop timeout"
        assert len(jobs.finished("short")) > 50
        assert h.log().count("sd_notify: the queue of") == 1  # said once, not per message
        assert re.search(r"sd_notify: \d+ messages dropped", h.log())
    finally:
        deaf.close()


def fill(path: Path) -> int:
    """Fill a datagram socket's queue from outside; return how many datagrams it took."""
    n = 0
    while not queue_is_full(path):
        n += 1
    return n


def drain(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(65536, socket.MSG_DONTWAIT).decode())
        except BlockingIOError:
            return out


def test_a_full_queue_keeps_the_newest_important_message_and_never_blocks(tmp_path: Path):
    from herder.watchdog.notify import Notifier

    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(path))
        n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"})
        fill(path)
        started = time.monotonic()
        n.stopping()
        n.extend_timeout(15)
        n.extend_timeout(20)  # replaces the 15 s one that could not go out
        n.status("0/2 workers, stopping")
        n.flush(force=True)
        assert time.monotonic() - started < 0.5  # never blocked
        assert n.dropped == 1  # the replaced EXTEND_TIMEOUT; the STATUS waits behind the others
        drain(manager)  # the manager reads again
        n.flush(force=True)
        sent = drain(manager)
        assert sent == ["STOPPING=1", "EXTEND_TIMEOUT_USEC=20000000", "STATUS=0/2 workers, stopping"]


def test_status_goes_out_at_most_once_a_second_and_the_newest_wins(tmp_path: Path):
    from herder.watchdog import notify

    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(path))
        n = notify.Notifier({"NOTIFY_SOCKET": str(path)})
        n.status("1 busy")
        n.flush()
        for i in range(2, 50):  # a job state change each: none goes out within the second
            n.status(f"{i} busy")
            n.flush()
        assert drain(manager) == ["STATUS=1 busy"]
        n._status_at -= notify.STATUS_INTERVAL  # a second later
        n.flush()
        n.flush()
        assert drain(manager) == ["STATUS=49 busy"]  # the newest, once


def test_a_waiting_ping_is_forgotten_when_the_master_turns_unhealthy(tmp_path: Path):
    from herder.watchdog.notify import Notifier

    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(path))
        n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"})
        fill(path)
        n.ping_if_due(healthy=True)  # waits for room
        n.ping_if_due(healthy=False)  # the master hangs meanwhile
        drain(manager)
        n.flush()
        assert drain(manager) == []  # no WATCHDOG=1 for a hung master
