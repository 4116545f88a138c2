"""The kill budget: a fault that freezes every worker must not make herder kill them all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from herder.supervisor.redis_side.budget import ClusterView, KillBudget, sliding_count


def test_sliding_count_weights_the_previous_window_by_its_overlap():
    assert sliding_count(10, 0, 60, now=600.0) == 10  # the window just began: all of the last one counts
    assert sliding_count(10, 2, 60, now=630.0) == 7  # halfway: half of the last window
    assert sliding_count(10, 2, 60, now=659.999) < 2.01


def test_local_budget_allows_half_the_fleet_per_window():
    b = KillBudget(window=60, fraction=0.5)
    t = 6000.0
    assert [b.take(4, now=t + i) for i in range(3)] == [True, True, False]
    assert not b.take(4, now=t + 59)
    assert b.take(4, now=t + 60 + 45)  # 3/4 of the way into the next window: 2*0.25 + 0 + 1 <= 2
    assert KillBudget().limit(1) == 1  # a fleet of one may still lose its one hung worker


def test_cluster_view_limits_kills_across_hosts():
    b = KillBudget(window=60, fraction=0.5)
    view = ClusterView(current=2, previous=0, read_at=6000.0)  # other hosts killed 2 already
    assert not b.take(2, now=6001.0, cluster=(view, 4))  # cluster of 4: limit 2, spent
    view = ClusterView(current=1, previous=0, read_at=6000.0)
    assert b.take(2, now=6001.0, cluster=(view, 4))
    assert view.since_read == 1
    assert not b.take(2, now=6002.0, cluster=(view, 4))  # our own kill counts before the next reading


@pytest.mark.slow
def test_freezing_every_worker_kills_only_the_budget(herder):
    heartbeat_timeout = 3
    h = herder(workers="4", heartbeat_timeout=str(heartbeat_timeout), kill_budget="0.5")
    workers = h.wait_workers(4)
    for w in workers:
        os.kill(w.pid, signal.SIGSTOP)  # a widespread fault: everything goes silent at once
    frozen = {w.pid for w in workers}
    h.wait_status(
        lambda s: s["totals"]["killed"] == 2 and s["health"].startswith("degraded: kill budget spent"),
        heartbeat_timeout + 7,
        what="two kills, then the kill budget spent",
    )
    # An absence over time: another heartbeat timeout, in which the two frozen workers left
    # are overdue on every pass of the loop, and still not killed.
    time.sleep(heartbeat_timeout)
    assert h.totals()["killed"] == 2
    killed = {int(k["pid"]) for k in h.kills() if k["why"].startswith("silent for")}
    assert len(killed) == 2 and killed <= frozen  # half the fleet, not all of it
    out = subprocess.run(
        [h.argv[0], "status", "--json", "--state-dir", h.state_dir], capture_output=True, text=True
    )
    st = json.loads(out.stdout)
    assert out.returncode == 3  # not fully running: degraded
    assert st["health"].startswith("degraded: kill budget spent")
    assert "A widespread fault?" in h.log()
    spared = frozen - killed
    assert all(os.path.exists(f"/proc/{pid}") for pid in spared)  # left alone
    for pid in spared:
        os.kill(pid, signal.SIGCONT)  # the fault clears
    h.wait_status(lambda s: s["health"] == "ok", 10, what="health ok again")
    h.wait_log(r"health ok again", timeout=5)  # and the operator is told
    h.wait_workers(4, timeout=10)  # a full fleet
    h.signal(signal.SIGTERM)
    assert h.wait_exit(30) == 0
    h.assert_nothing_left()
