"""herder under a service manager: sd_notify over a real datagram socket, then under a real
systemd (PID 1 in a podman container, tests/podman.py), driven as docs/deploy/systemd.md
tells an operator to.

The container tests skip, saying why, where no container can run; with
HERDER_REQUIRE_CONTAINER=1 (.ci/run's container step) that is a failure instead.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness import SHORT_TIMEOUT_FLAGS, reap_adopted, wait_for
from podman import (
    REPO,
    Podman,
    Unusable,
    base_markers,
    herder_wheel,
    hybrid_cgroup2,
    remove_cgroup_tree,
    systemd_image,
    wheels_for,
)


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
    # The fleet's size goes out at the master's first pass that has it (the watchdog sends the
    # newest text once a second).
    wait_for(lambda: any(f.startswith("STATUS=2/2 workers") for _, f in systemd.messages), 3, what="2/2")
    # STATUS= goes out at most once a second, the newest text: a 2 s job is still running
    # when its "busy" text's turn comes, however soon after the last STATUS= it starts and
    # however late its `busy` is read (up to half a second in a quiet fleet, pipes.py); a
    # shorter one could start and end between two turns, and nothing would change. Then the
    # idle text waits for its turn and goes out although nothing changes any more.
    before = len(systemd.fields("STATUS="))
    jobs.enqueue("record", "blip", 2.0)
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
def test_a_replacement_master_is_vouched_for_while_its_workers_start(herder, systemd):
    """The master dies; the watchdog's replacement takes 3 s to have its workers up (a big
    app's imports): the pings go on meanwhile, since herder's watchdog owns the replacement
    and a restart by systemd would kill every running job and help nothing."""
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "1000000", "HERDER_TEST_SLOW_START": "3"}
    h = herder(workers="1", env=env, worker_init="herder_hooks:slow_start")
    h.wait_workers(1, timeout=30)
    wait_for(lambda: systemd.fields("READY=1"), 10, what="READY=1")
    master = h.master()
    assert master is not None
    os.kill(master.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: [t for t, _ in systemd.fields("READY=1") if t > killed_at], 30, what="READY=1 again")
    ready_again = next(t for t, _ in systemd.fields("READY=1") if t > killed_at)
    assert ready_again - killed_at > 2.5, "the replacement's workers started at once"
    pings = [killed_at] + [t for t, _ in systemd.fields("WATCHDOG=1") if killed_at < t < ready_again]
    gaps = [b - a for a, b in zip(pings, [*pings[1:], ready_again], strict=True)]
    assert max(gaps) < 1.5, f"no WATCHDOG=1 for {max(gaps):.1f} s while the replacement started"
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


# ---- herder under a real systemd, in a container -------------------------------------------

WATCHDOG_SEC = 10  # the test's WatchdogSec (a drop-in): systemd's restart comes in seconds, not 30
MASTER_TIMEOUT = 5  # master_heartbeat_timeout: a starved master is spared for up to 4 of these
PING_GRACE = 3  # the watchdog's: 3 x heartbeat_interval (1 s) of master silence
CONF = "/etc/herder/herder.toml"
# Debian's redis-server runs as a unit of its own on the same host, as an operator's would:
# the unit herder's install-service writes then orders itself after it (After=redis-server.service).
# Moved off Debian's default port (the suite keeps the shared one out of its tests, even in a
# container of its own).
REDIS_PORT = 16390
CONFIG = f"""[herder]
redis_url = "redis://127.0.0.1:{REDIS_PORT}/0"
path = ["/srv/app"]
stop_timeout = 30
master_heartbeat_timeout = {MASTER_TIMEOUT}
"""
ENQUEUE = """
import sys
from redis import Redis
from rq import Queue
queue = Queue("default", connection=Redis(port=int(sys.argv[3])))
job = queue.enqueue("herder_testjobs.record", sys.argv[1], float(sys.argv[2]))
print(job.id)
"""


class SystemdHost:
    """One container with systemd as PID 1, driven as an operator drives a host: podman exec."""

    def __init__(self, podman: Podman, name: str) -> None:
        self.podman, self.name = podman, name

    def run(self, *argv: str, check: bool = True, timeout: float = 60, input: str | None = None):
        interactive = ["-i"] if input is not None else []
        r = self.podman.run("exec", *interactive, self.name, *argv, check=False, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
            )
        return r

    def write(self, path: str, text: str) -> None:
        self.run("sh", "-c", 'cat > "$1"', "sh", path, input=text)

    def show(self, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", "herder", *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def last_ping(self) -> float:
        """When systemd last had WATCHDOG=1, on its monotonic clock (the host's), in seconds."""
        return int(self.show("WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]) / 1e6

    def status(self) -> dict[str, Any] | None:
        r = self.run("herder", "status", "--json", check=False)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def wait_running(self, not_master: int | None = None, timeout: float = 60) -> dict[str, Any]:
        """herder status: running, every worker up (and a master other than `not_master`)."""

        def running() -> dict[str, Any] | None:
            st = self.status()
            if st and st["running"] and st["actual"] == st["desired"] and st["master"]["pid"] != not_master:
                return st
            return None

        return wait_for(running, timeout, 0.5, what="herder running, all workers up")  # type: ignore[return-value]

    def journal(self) -> str:
        """herder's lines in the journal, each with systemd's monotonic time in seconds."""
        return self.run("journalctl", "-u", "herder", "-o", "short-monotonic", "--no-pager").stdout

    def enqueue(self, tag: str, seconds: float) -> str:
        argv = ("/opt/herder/bin/python", "-c", ENQUEUE, tag, str(seconds), str(REDIS_PORT))
        return self.run(*argv).stdout.strip()

    def redis(self, *args: str) -> str:
        return self.run("redis-cli", "-p", str(REDIS_PORT), "--raw", *args).stdout.strip()

    def host_pid(self, pid: int) -> int:
        """The host's pid of a process of the container."""
        rows = self.podman.run("top", self.name, "hpid", "pid").stdout.split("\n")[1:]
        return next(int(h) for h, p in (row.split() for row in rows if row.strip()) if int(p) == pid)


@pytest.fixture(scope="module")
def systemd_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdHost]:
    """A Debian host with systemd as PID 1, Debian's redis-server (its own unit), and herder
    installed from its wheel into /opt/herder, as docs/deploy/systemd.md installs it."""
    try:
        podman = Podman.find()
        image = systemd_image(podman)
    except Unusable as why:
        if os.environ.get("HERDER_REQUIRE_CONTAINER") == "1":
            pytest.fail(f"HERDER_REQUIRE_CONTAINER=1, but no container can run here: {why}")
        pytest.skip(str(why))
    wheels = wheels_for(base_markers(podman, image))
    dist = tmp_path_factory.mktemp("dist")
    wheel = herder_wheel(wheels, dist)
    name = f"herder-systemd-{uuid.uuid4().hex[:12]}"
    cgroup2 = hybrid_cgroup2()
    unified = ["-v", f"{cgroup2}:/sys/fs/cgroup/unified:rw"] if cgroup2 else []
    try:
        podman.run(
            "run", "-d", "--name", name, "--systemd=always", "--network", "none", *podman.ulimits(), *unified,
            "-v", f"{wheels}:/wheels:ro", "-v", f"{dist}:/dist:ro",
            "-v", f"{REPO / 'tests' / 'jobs'}:/srv/app:ro",
            image, "/sbin/init",
        )  # fmt: skip
        host = SystemdHost(podman, name)

        def booted() -> str:
            state = host.run("systemctl", "is-system-running", check=False).stdout.strip()
            return state if state in ("running", "degraded") else ""

        started = time.monotonic()
        state = wait_for(booted, 60, 0.25, what="systemd to finish booting")
        failed = host.run("systemctl", "--failed", "--no-legend").stdout
        assert state == "running", f"systemd is {state}: {failed}"
        print(f"systemd running {time.monotonic() - started:.1f} s after `podman run`")
        host.run("sed", "-i", f"s/^port .*/port {REDIS_PORT}/", "/etc/redis/redis.conf")
        host.run("systemctl", "restart", "redis-server")
        host.run("python3", "-m", "venv", "/opt/herder")
        pip = ["/opt/herder/bin/pip", "install", "-q", "--no-index", "--find-links", "/wheels"]
        host.run(*pip, f"/dist/{wheel.name}", timeout=300)
        yield host
    finally:
        podman.run("rm", "-f", "-t", "0", name, check=False, timeout=120)
        reap_adopted()  # podman's conmon, re-parented to this subreaper
        if cgroup2:
            remove_cgroup_tree(cgroup2)


@pytest.mark.slow
@pytest.mark.container
def test_install_service_with_run_flags_then_enable_and_a_bare_status(systemd_host: SystemdHost) -> None:
    """docs/deploy/systemd.md, steps 1 to 6, with run flags given to install-service."""
    h = systemd_host
    h.run("useradd", "--system", "--home-dir", "/var/lib/herder", "--shell", "/usr/sbin/nologin", "herder")
    h.run("ln", "-s", "/opt/herder/bin/herder", "/usr/local/bin/herder")
    h.run("install", "-d", "-m", "0755", "/etc/herder")
    h.run("install", "-m", "0600", "-o", "herder", "-g", "herder", "/dev/null", CONF)
    h.write(CONF, CONFIG)
    h.run("herder", "config", "--config", CONF)
    h.run("herder", "install-service", "systemd", "--user", "herder", "--config", CONF,
          "--workers", "3", "--queue", "high", "--queue", "default",
          "--output", "/etc/systemd/system/herder.service")  # fmt: skip
    # A shorter WatchdogSec, as `systemctl edit herder` would write it, so that its restart
    # comes within seconds here.
    h.run("install", "-d", "/etc/systemd/system/herder.service.d")
    h.write("/etc/systemd/system/herder.service.d/watchdog.conf", f"[Service]\nWatchdogSec={WATCHDOG_SEC}s\n")
    h.run("systemctl", "daemon-reload")
    h.run("systemctl", "enable", "--now", "herder", timeout=120)  # Type=notify: returns at READY=1
    shown = h.show("ActiveState", "SubState", "WatchdogUSec", "NRestarts", "After")
    assert (shown["ActiveState"], shown["SubState"]) == ("active", "running"), shown
    assert shown["WatchdogUSec"] == f"{WATCHDOG_SEC}s" and shown["NRestarts"] == "0", shown
    assert "redis-server.service" in shown["After"].split(), shown
    r = h.run("herder", "status", check=False)  # bare: it finds the service's state dir
    assert r.returncode == 0, r.stdout + r.stderr
    st = h.wait_running()
    assert st["master"]["pid"] and st["watchdog"]["pid"] == int(h.show("MainPID")["MainPID"])


@pytest.mark.slow
@pytest.mark.container
def test_the_run_flags_given_to_install_service_are_in_force(systemd_host: SystemdHost) -> None:
    r = systemd_host.run("herder", "status", check=False)
    st = systemd_host.wait_running()
    assert (st["desired"], st["settings"]["queues"]) == (3, ["high", "default"]), st["settings"]
    assert "workers: 3 of 3" in r.stdout and "queue high" in r.stdout, r.stdout


@pytest.mark.slow
@pytest.mark.container
def test_a_killed_master_is_replaced_by_herders_watchdog_not_by_systemd(systemd_host: SystemdHost) -> None:
    h = systemd_host
    st = h.wait_running()
    main = h.show("MainPID")["MainPID"]
    master, restarts = st["master"]["pid"], st["master_restarts"]
    h.run("kill", "-9", str(master))
    st = h.wait_running(not_master=master)
    assert st["master_restarts"] == restarts + 1
    shown = h.show("MainPID", "NRestarts", "ActiveState")
    assert shown == {"MainPID": main, "NRestarts": "0", "ActiveState": "active"}, shown
    log = h.journal()
    assert re.search(
        rf"herder-watchdog\[{main}\] WARNING master {master} exited unexpectedly \(killed by SIGKILL\)", log
    )
    assert re.search(rf"herder-watchdog\[{main}\] INFO master {st['master']['pid']} started", log)


@pytest.mark.slow
@pytest.mark.container
def test_a_hung_master_is_replaced_by_herders_watchdog_within_watchdogsec(systemd_host: SystemdHost) -> None:
    """Frozen (SIGSTOP: not waiting for a CPU), the master is killed and replaced at its
    deadline, master_heartbeat_timeout, which is below WatchdogSec / 2 + the ping grace: the
    pings resume as its replacement starts, and systemd restarts nothing."""
    h = systemd_host
    st = h.wait_running()
    main, master = h.show("MainPID")["MainPID"], st["master"]["pid"]
    assert MASTER_TIMEOUT < WATCHDOG_SEC / 2 + PING_GRACE
    h.run("kill", "-STOP", str(master))
    h.wait_running(not_master=master, timeout=MASTER_TIMEOUT + 30)
    killed = rf"master {master} silent for [\d.]+ s \(deadline {MASTER_TIMEOUT} s\): SIGKILL"
    (killed_at,) = [float(t) for t in re.findall(rf"^\[\s*([\d.]+)\].* {killed}", h.journal(), re.M)]
    # systemd was pinged after the kill: its timer runs from there, not from the freeze.
    wait_for(lambda: h.last_ping() > killed_at, WATCHDOG_SEC, 0.25, what="a ping after the kill")
    assert h.show("MainPID", "NRestarts") == {"MainPID": main, "NRestarts": "0"}


@pytest.mark.slow
@pytest.mark.container
def test_systemctl_reload_applies_the_edited_config(systemd_host: SystemdHost) -> None:
    h = systemd_host
    st = h.wait_running()
    main, master = h.show("MainPID")["MainPID"], st["master"]["pid"]
    assert st["settings"]["job_timeout"] != 120
    h.write(CONF, CONFIG + "job_timeout = 120\n")
    h.run("systemctl", "reload", "herder", timeout=120)  # returns once herder said READY=1 again
    st = h.wait_running()
    assert st["settings"]["job_timeout"] == 120, st["settings"]
    assert st["master"]["pid"] == master  # applied in place
    assert h.show("MainPID", "NRestarts") == {"MainPID": main, "NRestarts": "0"}


@pytest.mark.slow
@pytest.mark.container
def test_herder_upgrade_under_systemd_keeps_mainpid_and_counts_no_restart(systemd_host: SystemdHost) -> None:
    """docs/install.md's upgrade, under systemd: `herder upgrade`, then the documented signal
    (`systemctl kill -s USR1 --kill-whom=main`): each time a new master takes over beside the
    old one while a job runs, the watchdog re-execs in place (MainPID the same), NRestarts stays
    0, and the running job finishes once."""
    h = systemd_host
    st = h.wait_running()
    main, master = h.show("MainPID")["MainPID"], st["master"]["pid"]
    job = h.enqueue("upgrade-under-systemd", 2.0)
    wait_for(lambda: h.redis("LRANGE", "started:upgrade-under-systemd", "0", "-1"), 30, 0.2, what="the job")
    r = h.run("herder", "upgrade", check=False, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "upgraded: herder" in r.stdout, r.stdout
    st = h.wait_running(not_master=master)
    assert st["watchdog"]["pid"] == int(main) and st["handover"] is None, st
    assert h.show("MainPID", "NRestarts", "ActiveState") == {
        "MainPID": main,
        "NRestarts": "0",
        "ActiveState": "active",
    }
    assert h.redis("LRANGE", "finished:upgrade-under-systemd", "0", "-1").split() == [job]
    # The signal alone, as docs/cli.md gives it for systemd.
    master = st["master"]["pid"]
    h.run("systemctl", "kill", "-s", "USR1", "--kill-whom=main", "herder")
    st = h.wait_running(not_master=master, timeout=120)
    assert h.show("MainPID", "NRestarts", "ActiveState") == {
        "MainPID": main,
        "NRestarts": "0",
        "ActiveState": "active",
    }
    assert re.search(rf"herder-watchdog\[{main}\] INFO upgrade: master {master} \(old\) exited", h.journal())


@contextmanager
def cpu_starved(pid: int) -> Iterator[None]:
    """The host's process `pid` runnable but (nearly) never running: moved into a cpu cgroup of
    its own on the host (cgroup v1's cpu hierarchy, which the container's systemd does not
    see: the process stays in its unit), throttled to 1 ms a second, beside two CPU hogs at
    nice -20 that take that millisecond. The hogs cost the host 1 ms a second in all."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    found = [(c, path) for _, c, path in (line.split(":", 2) for line in lines) if "cpu" in c.split(",")]
    if not found or not Path("/sys/fs/cgroup", found[0][0]).is_dir() or os.geteuid() != 0:
        pytest.fail(
            "starving a process needs root and cgroup v1's cpu hierarchy on the host (cpu.cfs_quota_us)"
        )
    root = Path("/sys/fs/cgroup", found[0][0])
    home, starve = root / found[0][1].lstrip("/"), root / f"herder-test-starve-{uuid.uuid4().hex[:8]}"
    starve.mkdir()
    procs = str(starve / "cgroup.procs")
    hog = f"import os\nos.nice(-20)\nopen({procs!r}, 'w').write(str(os.getpid()))\nwhile True: pass"
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        (starve / "cpu.cfs_period_us").write_text("1000000")
        (starve / "cpu.cfs_quota_us").write_text("1000")
        hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2)]
        wait_for(
            lambda: len((starve / "cgroup.procs").read_text().split()) == 2, 10, what="the hogs in place"
        )
        (starve / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        try:
            (home / "cgroup.procs").write_text(str(pid))
        except OSError:  # gone
            pass
        for proc in hogs:
            proc.kill()
            proc.wait()
        wait_for(
            lambda: not (starve / "cgroup.procs").read_text().split(), 10, what="the starving cgroup empty"
        )
        starve.rmdir()


@pytest.mark.slow
@pytest.mark.container
def test_a_starved_master_is_spared_and_systemd_is_fed_until_herders_watchdog_replaces_it(
    systemd_host: SystemdHost,
) -> None:
    """docs/troubleshooting.md: a master runnable but getting no CPU is spared for up to 4
    master_heartbeat_timeouts, then replaced by herder's watchdog. Meanwhile the watchdog still
    feeds systemd's watchdog: WatchdogSec (shorter than the sparing) restarts nothing."""
    h = systemd_host
    st = h.wait_running()
    main, master = h.show("MainPID")["MainPID"], st["master"]["pid"]
    pings: list[float] = []
    killed = re.compile(rf"master {master} silent for [\d.]+ s \(deadline {MASTER_TIMEOUT} s\): SIGKILL")

    def replaced() -> bool:
        shown = h.show("MainPID", "NRestarts", "WatchdogTimestampMonotonic")
        assert (shown["MainPID"], shown["NRestarts"]) == (main, "0"), f"systemd stepped in: {shown}"
        pings.append(int(shown["WatchdogTimestampMonotonic"]) / 1e6)
        # The kill's own line: a killed master still throttled may take seconds to die, and the
        # watchdog then says again that it waits for a CPU, after the kill.
        return bool(killed.search(h.journal()))

    with cpu_starved(h.host_pid(master)):
        starved_at = time.monotonic()  # systemd's monotonic clock is the host's
        wait_for(lambda: f"master {master} silent for" in h.journal(), 2 * MASTER_TIMEOUT, 0.5,
                 what="the watchdog to say the master is starved")  # fmt: skip
        assert re.search(rf"master {master} silent for [\d.]+ s, but waiting for a CPU", h.journal())
        try:
            wait_for(
                replaced, 4 * MASTER_TIMEOUT + 10, 0.5, what="herder's watchdog to give the starved master up"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the journal's end:\n{h.journal()[-4000:]}") from None
        spared = time.monotonic() - starved_at
    assert spared >= 4 * MASTER_TIMEOUT - 1, spared
    # Fed all along: a ping long after systemd would have restarted herder had the pings
    # stopped at the master's silence (PING_GRACE, then WatchdogSec).
    assert max(pings) - starved_at > PING_GRACE + WATCHDOG_SEC / 2, (pings, starved_at)
    h.wait_running(not_master=master)
    assert h.show("MainPID", "NRestarts") == {"MainPID": main, "NRestarts": "0"}


@pytest.mark.slow
@pytest.mark.container
def test_a_stopped_watchdog_is_restarted_by_systemds_watchdogsec_and_only_then(
    systemd_host: SystemdHost,
) -> None:
    h = systemd_host
    h.wait_running()
    main = h.show("MainPID")["MainPID"]
    h.run("kill", "-STOP", main)
    stopped_at = time.monotonic()  # systemd's monotonic clock is the host's

    # The last ping, once systemd has read any that was on its way; the restart is due
    # WatchdogSec after it. A job that starts shortly before is still running then.
    wait_for(lambda: time.monotonic() - stopped_at > 0.5, 1, what="a ping on its way to arrive")
    last_ping = h.show("WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]  # µs
    due = int(last_ping) / 1e6 + WATCHDOG_SEC
    wait_for(lambda: time.monotonic() > due - 3, WATCHDOG_SEC, 0.1, what="3 s before the restart is due")
    tag = uuid.uuid4().hex
    job = h.enqueue(tag, 5)

    def restarted() -> bool:
        shown = h.show("NRestarts", "WatchdogTimestampMonotonic")
        if shown["NRestarts"] == "0":
            # 0 once systemd is stopping it
            assert shown["WatchdogTimestampMonotonic"] in (last_ping, "0"), "pinged while stopped"
            return False
        return True

    wait_for(restarted, WATCHDOG_SEC + 20, 0.2, what="systemd to restart herder")
    assert h.redis("LRANGE", f"started:{tag}", "0", "-1") == job  # it ran when the restart came
    # systemd's own account: the timeout came WatchdogSec after the last ping, not sooner.
    (when,) = [float(t) for t in re.findall(r"^\[\s*([\d.]+)\].*Watchdog timeout", h.journal(), re.M)]
    assert due - 0.1 <= when <= due + 1, (when, due)
    assert when - stopped_at >= WATCHDOG_SEC / 2 - 0.5, (when, stopped_at)  # pings every WatchdogSec / 2
    st = h.wait_running()
    shown = h.show("MainPID", "NRestarts", "Result")
    assert shown["NRestarts"] == "1" and shown["MainPID"] != main, shown
    assert st["watchdog"]["pid"] == int(shown["MainPID"])
    # Every process of the service was SIGKILLed, its job too: the new herder requeues it (its
    # worker's lease is gone), and it runs to its end.
    assert re.search(r"Killing process \d+ \(herder-worker\) with signal SIGKILL", h.journal())
    wait_for(lambda: h.redis("HGET", f"rq:job:{job}", "status") == "finished", 60, 0.5, what="the job rerun")
    assert h.redis("LRANGE", f"started:{tag}", "0", "-1").split() == [job, job]
    assert h.redis("LRANGE", f"finished:{tag}", "0", "-1") == job


@pytest.mark.slow
@pytest.mark.container
def test_systemctl_stop_lets_the_running_job_finish_and_leaves_nothing(systemd_host: SystemdHost) -> None:
    h = systemd_host
    h.wait_running()
    cgroup = h.show("ControlGroup")["ControlGroup"]
    tag = uuid.uuid4().hex
    job = h.enqueue(tag, 4)
    wait_for(lambda: h.redis("LRANGE", f"started:{tag}", "0", "-1") == job, 30, 0.25, what="the job to start")
    stopping = time.monotonic()
    h.run("systemctl", "stop", "herder", timeout=120)
    took = time.monotonic() - stopping
    # The job ran to its end before `systemctl stop` returned.
    assert h.redis("LRANGE", f"finished:{tag}", "0", "-1") == job
    assert h.redis("HGET", f"rq:job:{job}", "status") == "finished"
    shown = h.show("ActiveState", "Result", "ControlGroup")
    assert (shown["ActiveState"], shown["Result"]) == ("inactive", "success"), shown
    # Nothing left in the unit's cgroup (systemd removes it once empty), nor anywhere.
    for hierarchy in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        path = f"{hierarchy}{cgroup}/cgroup.procs"
        procs = h.run("sh", "-c", 'cat "$1" 2>/dev/null || true', "sh", path).stdout
        assert procs.split() == [], (hierarchy, procs)
    left = [line for line in h.run("ps", "-eo", "pid,args").stdout.splitlines() if "herder" in line]
    assert left == [], left
    print(f"systemctl stop took {took:.1f} s with a job of 4 s running")


@pytest.mark.slow
@pytest.mark.container
def test_herders_lines_are_in_the_journal(systemd_host: SystemdHost) -> None:
    log = h_log = systemd_host.journal()
    assert re.search(r"herder-watchdog\[\d+\] INFO master \d+ started", log), h_log[-2000:]
    assert re.search(r"herder\[\d+\] INFO all \d+ workers ready", log)
    assert re.search(r"herder\[\d+\] INFO slot \d+ pid \d+: starting -> idle", log)
    assert "Watchdog timeout" in log and "herder.service: Scheduled restart job" in log
