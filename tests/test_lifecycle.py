"""Whole-fleet behaviour: jobs done exactly once, graceful stops, master deaths."""

from __future__ import annotations

import collections
import os
import re
import signal

import pytest
from rq.worker import Worker

from harness import living, reap_adopted, wait_for

pytestmark = pytest.mark.slow


def reap_exit_codes(pids: list[int], timeout: float) -> dict[int, int]:
    """Wait for adopted children to exit and reap them: their exit codes (-N: killed by signal N)."""
    codes: dict[int, int] = {}

    def all_exited() -> bool:
        for pid in set(pids) - set(codes):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not re-parented to us yet
                continue
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        return len(codes) == len(pids)

    wait_for(all_exited, timeout, what=f"workers {pids} to exit")
    return codes


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
    wait_for(lambda: all(jobs.status(i) == "finished" for i in ids), 5, what="RQ to mark all 500 finished")
    assert_exactly_once(jobs, "t", ids)
    # Printing jobs did not disturb the protocol: no malformed lines, no kills, no respawns.
    st = wait_for(  # a job records its finish just before its worker reports it done
        lambda: (s := h.snapshot()) and not any(w["job"] for w in s["workers"]) and s,
        5,
        what="every worker to report its last job done",
    )
    assert [w["malformed_lines"] for w in st["workers"]] == [0, 0, 0, 0]
    assert (st["totals"]["spawned"], st["totals"]["killed"]) == (4, 0)
    assert sum(w["jobs_ok"] for w in st["workers"]) == 500
    log = h.log()
    assert not re.search(r"[1-9]\d* malformed|[1-9]\d* oversized", log)
    assert "hello from a job" in log  # a job's stdout went to the log instead
    h.stop_and_check()


def test_sigterm_mid_job_lets_every_running_job_finish(herder, jobs):
    h = herder(workers="4")
    h.wait_workers(4)
    ids = [jobs.enqueue("record", "t", 3).id for _ in range(4)]
    wait_for(lambda: len(jobs.started("t")) == 4, 10, what="4 jobs running")
    h.stop_and_check()
    assert_exactly_once(jobs, "t", ids)
    assert all(jobs.status(i) == "finished" for i in ids)
    (summary,) = h.master_summaries()
    assert summary["killed"] == 0  # nobody was killed
    assert (summary["exited"], summary["jobs_ok"]) == (4, 4)
    assert len(h.graceful_exits()) == 4


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
    new_workers = h.wait_workers(4)  # the new master's own, ready
    assert {w.ppid() for w in new_workers} == {new_master.pid}
    assert any(w.is_running() for w in old_workers), "old workers were killed with their master"
    # The old workers finish their jobs, then exit by themselves.
    wait_for(lambda: len(jobs.finished("t")) == 4, 15, what="the 4 jobs to finish")

    def old_gone() -> bool:
        reap_adopted()
        return not any(living(w) for w in old_workers)

    wait_for(old_gone, 10, what="old workers to exit")
    assert_exactly_once(jobs, "t", ids)
    assert len(h.workers(new_master)) == 4
    h.stop_and_check()


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
    # RQ marks a job finished a moment after the job's own last line: wait for that moment.
    wait_for(lambda: all(jobs.status(i) == "finished" for i in ids), 5, what="RQ to mark the 4 jobs finished")
    # Orphaned, the workers are ours now (pytest is their subreaper): each finished its job
    # and exited 0 by itself, none was killed...
    codes = reap_exit_codes([w.pid for w in workers], timeout=10)
    assert codes == {w.pid: 0 for w in workers}, codes
    # ...and each unregistered itself from RQ on the way out: no ghost worker in `rq info`.
    assert Worker.all(connection=jobs.conn) == []
    h.assert_nothing_left(timeout=10)


def test_sigusr1_and_sigusr2_to_the_watchdog_neither_end_it(herder, jobs):
    """Their default would end the watchdog at once and leave an embedded Redis behind: USR1
    upgrades in place (`herder upgrade`'s signal: the watchdog keeps its pid, a new master takes
    over), USR2 reaches the master, which writes its threads' stacks to the log."""
    h = herder(workers="1")
    h.wait_workers(1)
    master = h.master()
    assert master is not None
    h.signal(signal.SIGUSR1)
    h.wait_log(rf"upgrade: master {master.pid} \(old\) exited")
    upgraded = h.master()
    assert upgraded is not None and upgraded.pid != master.pid
    h.signal(signal.SIGUSR2)
    h.wait_log(rf"forwarding SIGUSR2 to master {upgraded.pid}")
    h.wait_log(r"Thread 0x[0-9a-f]+")  # faulthandler's dump, in the master's log
    job = jobs.enqueue("record", "u", 0)
    jobs.wait_finished(job.id, 10, "a job after the signals")
    assert h.master() is not None and h.master().pid == upgraded.pid, "the master was replaced"
    h.stop_and_check()
