"""Whole-fleet behaviour: jobs done exactly once, graceful stops, master deaths."""

from __future__ import annotations

import collections
import os
import re
import signal
import time

import psutil

from conftest import reap_adopted, wait_for


def assert_exactly_once(jobs, tag: str, ids: list[str]) -> None:
    started = collections.Counter(jobs.started(tag))
    finished = collections.Counter(jobs.finished(tag))
    assert set(finished) == set(ids), f"lost: {set(ids) - set(finished)}"
    assert all(n == 1 for n in finished.values()), "a job finished twice"
    assert all(n == 1 for n in started.values()), "a job was started twice: something interrupted it"


def test_500_jobs_on_4_workers_all_complete_once(herder, jobs):
    h = herder(workers="4")
    h.wait_workers(4)
    ids = [jobs.enqueue("chatty" if i % 5 == 0 else "record", "t").id for i in range(500)]
    wait_for(lambda: len(jobs.finished("t")) >= 500, 60, what="500 jobs finished")
    assert all(jobs.status(i) == "finished" for i in ids)
    assert_exactly_once(jobs, "t", ids)
    log = h.log()
    # Printing jobs did not disturb the protocol: no malformed lines, no kills, no respawns.
    assert not re.search(r"[1-9]\d* malformed|[1-9]\d* oversized", log)
    assert "SIGTERM to its process group" not in log
    assert log.count(": spawned -> starting") == 4
    assert "hello from a job" in log  # a job's stdout went to the log instead
    h.signal(signal.SIGTERM)
    assert h.wait_exit(30) == 0
    h.assert_nothing_left()


def test_sigterm_mid_job_lets_every_running_job_finish(herder, jobs):
    h = herder(workers="4")
    h.wait_workers(4)
    ids = [jobs.enqueue("record", "t", 3).id for _ in range(4)]
    wait_for(lambda: len(jobs.started("t")) == 4, 10, what="4 jobs running")
    h.signal(signal.SIGTERM)
    assert h.wait_exit(30) == 0
    assert_exactly_once(jobs, "t", ids)
    assert all(jobs.status(i) == "finished" for i in ids)
    log = h.log()
    assert "SIGTERM to its process group" not in log  # nobody was killed
    assert log.count("stopped (exit code 0)") == 4
    h.assert_nothing_left()


def test_kill_9_master_watchdog_restarts_it_and_old_workers_finish(herder, jobs):
    h = herder(workers="4")
    h.wait_workers(4)
    ids = [jobs.enqueue("record", "t", 3).id for _ in range(4)]
    wait_for(lambda: len(jobs.started("t")) == 4, 10, what="4 jobs running")
    old_master = h.master()
    assert old_master is not None
    old_workers = h.workers(old_master)
    old_master.kill()
    # A new master with a full fleet, while the old workers still run their jobs.
    new_master = wait_for(
        lambda: (m := h.master()) and m.pid != old_master.pid and m, 10, what="a new master"
    )
    wait_for(lambda: len(h.workers(new_master)) == 4, 20, what="4 new workers")
    assert any(w.is_running() for w in old_workers), "old workers were killed with their master"
    # The old workers finish their jobs, then exit by themselves.
    wait_for(lambda: len(jobs.finished("t")) == 4, 15, what="the 4 jobs to finish")

    def old_gone() -> bool:
        reap_adopted()
        return not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in old_workers)

    wait_for(old_gone, 10, what="old workers to exit")
    assert_exactly_once(jobs, "t", ids)
    assert len(h.workers(new_master)) == 4
    h.signal(signal.SIGTERM)
    assert h.wait_exit(30) == 0
    h.assert_nothing_left()


def test_kill_9_watchdog_and_master_together_workers_finish_and_exit(herder, jobs):
    h = herder(workers="4")
    h.wait_workers(4)
    ids = [jobs.enqueue("record", "t", 2).id for _ in range(4)]
    wait_for(lambda: len(jobs.started("t")) == 4, 10, what="4 jobs running")
    master = h.master()
    assert master is not None
    workers = h.workers(master)
    os.kill(h.pid, signal.SIGKILL)
    master.kill()
    h.wait_exit(5)
    wait_for(lambda: len(jobs.finished("t")) == 4, 15, what="the 4 jobs to finish")
    assert_exactly_once(jobs, "t", ids)
    assert all(jobs.status(i) == "finished" for i in ids)
    h.assert_nothing_left(timeout=10)
    for w in workers:
        assert not w.is_running() or w.status() == psutil.STATUS_ZOMBIE
    time.sleep(0.1)
