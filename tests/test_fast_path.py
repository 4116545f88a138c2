"""herder's fast job lifecycle leaves RQ's Redis state, key by key (herder.worker.fast_path).
On an rq without what the fast path records (rq 2), the same comparison runs with the fast
path asked for: herder says once why it is off and leaves RQ's state all the same.

The same jobs, with the same ids, run once under RQ's own `rq worker -w SimpleWorker --burst`
on one redis-server and once under `herder run` on another. Then every key both left is
compared: its type, its TTL (none, or one), a hash's fields (and their values, but for the
timestamps, names and ids that differ from run to run), a sorted set's or list's members, a
stream's entries. Success, failure, a Retry, a dependency, callbacks, a result TTL of 0 and
worker statistics. Real Redis, real workers, RQ's own worker as the reference."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from rq import Callback, Queue, Retry
from rq.job import Job

from harness import JOBS_DIR, start_redis, wait_for
from herder.common import rq_seam

pytestmark = pytest.mark.slow

FAST_PATH_OFF = rq_seam.fast_path_missing()
needs_fast_path = pytest.mark.skipif(
    FAST_PATH_OFF is not None, reason=f"no fast path on {rq_seam.describe()}"
)

BIN = Path(sys.executable).parent
ENDED = {"finished", "failed"}

# Fields whose values differ between any two runs (times, the worker's name, execution ids; a
# traceback, which names herder's frames around the job's).
VOLATILE = re.compile(
    rb"^(created_at|enqueued_at|started_at|ended_at|last_heartbeat|birth|death|worker_name|name|pid|"
    rb"hostname|ip_address|current_job|successful_job_count|failed_job_count|total_working_time|"
    rb"version|python_version|job_id|id|exc_info|exc_string|execution_id|shutdown_requested_date)$"
)


def enqueue_scenario(conn: Redis) -> list[str]:
    """Every kind of ending the fast path touches; ids fixed so both runs name the same keys."""
    q = Queue("default", connection=conn)
    q.enqueue("herder_rqcompat.add", 1, 2, job_id="ok", result_ttl=600)
    q.enqueue("herder_rqcompat.add", 5, 6, job_id="kept", result_ttl=-1)
    q.enqueue("herder_rqcompat.add", 3, 4, job_id="gone", result_ttl=0)
    q.enqueue("herder_rqcompat.add", 7, 8, job_id="parent")
    q.enqueue(
        "herder_rqcompat.add",
        9,
        10,
        job_id="child",
        depends_on="parent",
        on_success=Callback("herder_rqcompat.noted_success"),
    )
    q.enqueue(
        "herder_rqcompat.fail",
        "bad",
        job_id="broken",
        failure_ttl=300,
        on_failure=Callback("herder_rqcompat.noted_failure"),
    )
    q.enqueue("herder_testjobs.fail_times", "flaky", 1, job_id="flaky", retry=Retry(max=2))
    q.enqueue(
        "herder_rqcompat.add", 0, 0, job_id="noted", on_success=Callback("herder_rqcompat.noted_success")
    )
    return ["ok", "kept", "parent", "child", "broken", "flaky", "noted"]


def run_rqs_simple_worker(port: int) -> None:
    """RQ's own SimpleWorker, in burst mode, over the Redis on `port`: the reference run."""
    subprocess.run(
        [BIN / "rq", "worker", "--burst", "-w", "rq.worker.SimpleWorker", "--path", str(JOBS_DIR),
         "--url", f"redis://127.0.0.1:{port}", "default"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def ended(conn: Redis, ids: list[str]) -> bool:
    return all(Job.fetch(i, connection=conn).get_status().value in ENDED for i in ids)


def state(conn: Redis, names: dict[bytes, bytes]) -> dict[bytes, tuple]:
    """What RQ left: every key but herder's own and the scheduler's, with run-specific names
    (worker names, execution ids) replaced by placeholders."""
    out: dict[bytes, tuple] = {}
    for key in conn.scan_iter(count=1000):
        if key.startswith((b"herder:", b"rq:scheduler", b"rq:cron")) or key in (b"rq:suspended",):
            continue
        kind = conn.type(key)
        ttl = conn.ttl(key)
        if kind == b"hash":
            fields = conn.hgetall(key)
            value: object = sorted((f, b"*" if VOLATILE.match(f) else v) for f, v in fields.items())
        elif kind == b"zset":
            value = sorted(normal(m, names) for m in conn.zrange(key, 0, -1))
        elif kind == b"list":
            value = [normal(m, names) for m in conn.lrange(key, 0, -1)]
        elif kind == b"set":
            value = sorted(normal(m, names) for m in conn.smembers(key))
        elif kind == b"stream":
            value = [sorted((f, b"*" if VOLATILE.match(f) or f.endswith(b"_at") else v) for f, v in e.items())
                     for _, e in conn.xrange(key)]  # fmt: skip
        else:
            value = conn.get(key)
        if key.startswith(b"stamped:"):  # the test job's own times
            value = len(value)  # type: ignore[arg-type]
        out[normal(key, names)] = (kind, "no ttl" if ttl == -1 else "ttl", value)
    return out


def normal(text: bytes, names: dict[bytes, bytes]) -> bytes:
    for real, placeholder in names.items():
        text = text.replace(real, placeholder)
    return re.sub(rb"[0-9a-f]{32}", b"<execution>", text)


def worker_names(conn: Redis) -> dict[bytes, bytes]:
    """rq:worker:<name> keys: the one worker that ran the jobs becomes <worker>."""
    keys = [k for k in conn.scan_iter(match="rq:worker:*") if conn.type(k) == b"hash"]
    return {k.split(b":", 2)[2]: b"<worker>" for k in keys}


def worker_stats(conn: Redis) -> list[tuple[int, int]]:
    stats = []
    for key in conn.scan_iter(match="rq:worker:*"):
        if conn.type(key) == b"hash":
            w = conn.hgetall(key)
            stats.append((int(w.get(b"successful_job_count", 0)), int(w.get(b"failed_job_count", 0))))
    return sorted(stats)


@pytest.fixture
def two_redis(tmp_path: Path):
    servers = [start_redis(tmp_path / name) for name in ("rq", "herder") if not (tmp_path / name).mkdir()]
    yield [Redis(port=port) for _, port in servers], [port for _, port in servers]
    for proc, _ in servers:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.mark.parametrize("path", ["fast", "rq"])
def test_herder_leaves_what_rqs_simple_worker_leaves(herder, two_redis, path: str) -> None:
    (by_rq, by_herder), (rq_port, herder_port) = two_redis
    ids = enqueue_scenario(by_rq)
    assert enqueue_scenario(by_herder) == ids
    run_rqs_simple_worker(rq_port)
    wait_for(lambda: ended(by_rq, ids), 30, what="RQ's worker to end every job")  # the Retry's interval

    flags = {"no_fast_path": True} if path == "rq" else {}
    h = herder(redis_url=f"redis://127.0.0.1:{herder_port}", workers="1", no_scheduler=True, **flags)
    wait_for(lambda: ended(by_herder, ids), 30, what="herder to end every job")
    h.stop_and_check()

    if path == "fast" and FAST_PATH_OFF:  # said once, in the fork server, with the versions
        assert h.log().count(f"fast path off on {rq_seam.describe()}: {FAST_PATH_OFF}") == 1
    # The worker's own statistics, as RQ counts them: 7 ended well (flaky on its retry), 2 failed.
    assert worker_stats(by_herder) == worker_stats(by_rq) == [(7, 2)]
    ours, theirs = state(by_herder, worker_names(by_herder)), state(by_rq, worker_names(by_rq))
    assert sorted(ours) == sorted(theirs)  # the same keys
    for key in theirs:
        assert ours[key] == theirs[key], key


def seen_mid_job(conn: Redis, job_id: str, names: dict[bytes, bytes]) -> dict[bytes, tuple]:
    """The snapshot herder_rqcompat.snapshot took while job_id ran, normalised as `state`."""
    out: dict[bytes, tuple] = {}
    for key, (kind, ttl, value) in json.loads(conn.get(f"seen:{job_id}")).items():
        if key.startswith(("herder:", "rq:scheduler", "rq:cron")):
            continue
        if kind == "hash":
            fields = {f.encode("latin-1"): v.encode("latin-1") for f, v in value.items()}
            value = sorted((f, b"*" if VOLATILE.match(f) else v) for f, v in fields.items())
        elif kind == "zset":
            value = sorted((normal(m.encode("latin-1"), names), score) for m, score in value)
        elif kind in ("list", "set"):
            members = [normal(m.encode("latin-1"), names) for m in value]
            value = members if kind == "list" else sorted(members)
        out[normal(key.encode("latin-1"), names)] = (kind, ttl, value)
    return out


@pytest.mark.parametrize("path", ["fast", "rq"])
def test_a_running_job_sees_what_it_sees_under_rqs_simple_worker(herder, two_redis, path: str) -> None:
    """The start of a job, which the end state cannot show (the finish overwrites most of it):
    each job snapshots every key while it runs (its hash, the started registry, its execution,
    the worker's hash, the intermediate list), with TTLs and time scores to ten seconds. On the
    fast path the first job starts in a round trip of its own, the next ones are started by the
    script that takes them (herder.worker.fast_path.start_template), and a job with another timeout (so
    another heartbeat TTL) starts on its own again before its template is used."""
    (by_rq, by_herder), (rq_port, herder_port) = two_redis
    ids = ["first", "second", "third", "longer", "longer-too", "back"]
    timeouts = [None, None, None, 600, 600, None]
    for conn in (by_rq, by_herder):
        q = Queue("default", connection=conn)
        for job_id, timeout in zip(ids, timeouts, strict=True):
            q.enqueue("herder_rqcompat.snapshot", job_id=job_id, result_ttl=600, job_timeout=timeout)
    run_rqs_simple_worker(rq_port)
    assert ended(by_rq, ids)

    flags = {"no_fast_path": True} if path == "rq" else {}
    h = herder(redis_url=f"redis://127.0.0.1:{herder_port}", workers="1", no_scheduler=True, **flags)
    wait_for(lambda: ended(by_herder, ids), 30, what="herder to end every job")
    h.stop_and_check()

    for job_id in ids:
        ours = seen_mid_job(by_herder, job_id, worker_names(by_herder))
        theirs = seen_mid_job(by_rq, job_id, worker_names(by_rq))
        assert sorted(ours) == sorted(theirs), job_id  # the same keys
        for key in theirs:
            assert ours[key] == theirs[key], (job_id, key)


@needs_fast_path
def test_a_flushed_script_is_loaded_again_and_no_job_is_lost(herder, conn: Redis) -> None:
    """A restarted or flushed Redis forgets the script: the worker loads it and sends the same
    call again. Flushed while the worker idles (its next start finds none), then once more as
    a burst runs (a finish and take, or the next start, finds none)."""
    q = Queue("default", connection=conn)
    h = herder(workers="1", no_scheduler=True)
    first = q.enqueue("herder_rqcompat.add", 1, 1)
    wait_for(lambda: ended(conn, [first.id]), 30, what="the first job")
    conn.script_flush()
    burst = [q.enqueue("herder_rqcompat.add", i, i).id for i in range(20)]
    wait_for(lambda: len(conn.lrange("rq:queue:default", 0, -1)) < 15, 30, what="the burst to start")
    conn.script_flush()
    wait_for(lambda: ended(conn, burst), 30, what="the burst")
    assert all(Job.fetch(i, connection=conn).get_status().value == "finished" for i in [first.id, *burst])
    assert [r["sum"] for r in (Job.fetch(i, connection=conn).return_value() for i in burst)] == [
        2 * i for i in range(20)
    ]
    h.stop_and_check()


SLOWLOG_LEN = 100_000


@contextlib.contextmanager
def every_command_logged(conn: Redis) -> Iterator[None]:
    """Redis's slow log keeps every command meanwhile, with the name of the client that sent it
    (the session's Redis gets its settings back after)."""
    was = conn.config_get("slowlog-*")
    conn.config_set("slowlog-log-slower-than", 0)
    conn.config_set("slowlog-max-len", SLOWLOG_LEN)
    conn.slowlog_reset()
    try:
        yield
    finally:
        for key in ("slowlog-log-slower-than", "slowlog-max-len"):
            conn.config_set(key, was[key])
        conn.slowlog_reset()


@needs_fast_path
def test_one_round_trip_a_job_once_the_start_template_is_learnt(herder, conn: Redis) -> None:
    """A run of jobs with one timeout: the first starts in a script call of its own, then each
    finish takes the next job and writes its start, in one call (two before the template)."""
    q = Queue("default", connection=conn)
    ids = [q.enqueue("herder_rqcompat.add", i, 1).id for i in range(30)]
    with every_command_logged(conn):  # the worker's calls, not its master's readings a second
        h = herder(workers="1", no_scheduler=True)
        wait_for(lambda: ended(conn, ids), 30, what="the jobs")
        h.stop_and_check()
        sent = [(e["command"], e.get("client_name") or b"") for e in conn.slowlog_get(SLOWLOG_LEN)]
        calls = sum(c.startswith(b"EVALSHA ") and by.startswith(b"herder-worker-") for c, by in sent)
    assert all(Job.fetch(i, connection=conn).get_status().value == "finished" for i in ids)
    assert len(ids) <= calls <= len(ids) + 3  # + the first start, the last finish, a spare
    # RQ's own lines for every job, as `rq worker` prints them, through herder's log.
    log = h.log()
    for job_id in ids:
        taken = rf"INFO Worker \S+: default: herder_rqcompat\.add\(\d+, 1\) \({job_id}\)"
        assert re.search(taken, log) and re.search(rf"INFO Worker \S+: default: Job OK \({job_id}\)", log)


def enqueue_repeated_shapes(conn: Redis) -> list[str]:
    """Jobs of each finish shape more than once, so the later ones take the finish template
    (herder.worker.fast_path.finish_template), and the endings it must leave to RQ's finish
    after the template is learnt: a job with a dependent, a failure, a result TTL of 0."""
    q = Queue("default", connection=conn)
    for n in range(3):
        q.enqueue("herder_rqcompat.add", n, 1, job_id=f"ok-{n}", result_ttl=600)
        q.enqueue("herder_rqcompat.add", n, 2, job_id=f"kept-{n}", result_ttl=-1)
        q.enqueue("time.sleep", 0, job_id=f"none-{n}")
        q.enqueue("herder_rqcompat.add", n, 3, job_id=f"meta-{n}", meta={"n": n, "who": "test"})
        q.enqueue("herder_rqcompat.add", n, 4, job_id=f"gone-{n}", result_ttl=0)
    q.enqueue("herder_rqcompat.add", 7, 8, job_id="parent")
    q.enqueue("herder_rqcompat.add", 9, 10, job_id="child", depends_on="parent")
    q.enqueue("herder_rqcompat.fail", "bad", job_id="broken", failure_ttl=300)
    q.enqueue("herder_rqcompat.add", 5, 5, job_id="last", result_ttl=600)
    return [f"{kind}-{n}" for n in range(3) for kind in ("ok", "kept", "none", "meta")] + [
        "parent", "child", "broken", "last",
    ]  # fmt: skip


@needs_fast_path
def test_the_finish_template_leaves_what_rqs_simple_worker_leaves(herder, two_redis) -> None:
    """The same comparison as above, key by key, over jobs whose finishes are mostly written
    from the finish template: each shape's first finish is RQ's (recorded), the next ones the
    template's, and a job with a dependent or a failure still ends as RQ ends it."""
    (by_rq, by_herder), (rq_port, herder_port) = two_redis
    ids = enqueue_repeated_shapes(by_rq)
    assert enqueue_repeated_shapes(by_herder) == ids
    run_rqs_simple_worker(rq_port)
    assert ended(by_rq, ids)

    h = herder(redis_url=f"redis://127.0.0.1:{herder_port}", workers="1", no_scheduler=True)
    wait_for(lambda: ended(by_herder, ids), 30, what="herder to end every job")
    h.stop_and_check()

    assert worker_stats(by_herder) == worker_stats(by_rq) == [(18, 1)]
    ours, theirs = state(by_herder, worker_names(by_herder)), state(by_rq, worker_names(by_rq))
    assert sorted(ours) == sorted(theirs)  # the same keys
    for key in theirs:
        assert ours[key] == theirs[key], key


@needs_fast_path
def test_a_job_past_its_timeout_fails_as_under_rq_and_the_next_one_runs(herder, conn: Redis) -> None:
    """RQ's job timeout on herder's worker (SignalDeathPenalty: RQ's alarm, set through the
    signal module's C functions): the job is stopped at its timeout with RQ's exception and
    message, and the alarm is cleared for the jobs after it."""
    from rq.results import Result

    q = Queue("default", connection=conn)
    late = q.enqueue("herder_testjobs.spin", "timeout", 30, job_timeout=1)
    after = q.enqueue("herder_testjobs.spin", "timeout", 1.5, job_timeout=60)
    h = herder(workers="1", no_scheduler=True)
    wait_for(lambda: ended(conn, [late.id, after.id]), 30, what="both jobs")
    h.stop_and_check()
    assert late.get_status(refresh=True).value == "failed"
    result = Result.fetch_latest(late)
    assert result is not None
    assert "JobTimeoutException: Task exceeded maximum timeout value (1 seconds)" in (result.exc_string or "")
    assert after.get_status(refresh=True).value == "finished"


def enqueue_self_deleting(conn: Redis) -> list[str]:
    """Jobs whose own code deletes their job (get_current_job().delete(), and Job.fetch(...)
    .delete()), between plain ones, so on the fast path some start and finish by the script's
    templates: RQ's SimpleWorker writes their finish all the same."""
    q = Queue("default", connection=conn)
    ids = []
    for n, how in enumerate(["current", "fetched", "cancelled", "current", "fetched", "cancelled"]):
        ids.append(q.enqueue("herder_rqcompat.add", n, 1, job_id=f"ok-{n}", result_ttl=600).id)
        job = q.enqueue("herder_rqcompat.delete_itself", how, job_id=f"self-{how}-{n}", result_ttl=600)
        ids.append(job.id)
    ids.append(q.enqueue("herder_rqcompat.add", 9, 9, job_id="last", result_ttl=600).id)
    return ids


@pytest.mark.parametrize("path", ["fast", "rq"])
def test_a_job_that_deletes_itself_ends_as_under_rqs_simple_worker(herder, two_redis, path: str) -> None:
    """The job's execution leaves RQ's started registry with its hash: herder's fence tells
    that from a recovery (herder.worker.fence), and the finish is written as RQ writes it."""
    (by_rq, by_herder), (rq_port, herder_port) = two_redis
    ids = enqueue_self_deleting(by_rq)
    assert enqueue_self_deleting(by_herder) == ids
    run_rqs_simple_worker(rq_port)

    def finished(conn: Redis) -> bool:  # read as it is: a job may be deleted while it runs
        with conn.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hget(f"rq:job:{i}", "status")
            return all(s == b"finished" for s in pipe.execute())

    assert finished(by_rq)
    flags = {"no_fast_path": True} if path == "rq" else {}
    h = herder(redis_url=f"redis://127.0.0.1:{herder_port}", workers="1", no_scheduler=True, **flags)
    wait_for(lambda: finished(by_herder), 30, what="herder to end every job")
    h.stop_and_check()

    assert "its finish was not written" not in h.log()
    assert worker_stats(by_herder) == worker_stats(by_rq) == [(len(ids), 0)]
    ours, theirs = state(by_herder, worker_names(by_herder)), state(by_rq, worker_names(by_rq))
    assert sorted(ours) == sorted(theirs)  # the same keys
    for key in theirs:
        assert ours[key] == theirs[key], key
