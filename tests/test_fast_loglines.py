"""RQ's INFO lines of a job written directly (herder.worker.fast_path.loglines): the same bytes
as the logging module writes through herder's handler, and logging's own path whenever a user's
handler, filter, record factory, level name or format is in the way (each sees every record)."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.logging import LogCaptureHandler
from redis import Redis
from rq import Queue

from harness import JOBS_DIR, start_redis
from herder.common import rq_seam
from herder.worker import rq_worker
from herder.worker.fast_path import loglines
from herder.worker.fast_path.loglines import InfoLines

pytestmark = pytest.mark.skipif(
    rq_seam.fast_path_missing() is not None, reason=f"no fast path on {rq_seam.describe()}"
)

LINES = [  # (msg, args): RQ's three lines of a job, and some edges
    ("Worker %s: %s: %s", ("w1", "default", "0f0e-id")),
    ("Worker %s: %s: %s (%s)", ("w1", "default", "herder_rqcompat.add(1, 2) é", "id")),
    ("Successfully completed job %s in %ss on worker %s", ("id", "0:00:00.000512", "w1")),
    ("Worker %s: %s: %s (%s)", ("w1", "default", "Job OK", "id")),
    ("100%% plain, no args", ()),
    ("an %s arg with a %% sign: %r", ("odd", {"k": 1})),
    ("one mapping: %(k)s", ({"k": "v"},)),
]


class Writes(io.BytesIO):
    """A byte stream that counts its writes (logging's or the held lines' one)."""

    writes = 0

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.writes += 1
        return super().write(b)


@pytest.fixture
def rq_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[logging.Logger]:
    """RQ's worker logger set up as herder's worker sets it (log_to_master), put back after."""
    logger = logging.getLogger("rq.worker")
    saved = (
        logger.handlers[:],
        logger.filters[:],
        logger.propagate,
        logger.level,
        vars(logger).get("findCaller"),
    )
    logger.handlers, logger.filters = [], []
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # pytest's own: no user's config here
    monkeypatch.setattr(rq_worker, "_to_master", None)
    monkeypatch.setattr(loglines, "_known", (None, None, None, None))
    rq_worker.log_to_master("%(levelname)s %(message)s")
    logger.setLevel(logging.INFO)
    try:
        yield logger
    finally:
        logger.handlers, logger.filters, logger.propagate = saved[0], saved[1], saved[2]
        logger.setLevel(saved[3])
        vars(logger).pop("findCaller", None)
        if saved[4] is not None:
            logger.findCaller = saved[4]  # type: ignore[method-assign]


def no_pytest(monkeypatch: pytest.MonkeyPatch, logger: logging.Logger) -> None:
    """pytest's capture handlers off the logger (it adds its own in each phase of a test)."""
    monkeypatch.setattr(
        logger, "handlers", [h for h in logger.handlers if not isinstance(h, LogCaptureHandler)]
    )


def written(monkeypatch: pytest.MonkeyPatch, logger: logging.Logger, fast: bool) -> tuple[bytes, int]:
    """The bytes and writes of LINES said through `info`, then two held (as at a job's success)."""
    no_pytest(monkeypatch, logger)
    raw = Writes()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    monkeypatch.setattr(loglines, "enabled", fast)
    for msg, args in LINES:
        loglines.info(logger, msg, *args)
    handler = rq_worker.held_log_lines()
    assert handler is not None
    handler.hold()
    InfoLines(logger).info(*LINES[2][:1], *LINES[2][1])
    InfoLines(logger).info(*LINES[3][:1], *LINES[3][1])
    handler.unhold()
    return raw.getvalue(), raw.writes


def test_the_same_bytes_and_writes_as_loggings(
    rq_log: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    original = rq_log.makeRecord
    monkeypatch.setattr(rq_log, "makeRecord", lambda *a, **k: made.append(a[4]) or original(*a, **k))
    fast = written(monkeypatch, rq_log, fast=True)
    assert made == [LINES[-1][0]]  # only the one-mapping line went through logging
    made.clear()
    slow = written(monkeypatch, rq_log, fast=False)
    assert len(made) == len(LINES) + 2
    assert fast == slow
    assert fast[0].startswith(b"INFO Worker w1: default: 0f0e-id\nINFO Worker w1: default: herder_rqcompat")
    assert fast[1] == len(LINES) + 1  # a write a line, the held two in one


@pytest.mark.parametrize(
    ("fmt", "direct"),
    [
        ("%(levelname)s %(message)s", True),
        ("[%(levelname)-8s] %(name)s %(levelno)d: %(message)s", True),
        ("%(asctime)s %(levelname)s %(message)s", False),  # the clock: logging's own
        ("%(levelname)s %(funcName)s %(message)s", False),
        ("%(process)d %(message)s", False),
    ],
)
def test_formats(rq_log: logging.Logger, monkeypatch: pytest.MonkeyPatch, fmt: str, direct: bool) -> None:
    handler = rq_worker.held_log_lines()
    assert handler is not None
    handler.setFormatter(logging.Formatter(fmt))
    no_pytest(monkeypatch, rq_log)
    assert (loglines.direct(rq_log) is handler) is direct
    if "%(asctime)s" not in fmt:
        assert written(monkeypatch, rq_log, fast=True) == written(monkeypatch, rq_log, fast=False)


def test_no_formatter_is_loggings(rq_log: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    handler = rq_worker.held_log_lines()
    assert handler is not None
    no_pytest(monkeypatch, rq_log)
    formatter = handler.formatter
    handler.setFormatter(None)  # type: ignore[arg-type]
    assert loglines.direct(rq_log) is None  # none remembered yet
    handler.setFormatter(formatter)
    assert loglines.direct(rq_log) is handler  # remembered plain ...
    handler.setFormatter(None)  # type: ignore[arg-type]
    assert loglines.direct(rq_log) is None  # ... and no longer
    assert written(monkeypatch, rq_log, fast=True) == written(monkeypatch, rq_log, fast=False)


def user_filter(logger: logging.Logger) -> None:
    logger.addFilter(seen_filter)


def handler_filter(logger: logging.Logger) -> None:
    rq_worker.held_log_lines().addFilter(seen_filter)  # type: ignore[union-attr]


def user_handler(logger: logging.Logger) -> None:
    logger.addHandler(SeenHandler())


def root_handler(logger: logging.Logger) -> None:
    logger.propagate = True
    logging.getLogger().addHandler(SeenHandler())


def record_factory(logger: logging.Logger) -> None:
    plain = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = plain(*args, **kwargs)
        SEEN.append(record.getMessage())
        return record

    logging.setLogRecordFactory(factory)


def level_name(logger: logging.Logger) -> None:
    logging.addLevelName(logging.INFO, "NOTE")
    logger.addFilter(seen_filter)


SEEN: list[str] = []


def seen_filter(record: logging.LogRecord) -> bool:
    SEEN.append(record.getMessage())
    return True


class SeenHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        SEEN.append(record.getMessage())


@pytest.mark.parametrize(
    "setup", [user_filter, handler_filter, user_handler, root_handler, record_factory, level_name]
)
def test_a_users_handler_or_filter_sees_every_record(
    rq_log: logging.Logger, monkeypatch: pytest.MonkeyPatch, setup
) -> None:  # noqa: ANN001
    root = logging.getLogger()
    saved = root.handlers[:], logging.getLogRecordFactory(), logging.getLevelName(logging.INFO)
    SEEN.clear()
    try:
        no_pytest(monkeypatch, rq_log)
        setup(rq_log)
        assert loglines.direct(rq_log) is None
        written(monkeypatch, rq_log, fast=True)
    finally:
        root.handlers[:] = saved[0]
        logging.setLogRecordFactory(saved[1])
        logging.addLevelName(logging.INFO, saved[2])
        rq_worker.held_log_lines().filters.clear()  # type: ignore[union-attr]
    said = [msg % args if args else msg for msg, args in LINES[:-1]] + ["one mapping: v"]
    assert [*said, LINES[2][0] % LINES[2][1], LINES[3][0] % LINES[3][1]] == SEEN


WORKER = """
import sys
from redis import Redis
from rq import Queue
from herder.worker.channel import Channel
from herder.worker.fast_path import loglines
from herder.worker.fast_path.worker import HerderFastWorker
from herder.worker.rq_worker import log_to_master

loglines.enabled = sys.argv[2] == "fast"
channel = Channel(heartbeat_interval=1.0)
channel.start()
connection = Redis(port=int(sys.argv[1]))
w = HerderFastWorker([Queue("default", connection=connection)], connection=connection, name="lines")
w.attach(channel, 3)
log_to_master("%(levelname)s %(message)s")
w.log_job_description = sys.argv[3] == "description"
direct, hits = loglines.direct, []
loglines.direct = lambda logger: (hits.append(1) or direct(logger)) if direct(logger) else None
w.work(burst=True, logging_level="INFO", log_format="%(levelname)s %(message)s")
channel.stopped()
open(sys.argv[4], "w").write(str(len(hits)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("description", ["description", "id"])
def test_a_workers_lines_are_the_same_bytes(tmp_path: Path, description: str) -> None:
    """A worker's whole stderr over jobs of several kinds (the first of a kind finished by RQ's
    own code, the next from the template), with the fast lines and without: the same bytes,
    but for the times a job took and the worker's pid."""
    outputs = []
    for path in ("fast", "logging"):
        (tmp_path / path).mkdir()
        proc, port = start_redis(tmp_path / path)
        try:
            conn = Redis(port=port)
            q = Queue("default", connection=conn)
            for i in range(3):
                q.enqueue("herder_rqcompat.add", i, 2, job_id=f"add-{i}", result_ttl=600)
                q.enqueue("herder_rqcompat.fail", "no", job_id=f"fail-{i}")
                q.enqueue("herder_rqcompat.slow", 0, job_id=f"slow-{i}", description=f"é {i}")
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(JOBS_DIR), os.environ.get("PYTHONPATH", "")]),
            }
            # stdin stays open as the master's pipe does (a worker whose stdin closes stops taking)
            stdin_r, stdin_w = os.pipe()
            try:
                done = subprocess.run(
                    [sys.executable, "-c", WORKER, str(port), path, description, tmp_path / f"{path}.hits"],
                    env=env, capture_output=True, timeout=60, stdin=stdin_r,
                )  # fmt: skip
            finally:
                os.close(stdin_r)
                os.close(stdin_w)
            assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        finally:
            proc.terminate()
            proc.wait(10)
        err = re.sub(rb"in \d+:\d\d:\d\d(\.\d+)?s", b"in <time>s", done.stderr)
        err = re.sub(rb"PID \d+", b"PID <pid>", err)
        err = re.sub(rb'File "[^"]+"', b"File <file>", err)
        outputs.append(err)
    assert outputs[0] == outputs[1]
    # The fast run wrote lines directly (at least six Job OK and four finishes from a template,
    # the first of each kind being RQ's own, and the dequeues of jobs the script took), the other none.
    assert int((tmp_path / "fast.hits").read_text()) >= 6 + 4
    assert int((tmp_path / "logging.hits").read_text()) == 0
    assert outputs[0].count(b"INFO Successfully completed") == 6
    assert outputs[0].count(b"Job OK") == 6
    assert outputs[0].count(b"INFO Worker lines: default: ") == 9 + 6  # taken, Job OK
