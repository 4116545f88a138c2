"""User code at worker start: --worker-init in every worker (forked or plain), and Django
(django.setup() in the warm template, django-rq's RQ_QUEUES naming the Redis and queues)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from rq import Queue
from rq.job import Job

from harness import wait_for
from herder.supervisor.ctl import client

pytestmark = pytest.mark.slow


def status_now(h) -> dict | None:  # noqa: ANN001 - harness.Herder
    try:
        return client.call(h.state_dir, {"cmd": "status"})
    except OSError:
        return None


def ready_pids(h) -> set[int]:  # noqa: ANN001
    st = status_now(h)
    return {w["pid"] for w in st["workers"] if w["state"] in ("idle", "busy")} if st else set()


def wait_ready(h, n: int, without: int | None = None) -> set[int]:  # noqa: ANN001
    """Wait for exactly n ready workers (none of them `without`); their pids."""

    def ready() -> set[int] | None:
        pids = ready_pids(h)
        return pids if len(pids) == n and without not in pids else None

    return wait_for(ready, 20, what=f"{n} ready workers")  # type: ignore[return-value]


def pids_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "plain"])
def test_worker_init_runs_once_in_every_worker_before_it_is_ready(herder, tmp_path, fork_server):
    init_log = tmp_path / "init.log"
    flags = {} if fork_server else {"no_fork_server": True}
    env = {"HERDER_TEST_INIT_LOG": str(init_log)}
    h = herder(workers="2", worker_init="herder_hooks:record_init", env=env, **flags)
    first = wait_ready(h, 2)
    assert sorted(pids_in(init_log)) == sorted(first)  # each ran the hook once, before `ready`
    victim = next(iter(first))
    os.kill(victim, signal.SIGKILL)
    now = wait_ready(h, 2, without=victim)
    logged = pids_in(init_log)
    assert sorted(logged) == sorted(first | now) and len(logged) == len(set(logged))
    h.stop_and_check()


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "plain"])
def test_a_worker_init_that_raises_fails_the_start_and_backs_the_slot_off(herder, jobs, fork_server):
    flags = {} if fork_server else {"no_fork_server": True}
    h = herder(workers="1", worker_init="herder_hooks:failing_init", **flags)
    job = jobs.enqueue("herder_testjobs.record", "never")

    def backing_off() -> dict | None:
        st = status_now(h)
        return st if st and st["slots_in_backoff"] and st["totals"]["spawned"] >= 3 else None

    st = wait_for(backing_off, 20, what="the slot in backoff after several failed starts")
    assert st["state"] == "starting" and not st["running"]
    assert not [w for w in st["workers"] if w["state"] in ("idle", "busy")]
    assert jobs.status(job.id) == "queued"  # no worker ever took a job
    log = h.log()
    assert "start-up hook failed (--worker-init herder_hooks:failing_init)" in log
    assert "RuntimeError: no database today" in log
    h.stop_and_check()


def test_django_project_runs_orm_jobs_on_forked_workers_with_rq_queues_from_settings(
    herder, redis_url, conn, tmp_path
):
    pytest.importorskip("django")
    mark = tmp_path / "django-setup.pids"
    env = {
        "DJANGO_SETTINGS_MODULE": "herder_django.settings",
        "HERDER_TEST_REDIS_URL": redis_url,
        "HERDER_TEST_DJANGO_MARK": str(mark),
    }
    h = herder(redis_url=None, workers="2", env=env)  # the Redis and queues come from RQ_QUEUES
    wait_ready(h, 2)
    st = status_now(h)
    assert [q["name"] for q in st["queues"]] == ["django-default", "django-low"]
    assert st["settings"]["django_settings"] == "herder_django.settings"
    queue = Queue("django-low", connection=conn)
    ids = [queue.enqueue("herder_django.jobs.orm_roundtrip", f"note-{i}").id for i in range(6)]

    def finished() -> list[Job] | None:
        got = Job.fetch_many(ids, connection=conn)
        return got if all(j and j.get_status() == "finished" for j in got) else None

    done = wait_for(finished, 20, what="the ORM jobs")
    results = [j.return_value() for j in done]
    assert all(r["count"] == 1 for r in results)
    # django.setup() ran in `herder run` (reading RQ_QUEUES) and in the warm template, never
    # in a forked worker: the workers got the apps with their fork.
    template = h.fork_server()
    assert template is not None
    setups = pids_in(mark)
    assert template.pid in setups
    assert not {r["pid"] for r in results} & set(setups)
    h.stop_and_check()
