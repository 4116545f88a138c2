"""Custom workers (--worker-command) that break the protocol never take the master down."""

from __future__ import annotations

import re
import statistics
import sys
import time

import psutil
import pytest

from harness import FAKE_WORKERS, wait_for

pytestmark = pytest.mark.slow

MISBEHAVE = f"{sys.executable} {FAKE_WORKERS / 'misbehave.py'}"


def test_flooding_malformed_worker_is_counted_and_master_unaffected(herder):
    h = herder(workers="2", worker_command=f"{MISBEHAVE} flood", heartbeat_timeout="5", stop_timeout="2")
    h.wait_workers(2)
    # Every kind of bad line is counted (the status's count, live)...
    h.wait_status(
        lambda s: [w["malformed_lines"] for w in s["workers"]] == [60_005, 60_005],
        30,
        what="both workers' malformed lines counted",
    )
    master = h.master()
    assert master is not None
    # ...and reported, per worker, in the log (at most every 5 s a worker: wait for the
    # report that carries the whole count).
    report = re.compile(r"slot (\d) pid \d+: \d+ malformed .*?\(totals (\d+), (\d+), (\d+), \d+;")

    def reported() -> dict[str, tuple[int, int, int]] | None:
        last = {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in report.finditer(h.log())}
        return last if len(last) == 2 and all(t[0] >= 60_005 for t in last.values()) else None

    totals = wait_for(reported, 15, what="the per-worker reports of the whole count")
    for malformed, oversized, throttled in totals.values():  # type: ignore[union-attr]
        assert malformed == 60_000 + 5  # the flood plus garbage, unknown verb, bad fields, bad utf-8
        assert oversized == 1  # the 10 MB line, cut and discarded
        assert throttled >= 1  # the flood was slowed by back-pressure, not buffered
    # The master's memory stayed bounded despite 10 MB lines and floods.
    assert master.memory_info().rss < 150 * 2**20
    # The workers kept heartbeating through the flood, so nobody was killed...
    assert h.totals()["killed"] == 0
    # ...and stderr floods were rate-limited in the log, with the count of what was dropped.
    assert re.search(r"dropped [1-9]\d* stderr lines over 1000/s", h.log())
    # The master is healthy: it still answers the watchdog and stops on request.
    # (misbehave.py ignores `stop`, so the stop timeout applies.)
    h.stop_and_check(timeout=40)


def test_worker_that_closes_stdout_but_keeps_running_is_killed(herder):
    h = herder(workers="1", worker_command=f"{MISBEHAVE} close-stdout")
    h.wait_status(lambda s: s["totals"]["killed"] >= 1, 20, what="the worker killed")
    first = h.kills()[0]
    assert (first["slot"], first["why"]) == ("0", "closed its stdout but kept running")
    pid = int(first["pid"])
    # Reaped by the master (status drops a worker when it reaps it, after logging its exit)...
    h.wait_status(lambda s: pid not in [w["pid"] for w in s["workers"]], 10, what="the worker reaped")
    assert not psutil.pid_exists(pid)  # ...so it is gone from the process table, no zombie
    (exit_,) = h.exits(pid)
    assert exit_["why"] == "closed its stdout but kept running", exit_
    h.stop_and_check()


def test_worker_that_ignores_stop_is_killed_at_the_stop_timeout(herder):
    h = herder(workers="1", worker_command=f"{MISBEHAVE} ignore-stop", stop_timeout="2")
    h.wait_workers(1)
    took = h.stop_and_check(timeout=20)
    assert 2 <= took < 2 + 1 + 3  # stop timeout, kill timeout, slack
    (summary,) = h.master_summaries()
    assert summary["killed"] == 1
    assert [k["why"] for k in h.kills()] == ["still running 2 s after `stop`"]


def test_crash_looping_worker_command_backs_off(herder):
    h = herder(workers="2", worker_command=f"{sys.executable} -c 'import sys; sys.exit(1)'")
    # A rate over time: how many spawns a crash loop makes in a 6 s window (backoff from 0.1 s,
    # doubling: 0.1 + 0.2 + ... + 3.2 = 6.3 s), so the window itself is what is measured.
    time.sleep(6)
    log = h.log()
    spawns = log.count(": spawned -> starting")
    # Backoff doubles from 0.1 s per slot: ~7 spawns per slot in 6 s, not hundreds.
    assert 4 <= spawns <= 20, spawns
    assert "backoff (died" in log
    delays = [float(x) for x in re.findall(r"next spawn in ([\d.]+) s", log)]
    assert max(delays) >= 1.6  # it really grew
    # And each respawn comes when its backoff says, not a loop tick later.
    stamp = r"(\d\d:\d\d:\d\d,\d{3})"
    events = re.findall(
        stamp + r" herder\[\d+\] \w+ slot 0(?: pid \d+)?: (?:.*next spawn in ([\d.]+) s|spawned)", log
    )

    def seconds(t: str) -> float:
        h, m, rest = t.split(":")
        return int(h) * 3600 + int(m) * 60 + float(rest.replace(",", "."))

    lateness = [
        seconds(t2) - seconds(t1) - float(delay)
        for (t1, delay), (t2, nxt) in zip(events, events[1:], strict=False)
        if delay and not nxt
    ]
    # A loop that waited for its next tick (0.25 s while in motion) would be ~0.12 s late in
    # the middle; the median, as a lone respawn may wait for a CPU on a busy machine.
    assert lateness and statistics.median(lateness) < 0.06, lateness
    master = h.master()
    assert master is not None and master.cpu_percent(interval=1.0) < 50
    h.stop_and_check(timeout=20)


def test_a_worker_in_another_language_runs_under_herder(herder, conn):
    script = FAKE_WORKERS.parent.parent / "examples" / "shell_worker.sh"
    h = herder(workers="1", worker_command=f"bash {script}")
    h.wait_workers(1)
    conn.rpush("shell-jobs", "0", "0", "0.2")
    h.wait_status(
        lambda s: [(w["jobs_ok"], w["jobs_failed"], w["job"]) for w in s["workers"]] == [(3, 0, None)],
        15,
        what="the shell worker to report its 3 jobs done",
    )
    assert conn.llen("shell-jobs") == 0
    h.stop_and_check(timeout=20)
    assert [(e["jobs_ok"], e["jobs_failed"]) for e in h.graceful_exits()] == [("3", "0")]


def test_a_worker_stuck_outside_its_job_while_it_beats_is_killed_after_the_progress_timeout(herder):
    """Its beat goes on (the process lives, its job's deadline is far) but its loop says it has
    made no progress outside the job: past --progress-timeout it is killed, and the status and
    the log say why."""
    h = herder(workers="1", worker_command=f"{MISBEHAVE} stuck", progress_timeout="9", redis_timeout="1.5",
               heartbeat_timeout="3")  # fmt: skip
    started = time.monotonic()
    h.wait_status(lambda s: s["totals"]["killed"] >= 1, 30, what="the stuck worker killed")
    assert time.monotonic() - started >= 8  # not before the bound: its beat kept it alive
    (kill, *_) = h.kills()
    why = r"its loop made no progress for (9|1\d) s outside the job's own code \(progress timeout 9 s\)"
    assert re.fullmatch(why, kill["why"]), kill
    assert h.status()["killed_by"]["no_progress"] >= 1
    h.stop_and_check()
