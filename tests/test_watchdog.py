"""The watchdog: hung masters, crash-looping masters, and hurried stops."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from harness import living, wait_for
from herder.supervisor.events import DUPLICATE_SIGNAL_WINDOW

pytestmark = pytest.mark.slow


def test_hung_master_is_replaced_after_its_heartbeat_deadline(herder, jobs):
    h = herder(workers="2", master_heartbeat_timeout="3")
    h.wait_workers(2)
    master = h.master()
    assert master is not None
    old_workers = h.workers(master)
    os.kill(master.pid, signal.SIGSTOP)  # alive, but its loop is silent
    new_master = wait_for(lambda: (m := h.master()) and m.pid != master.pid and m, 10, what="a new master")
    assert re.search(rf"master {master.pid} silent for [\d.]+ s \(deadline 3 s\): SIGKILL", h.log())
    h.wait_workers(2)  # a new fleet
    assert {w.pid for w in h.workers(new_master)} == {w.pid for w in h.workers()}
    # The old workers noticed their master died and left by themselves.
    wait_for(
        lambda: not any(living(w) for w in old_workers),
        10,
        what="old workers to exit",
    )
    job = jobs.enqueue("record", "after")
    wait_for(lambda: jobs.finished("after") == [job.id], 10, what="the new fleet to work")
    h.stop_and_check()


def test_watchdog_gives_up_past_the_restart_intensity_cap(herder):
    h = herder(workers="1", max_restarts="2", restart_window="60")
    for _ in range(3):
        master = wait_for(h.master, 10, what="a master")
        h.wait_status(lambda s, m=master: s["master"]["pid"] == m.pid and s["running"], what="it to run")
        master.kill()
        wait_for(
            lambda m=master: (cur := h.master()) is None or cur.pid != m.pid, 10, what="the master to die"
        )
    # Third death within the window: the watchdog exits non-zero for systemd to handle.
    h.stop_and_check(None, timeout=20, expect=1)
    assert "2 restarts within 60 s already: giving up" in h.log()


def test_second_sigint_hurries_and_requeues_the_running_job(herder, jobs):
    h = herder(workers="1", stop_timeout="60")
    h.wait_workers(1)
    job = jobs.enqueue("record", "t", 30)
    wait_for(lambda: jobs.started("t"), 10, what="the long job to start")
    h.signal(signal.SIGINT)
    h.wait_status(lambda s: s["stopping"], 10, what="the master stopping")
    # The person's pace, not a wait for a state: a second SIGINT within the duplicate window
    # would be taken as the same Ctrl-C delivered twice.
    time.sleep(DUPLICATE_SIGNAL_WINDOW + 0.2)
    took = h.stop_and_check(signal.SIGINT, timeout=15)
    assert took < 10  # did not wait for the 30 s job
    assert "second SIGINT: stopping now" in h.log()
    # Interrupted, not lost: back at the front of its queue for the next start.
    assert jobs.status(job.id) == "queued"
    assert jobs.queue.job_ids[0] == job.id
    (summary,) = h.master_summaries()
    assert (summary["killed"], summary["requeued"]) == (1, 1)


def test_one_ctrl_c_delivered_twice_still_drains_gracefully(herder, jobs):
    h = herder(workers="1")
    h.wait_workers(1)
    job = jobs.enqueue("record", "dup", 2)
    wait_for(lambda: jobs.started("dup"), 10, what="the job to start")
    # As `timeout` or a shell may do: to the process and to its group, at once.
    os.kill(h.pid, signal.SIGINT)
    os.killpg(h.pid, signal.SIGINT)
    h.stop_and_check(None, timeout=20)
    assert jobs.finished("dup") == [job.id]  # finished, not interrupted
    # (the two may also merge into one pending signal; either way, no hurry)
    assert "stopping now" not in h.log()
    (summary,) = h.master_summaries()
    assert (summary["killed"], summary["requeued"], summary["jobs_ok"]) == (0, 0, 1)


def test_sigterm_while_master_is_in_restart_backoff_exits_cleanly(herder):
    h = herder(workers="1")
    master = wait_for(h.master, 10, what="a master")
    h.wait_status(lambda s: s["master"]["pid"] == master.pid and s["running"], what="the master to run")
    master.kill()
    # The backoff leaves no master and so no status: the watchdog's line is the only sign of it.
    h.wait_log(r"restarting it in")
    assert h.stop_and_check(timeout=20) < 20  # seconds from SIGTERM to a clean exit


def test_master_drains_when_its_watchdog_is_killed(herder, jobs):
    h = herder(workers="2")
    h.wait_workers(2)
    job = jobs.enqueue("record", "t", 2)
    wait_for(lambda: jobs.started("t"), 10, what="the job to start")
    master = h.master()
    assert master is not None
    os.kill(h.pid, signal.SIGKILL)
    h.wait_exit(5)
    # No unsupervised fleet: the master notices, lets the job finish, and exits.
    h.wait_status(lambda s: s["stopping"], 10, what="the master to stop")
    assert re.search(r"the watchdog is gone .*: stopping", h.log())
    wait_for(lambda: jobs.finished("t") == [job.id], 10, what="the running job to finish")
    h.assert_nothing_left()
    (summary,) = h.master_summaries()  # its last words, once its workers were done
    assert (summary["pid"], summary["killed"], summary["jobs_ok"]) == (master.pid, 0, 1)


def blocked_signals(pid: int) -> set[int]:
    """The signals `pid` blocks (its SigBlk mask, from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {sig for sig in range(1, 65) if mask & (1 << (sig - 1))}


def test_the_master_starts_before_the_watchdog_loads_and_takes_every_stop_signal(herder, jobs):
    """The watchdog starts the master first thing (watchdog/early.py), then adopts it: the
    master, its fork server and its workers block none of the stop signals `herder run`
    blocks across its exec, and a stop through the watchdog drains as always."""
    h = herder(workers="2", log_level="DEBUG")
    h.wait_workers(2)
    master = h.master()
    assert master is not None
    assert f"master {master.pid} was started before the watchdog loaded" in h.log()
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
    for p in [master, h.fork_server(), *h.workers(master)]:
        assert p is not None and not stops & blocked_signals(p.pid), p
    job = jobs.enqueue("record", "early")
    wait_for(lambda: jobs.finished("early") == [job.id], 10, what="the fleet to work")
    h.stop_and_check()
