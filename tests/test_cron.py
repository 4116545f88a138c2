"""RQ's cron under herder: `--cron` runs RQ's CronScheduler in the scheduler process, in one
place per Redis; two hosts never both enqueue a tick, and a dead holder is replaced."""

from __future__ import annotations

import os
import signal

import pytest
from rq.job import Job

from harness import wait_for
from herder.supervisor.ctl import client

pytestmark = pytest.mark.slow


def status_now(h) -> dict | None:  # noqa: ANN001 - harness.Herder
    try:
        return client.call(h.state_dir, {"cmd": "status"})
    except OSError:
        return None


def cron_holder(h) -> dict | None:  # noqa: ANN001
    st = status_now(h)
    return st["scheduler"]["cron"]["holder"] if st and st["scheduler"] else None


def cron_jobs(conn) -> list[Job]:  # noqa: ANN001
    """Every cron job enqueued so far (each started job records its id), oldest first."""
    ids = [i.decode() for i in conn.lrange("started:cron", 0, -1)]
    jobs = [j for j in Job.fetch_many(ids, connection=conn) if j is not None]
    return sorted(jobs, key=lambda j: j.enqueued_at)


def assert_one_per_tick(jobs: list[Job]) -> None:
    """Interval 1 s: two hosts both enqueuing would put two jobs within a tick of each other."""
    gaps = [(b.enqueued_at - a.enqueued_at).total_seconds() for a, b in zip(jobs, jobs[1:], strict=False)]
    assert gaps and min(gaps) > 0.5, f"cron jobs enqueued {min(gaps):.3f} s apart: two schedulers ran it"


def test_cron_runs_in_one_place_and_is_handed_over_when_its_holder_dies(herder, conn):
    hosts = [herder(workers="1", cron="herder_cron", host_id=f"host{n}") for n in range(2)]

    def one_holder() -> dict | None:
        seen = [cron_holder(h) for h in hosts]
        if None in seen or seen[0]["name"] != seen[1]["name"]:
            return None
        return seen[0] if [s["here"] for s in seen].count(True) == 1 else None

    first = wait_for(one_holder, 20, what="one cron holder that both hosts name")
    wait_for(lambda: len(cron_jobs(conn)) >= 4 or None, 20, what="four cron ticks")
    assert_one_per_tick(cron_jobs(conn))
    holder_host = next(h for h in hosts if cron_holder(h)["here"])
    status = status_now(holder_host)
    assert status and "runs cron from herder_cron" in status_line(holder_host)
    # Kill the holder: its master frees the lock at once, and a standby (another host's, or
    # this host's replacement) takes over within a tick or two.
    os.kill(first["pid"], signal.SIGKILL)
    second = wait_for(
        lambda: (h := one_holder()) and h["name"] != first["name"] and h, 20, what="a new cron holder"
    )
    assert second["pid"] != first["pid"]
    before = len(cron_jobs(conn))
    wait_for(lambda: len(cron_jobs(conn)) >= before + 3 or None, 20, what="cron ticks after the hand-over")
    # The holder's whole host stops: the other host runs cron.
    survivor = next(h for h in hosts if h is not holder_host)
    holder_host.stop_and_check()
    third = wait_for(
        lambda: (h := cron_holder(survivor)) and h["here"] and h, 20, what="the survivor to hold cron"
    )
    assert third["host_id"] == "host1" if survivor is hosts[1] else "host0"
    before = len(cron_jobs(conn))
    wait_for(lambda: len(cron_jobs(conn)) >= before + 3 or None, 20, what="cron ticks on the survivor")
    assert_one_per_tick(cron_jobs(conn))
    survivor.stop_and_check()


def status_line(h) -> str:  # noqa: ANN001
    """`herder status` as a person reads it."""
    import subprocess

    from harness import HERDER

    r = subprocess.run(
        [HERDER, "status", "--state-dir", h.state_dir], capture_output=True, text=True, timeout=30
    )
    return r.stdout
