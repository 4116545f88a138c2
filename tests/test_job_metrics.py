"""Job metrics end to end: how long each function's jobs take (herder_job_duration_seconds),
how long the oldest job has waited (status and herder_queue_oldest_job_age_seconds), the
latency target (--max-wait) and the cluster's need (herder_workers_wanted)."""

from __future__ import annotations

import re

import pytest

from harness import free_port, metrics, sample, wait_for

pytestmark = pytest.mark.slow

RECORD = "herder_testjobs.record"


def test_job_durations_by_function_and_the_oldest_jobs_wait(herder, jobs) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="1", http=str(port))
    h.wait_workers(1)
    ids = [jobs.enqueue("record", "m", 0.3).id for _ in range(12)]
    jobs.enqueue("poison", "p")

    def queue(s: dict) -> dict:
        return next(q for q in s["queues"] if q["name"] == "default")

    # While they wait on one worker, the oldest has waited over a second (status, then /metrics).
    h.wait_status(lambda s: (queue(s)["oldest_age"] or 0) > 1.0, 10, what="the oldest job waiting > 1 s")
    wait_for(
        lambda: (sample(metrics(base), "herder_queue_oldest_job_age_seconds", queue="default") or 0) > 1.0,
        10,
        what="/metrics to show the oldest job's wait",
    )
    wait_for(lambda: sorted(jobs.finished("m")) == sorted(ids) or None, 30, what="the 12 jobs done")
    # Afterwards nothing waits, and the histogram counts each job once, by its function.
    h.wait_status(lambda s: queue(s)["oldest_age"] == 0 and s["jobs"]["failed"] == 1, 10)
    labels = {"queue": "default", "function": RECORD, "pool": "default", "outcome": "ok"}

    def counted() -> dict | None:
        m = metrics(base)
        return m if sample(m, "herder_job_duration_seconds_count", **labels) == 12 else None

    m = wait_for(counted, 10, what="the histogram to count the 12 jobs")
    total = sample(m, "herder_job_duration_seconds_sum", **labels)
    assert total is not None and 12 * 0.3 <= total < 12 * 1.0, total  # each ran its 0.3 s, not more
    fast = sample(m, "herder_job_duration_seconds_bucket", le="0.25", **labels)
    assert fast == 0 and sample(m, "herder_job_duration_seconds_bucket", le="+Inf", **labels) == 12
    failed = {
        "queue": "default",
        "function": "herder_testjobs.poison",
        "pool": "default",
        "outcome": "failed",
    }
    assert sample(m, "herder_job_duration_seconds_count", **failed) == 1
    h.stop_and_check()


def test_a_latency_target_grows_the_fleet_and_the_need_is_exported(herder, jobs) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # A drain target of 10 minutes: the length rule would let a backlog of slow jobs wait long.
    h = herder(min_workers="1", max_workers="4", max_wait="2", drain_target="600", http=str(port))
    h.wait_status(lambda s: s["running"] and s["settings"]["max_wait"] == 2, 20, what="herder running")
    warm = jobs.enqueue("record", "warm", 0.5)  # the per-worker rate is learned first
    wait_for(lambda: jobs.finished("warm") == [warm.id] or None, 10, what="the warm-up job")
    h.wait_status(lambda s: s["job_rate"] is not None, 10, what="the per-worker job rate learned")
    ids = [jobs.enqueue("record", "slow", 1.5).id for _ in range(6)]
    # Six 1.5 s jobs on one worker: the last would wait 7.5 s. With at most 2 s of waiting the
    # first step goes to 3 or more at once (the length rule alone, with its 600 s drain target,
    # adds one worker per reading while all are busy; tests/test_scaling_policy.py has a load
    # it does not react to at all).
    st = h.wait_status(lambda s: s["desired"] >= 3, 15, what="the fleet grown for the latency target")
    assert st["pools"]["default"]["wanted"] >= 3
    first = re.search(r"scale: 1 -> (\d+) workers \((.*)\)", h.log())
    assert first and int(first[1]) >= 3, first and first[0]
    wait_for(lambda: (sample(metrics(base), "herder_workers_wanted", pool="default") or 0) >= 3, 10)
    wait_for(lambda: sorted(jobs.finished("slow")) == sorted(ids) or None, 30, what="the jobs done")
    h.stop_and_check()


def test_a_queue_named_with_a_space_runs_its_jobs_and_keeps_its_name(herder, conn) -> None:
    """RQ accepts any queue name, and so does herder: status, the per-function metrics (the
    busy line's percent-encoded name, protocol version 7) and RQ's own record all say it."""
    from rq import Queue

    name = "bulk jobs"
    port = free_port()
    h = herder(workers="1", http=str(port), queue=name)
    h.wait_workers(1)
    q = Queue(name, connection=conn)
    job = q.enqueue(RECORD, "spaced", 0.2)
    wait_for(lambda: job.get_status(refresh=True) == "finished", 30, what=f"the job on {name!r} to finish")
    assert job.origin == name
    h.wait_status(lambda s: [x["name"] for x in s["queues"]] == [name] and s["jobs"]["ok"] == 1, 10)
    labels = {"queue": name, "function": RECORD, "pool": "default", "outcome": "ok"}
    wait_for(
        lambda: (
            sample(metrics(f"http://127.0.0.1:{port}"), "herder_job_duration_seconds_count", **labels) == 1
        ),
        10,
        what="the job counted under its queue's own name",
    )
    h.stop_and_check()
