"""Custom workers (--worker-command) that break the protocol never take the master down."""

from __future__ import annotations

import re
import sys
import time

import psutil

from conftest import FAKE_WORKERS, wait_for

MISBEHAVE = f"{sys.executable} {FAKE_WORKERS / 'misbehave.py'}"


def test_flooding_malformed_worker_is_counted_and_master_unaffected(herder):
    h = herder(workers="2", worker_command=f"{MISBEHAVE} flood", heartbeat_timeout="5", stop_timeout="2")
    h.wait_log(r"starting -> idle \(ready\)", count=2)
    # Every kind of bad line is counted and reported, per worker.
    matches = h.wait_log(
        r"slot \d pid \d+: \d+ malformed and \d+ oversized protocol lines", timeout=30, count=2
    )
    master = h.master()
    assert master is not None
    totals = {}
    for _ in range(40):
        for m in re.finditer(
            r"slot (\d) pid \d+: \d+ malformed .*?\(totals (\d+), (\d+), (\d+), \d+;", h.log()
        ):
            totals[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        if all(t[0] >= 60_005 for t in totals.values()) and len(totals) == 2:
            break
        time.sleep(0.5)
    assert len(matches) >= 2
    assert len(totals) == 2, totals
    for malformed, oversized, throttled in totals.values():
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
    first = h.wait_log(r"slot 0 pid (\d+): SIGTERM to its process group: closed its stdout but kept running")
    pid = int(first[0].group(1))
    h.wait_log(rf"pid {pid}: .*exited")
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 5)
    assert h.totals()["killed"] >= 1
    h.stop_and_check()


def test_worker_that_ignores_stop_is_killed_at_the_stop_timeout(herder):
    h = herder(workers="1", worker_command=f"{MISBEHAVE} ignore-stop", stop_timeout="2")
    h.wait_log(r"starting -> idle \(ready\)")
    took = h.stop_and_check(timeout=20)
    assert 2 <= took < 2 + 1 + 3  # stop timeout, kill timeout, slack
    (summary,) = h.master_summaries()
    assert summary["killed"] == 1
    assert re.search(r"SIGTERM to its process group: still running 2 s after `stop`", h.log())


def test_crash_looping_worker_command_backs_off(herder):
    h = herder(workers="2", worker_command=f"{sys.executable} -c 'import sys; sys.exit(1)'")
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
    assert lateness and max(lateness) < 0.12, lateness
    master = h.master()
    assert master is not None and master.cpu_percent(interval=1.0) < 50
    h.stop_and_check(timeout=20)


def test_a_worker_in_another_language_runs_under_herder(herder, conn):
    script = FAKE_WORKERS.parent.parent / "examples" / "shell_worker.sh"
    h = herder(workers="1", worker_command=f"bash {script}")
    h.wait_log(r"starting -> idle \(ready\)")
    conn.rpush("shell-jobs", "0", "0", "0.2")
    wait_for(lambda: conn.llen("shell-jobs") == 0, 10, what="the shell worker to take its jobs")
    time.sleep(1.5)
    h.stop_and_check(timeout=20)
    assert re.search(r"stopped \(exit code 0\) after [\d.]+ s, 3 jobs ok, 0 failed", h.log())
