"""The workers limit and spawn pacing on real processes: `herder scale` past the limit is
refused and changes nothing; a big legal scale-up can be stopped while workers are still
starting (the pacing rules themselves: tests/test_master_unit.py)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from harness import HERDER, SHORT_TIMEOUT_FLAGS
from herder.common.config import default_workers_limit, host_cpus

pytestmark = pytest.mark.slow


def scale(h, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HERDER, "scale", *args, "--state-dir", h.state_dir], capture_output=True, text=True, timeout=30
    )


def test_scale_past_the_workers_limit_is_refused_and_the_fleet_stays(herder):
    h = herder(workers="2", workers_limit="8")
    pids = {p.pid for p in h.wait_workers(2)}
    for n in ("100000", "9"):
        r = scale(h, n)
        assert r.returncode == 1 and "workers limit of 8" in r.stderr, r.stderr
    st = h.snapshot()
    assert (st["desired"], st["workers_limit"], st["totals"]["spawned"]) == (2, 8, 2)
    assert st["workers_limit_reason"] == "workers_limit"
    assert {p.pid for p in h.workers()} == pids
    assert scale(h, "8").returncode == 0  # the limit itself is allowed
    h.wait_workers(8)
    h.stop_and_check()


def test_the_default_limit_comes_from_the_host_and_is_named_in_the_refusal(herder):
    h = herder(workers="1")
    h.wait_workers(1)
    limit, reason = default_workers_limit()
    st = h.snapshot()
    assert (st["workers_limit"], st["workers_limit_reason"]) == (limit, reason)
    assert "CPUs" in reason
    r = scale(h, "100000")
    assert r.returncode == 1 and f"workers limit of {limit}" in r.stderr and "CPUs" in r.stderr
    h.stop_and_check()


def test_a_stop_during_a_big_scale_up_exits_0_within_the_stop_timeout(herder):
    h = herder(workers="1", workers_limit="40")
    h.wait_workers(1)
    assert scale(h, "40").returncode == 0
    # Stop while workers are still being spawned and loading: the loop must take the
    # signal between two paced batches and every starting worker must go.
    # A forked worker is ready moments after its spawn: waited for, a status with one still starting.
    h.wait_status(
        lambda s: s["totals"]["spawned"] >= 6 and any(w["state"] == "starting" for w in s["workers"]),
        20, "the scale-up under way, a worker starting", interval=0.02,
    )  # fmt: skip
    took = h.stop_and_check(signal.SIGTERM, timeout=float(SHORT_TIMEOUT_FLAGS["--stop-timeout"]))
    assert took < float(SHORT_TIMEOUT_FLAGS["--stop-timeout"])
    (summary,) = h.master_summaries()
    assert summary["spawned"] <= 40 and summary["spawned"] == summary["exited"]
    assert summary["killed"] == 0  # each starting worker took its `stop`, none needed a kill


def test_a_scale_up_past_the_start_window_comes_all_the_way_up(herder):
    """More workers than may load at once (fleet.START_WINDOW is 4 per CPU): each `ready`
    opens the window for the next, and the loop answers throughout. Each a new interpreter
    (about 0.3 s of imports each), which the window is for: forked ones load in no time."""
    h = herder(workers="1", workers_limit="24", no_fork_server=True)
    h.wait_workers(1)
    assert scale(h, "24").returncode == 0
    most_loading = 0
    deadline = time.monotonic() + 60
    while not ((st := h.snapshot())["running"] and st["actual"] == 24):  # a hung loop fails status
        assert time.monotonic() < deadline, st
        # Loading: starting and no protocol line yet, as the window counts (fleet.loading); a
        # worker that beat is loaded, on its way to `ready`, and shows `starting` meanwhile.
        loading = sum(w["state"] == "starting" and not w["heard_from"] for w in st["workers"])
        most_loading = max(most_loading, loading)
        time.sleep(0.05)  # a sampling interval
    assert len(h.workers()) == 24 and most_loading <= 4 * host_cpus()
    h.stop_and_check()
