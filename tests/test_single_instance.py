"""One herder per state dir: a second `herder run` on a live herder's state dir exits 75
(EX_TEMPFAIL) and never takes its control socket; what a dead herder left behind (its lock
file, its socket) does not stop the next one."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from harness import living, reap_adopted, wait_for
from herder.common.exits import EX_TEMPFAIL


def answering_pid(state_dir: str) -> int | None:
    """The pid of the master answering on a state dir's control socket, if any."""
    from herder.supervisor.ctl import client

    try:
        return client.call(state_dir, {"cmd": "ping"})["pid"]
    except OSError:
        return None


def holds(proc: psutil.Process, path: Path) -> bool:
    return any(f.path == str(path) for f in proc.open_files())


@pytest.mark.slow
def test_a_second_herder_on_a_live_state_dir_exits_75_and_leaves_the_first_alone(herder, jobs):
    a = herder(workers="2")
    workers = a.wait_workers(2)
    master = a.master()
    assert master is not None
    state = Path(a.state_dir)
    sock_inode = (state / "herder.sock").stat().st_ino
    lock = state / "herder.pid"
    # The watchdog holds the lock for its life; the master and workers must not (a kill -9 of
    # the watchdog alone would otherwise leave the state dir locked by orphans).
    assert holds(psutil.Process(a.pid), lock)
    assert not any(holds(p, lock) for p in [master, *workers])

    started = time.monotonic()
    b = herder(workers="1", state_dir=a.state_dir)
    code = b.wait_exit(15)
    took = time.monotonic() - started
    assert code == EX_TEMPFAIL, b.log()
    assert took < 5, f"the second herder took {took:.1f} s to give up"
    assert a.state_dir in b.log() and f"pid {a.pid}" in b.log(), b.log()
    b.assert_nothing_left()

    assert a.proc is not None and a.proc.poll() is None
    assert (state / "herder.sock").stat().st_ino == sock_inode  # never taken over
    assert a.status()["master"]["pid"] == master.pid  # same master, still answering
    job = jobs.enqueue("record", "after")
    wait_for(lambda: jobs.finished("after") == [job.id], 15, what="a job on the first herder")
    a.stop_and_check()


@pytest.mark.slow
def test_after_kill_9_of_the_whole_tree_the_next_herder_starts(herder):
    a = herder(workers="2")
    tree = [psutil.Process(a.pid), *a.wait_workers(2)]
    master = a.master()
    assert master is not None
    for p in [*tree, master]:
        p.send_signal(signal.SIGKILL)
    a.wait_exit(10)
    wait_for(lambda: not any(living(p) for p in tree), 10)
    reap_adopted()
    state = Path(a.state_dir)
    assert (state / "herder.pid").exists() and (state / "herder.sock").exists()  # both stale now

    c = herder(workers="1", state_dir=a.state_dir)
    c.wait_workers(1)
    new_master = c.master()
    assert new_master is not None
    assert c.status()["master"]["pid"] == new_master.pid
    assert (state / "herder.pid").read_text().strip() == str(c.pid)
    c.stop_and_check()
    a.assert_nothing_left()


@pytest.mark.slow
def test_a_master_outliving_its_watchdog_keeps_its_socket_until_it_is_gone(herder, jobs):
    """kill -9 of the watchdog alone: its master drains (a long job finishes) while a new
    herder starts on the same state dir. The new master must not take the old one's live
    socket; it takes the path once nobody answers there any more."""
    a = herder(workers="1")
    a.wait_workers(1)
    old_master = a.master()
    assert old_master is not None
    job = jobs.enqueue("record", "long", 6)
    wait_for(lambda: jobs.started("long"), 10, what="the long job")
    os.kill(a.pid, signal.SIGKILL)
    a.wait_exit(10)

    c = herder(workers="1", state_dir=a.state_dir)
    # Nothing but its log shows that the new master has looked at the socket and left it
    # alone (it has no socket of its own yet): the line is the behaviour under test.
    c.wait_log(r"control socket \S+ is answered by another herder", timeout=20)
    assert c.status()["master"]["pid"] == old_master.pid  # the old master still answers
    new_master = wait_for(c.master, 10, what="the new master")
    # The old master unlinks its socket as it exits; the new one binds within a second.
    wait_for(lambda: answering_pid(c.state_dir) == new_master.pid, 20, what="the new master's socket")
    assert c.status()["master"]["pid"] == new_master.pid
    assert jobs.finished("long") == [job.id]
    c.stop_and_check()
    a.assert_nothing_left()


@pytest.mark.slow
def test_control_server_never_unlinks_a_socket_someone_answers_on(tmp_path: Path):
    from herder.supervisor.control.server import RECHECK, ControlServer

    path = tmp_path / "herder.sock"
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(str(path))
    squatter.listen(4)
    inode = path.stat().st_ino
    server = ControlServer(str(tmp_path), lambda: None, lambda body: {"ok": True, "pid": os.getpid()})
    try:
        server.start()
        # An absence over time: it looks again every RECHECK s; through more than one look,
        # it leaves the path alone while someone answers there.
        time.sleep(1.5 * RECHECK)
        assert path.stat().st_ino == inode  # still the squatter's
        squatter.close()  # gone, its file left behind: stale
        wait_for(lambda: answering_pid(str(tmp_path)) == os.getpid(), 5, what="the server to take the path")
    finally:
        squatter.close()
        server.close()
    assert not path.exists()


def test_control_server_replaces_a_stale_socket_at_once(tmp_path: Path):
    from herder.supervisor.control.server import ControlServer
    from herder.supervisor.ctl import client

    path = tmp_path / "herder.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # a socket file nobody listens on, as a kill -9 leaves it
    server = ControlServer(str(tmp_path), lambda: None, lambda body: {"ok": True, "pid": 1})
    try:
        server.start()
        assert client.call(str(tmp_path), {"cmd": "ping"}) == {"ok": True, "pid": 1}
    finally:
        server.close()


def _wakeups(thread: threading.Thread) -> int:
    """How often the thread has slept and woken (the kernel's voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))


def _asleep(thread: threading.Thread) -> int:
    """Its wake-ups, once it has gone back to sleep: the same count 0.1 s apart (at most 5 s)."""
    count, deadline = _wakeups(thread), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.1)
        count, before = _wakeups(thread), count
        if count == before:
            break
    return count


@pytest.mark.slow
def test_an_idle_control_server_sleeps_until_a_connection_or_its_close(tmp_path: Path):
    """An idle master's accepting thread does not wake on a timer (a poll every fraction of a
    second, times every master on a host); a connection, a yield or a close wakes it."""
    from herder.supervisor.control.server import ControlServer
    from herder.supervisor.ctl import client

    server = ControlServer(str(tmp_path), lambda: None, lambda body: {"ok": True, "pid": 1})
    server.start()
    try:
        assert client.call(str(tmp_path), {"cmd": "ping"}) == {"ok": True, "pid": 1}
        thread = server._thread
        assert thread is not None
        before = _asleep(thread)  # done with the ping (on a busy machine it may still be closing it)
        time.sleep(1.0)  # the window observed: a timed poll would wake it several times in it
        assert _wakeups(thread) - before <= 1
        assert client.call(str(tmp_path), {"cmd": "ping"}) == {"ok": True, "pid": 1}
    finally:
        server.close()
    thread.join(5)
    assert not thread.is_alive(), "the accepting thread outlived close()"
