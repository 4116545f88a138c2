"""Coming from `rq worker`: the same job module, RQ settings module and options give the same
results under `rq worker -c settings ...` and `herder run --rq-config settings ...`. Both
runners run for real, one after the other, on one real Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from harness import JOBS_DIR, wait_for

pytestmark = pytest.mark.slow

RQ = str(Path(sys.executable).with_name("rq"))
OPTIONS = {  # rq worker's flag -> herder run's flag, same value
    "--worker-class": "herder_rqcompat.RecordingWorker",
    "--exception-handler": "herder_rqcompat.note_failure",
    "--serializer": "rq.serializers.JSONSerializer",
    "--results-ttl": "1000",
}


def enqueue(conn: Redis) -> list[str]:
    q = Queue("compat", connection=conn, serializer=JSONSerializer)
    return [
        q.enqueue("herder_rqcompat.add", 1, 2).id,
        q.enqueue("herder_rqcompat.add", 20, 22).id,
        q.enqueue("herder_rqcompat.fail", "bad input").id,
    ]


def outcome(conn: Redis, ids: list[str]) -> list[tuple]:
    """What a user sees of each job, the same whoever ran it."""
    out = []
    for job_id in ids:
        job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
        ttl = conn.ttl(f"rq:results:{job_id}") if job.get_status() == "finished" else None
        out.append((
            job.get_status().value,
            job.return_value(),
            [x.decode() for x in conn.lrange(f"ran-by:{job_id}", 0, -1)],
            ttl is not None and 900 < ttl <= 1000,
        ))  # fmt: skip
    handled = sorted(x.decode().split(" ", 1)[1] for x in conn.lrange("handled", 0, -1))
    return [*out, handled]


def test_the_same_settings_module_and_options_give_the_same_results(
    herder, conn: Redis, tmp_path: Path
) -> None:
    settings = tmp_path / "herder_rqsettings.py"
    settings.write_text(f'REDIS_URL = "{herder_url(conn)}"\nQUEUES = ["compat"]\n')
    flags = [x for pair in OPTIONS.items() for x in pair]
    # rq worker, in burst mode: it runs what is queued, then exits.
    ids = enqueue(conn)
    subprocess.run(
        [RQ, "worker", "-b", "-c", "herder_rqsettings", "-P", str(tmp_path), "-P", str(JOBS_DIR), *flags],
        cwd=tmp_path, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    by_rq = outcome(conn, ids)
    conn.flushall()
    # herder, with the same module and options.
    ids = enqueue(conn)
    h = herder(rq_config="herder_rqsettings", path=[str(JOBS_DIR), str(tmp_path)], redis_url=None,
               workers="1", **{k[2:].replace("-", "_"): v for k, v in OPTIONS.items()})  # fmt: skip

    def done() -> bool:
        statuses = {Job.fetch(i, connection=conn, serializer=JSONSerializer).get_status() for i in ids}
        return statuses <= {"finished", "failed"} and len(conn.lrange("handled", 0, -1)) == 1

    wait_for(done, 20, what="herder to run the three jobs")
    by_herder = outcome(conn, ids)
    assert by_herder == by_rq
    assert by_rq[0] == ("finished", {"sum": 3, "queue": "compat"}, ["RecordingWorker"], True)
    assert by_rq[2][0] == "failed" and by_rq[3] == ["ValueError: bad input"]
    status = h.snapshot()
    assert status["settings"]["queues"] == ["compat"]
    assert status["settings"]["worker_class"] == OPTIONS["--worker-class"]
    h.stop_and_check()


def herder_url(conn: Redis) -> str:
    kw = conn.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


@pytest.mark.parametrize(
    ("flag", "value", "key"),
    [
        ("--worker-class", "not a path", "worker_class"),
        ("--dequeue-strategy", "fastest", "dequeue_strategy"),
        ("--rq-config", "no_such_settings_module", "rq_config"),
        ("--preload", "not a module!", "preload"),
    ],
)
def test_a_bad_rq_option_exits_78_naming_the_key(tmp_path: Path, flag: str, value: str, key: str) -> None:
    herder_exe = str(Path(sys.executable).with_name("herder"))
    r = subprocess.run(
        [herder_exe, "run", "--state-dir", str(tmp_path / "s"), "--redis-url", "redis://127.0.0.1:1/0",
         flag, value],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 78, r.stderr
    assert repr(key) in r.stderr
