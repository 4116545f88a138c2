"""`--log-format json` (docs/monitoring.md, "Logs"): every line herder writes is one JSON object, the
watchdog's and the master's and every relayed line of a worker or the scheduler; an app's own
JSON line keeps its fields, herder's sit beside them; whatever else a job prints comes through
as text, cut at the line limit, never a crash."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from typing import Any

import pytest
from rq import Queue

from harness import HERDER, run_herder, wait_for
from herder.common import jsonlog
from herder.common.exits import EX_CONFIG
from herder.common.lines import MAX_LINE_BYTES

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
CUT = " [line truncated]"
REQUIRED = {"ts", "level", "process", "pid"}  # on every line; `msg` too, unless an app object has none
WORKER = {"process": "worker", "level": "INFO"}


def parse_log(text: str) -> list[dict[str, Any]]:
    """Every line of a run's log as a JSON object with the keys every line carries."""
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            doc = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {n} is not JSON: {line[:300]!r}") from None
        assert isinstance(doc, dict), f"line {n} is not a JSON object: {line[:300]!r}"
        assert doc.keys() >= REQUIRED, f"line {n} lacks {REQUIRED - doc.keys()}: {line[:300]!r}"
        docs.append(doc)
    return docs


def herders_own(doc: dict[str, Any]) -> bool:
    """A line herder composed itself (not an app's object): its ts is herder's."""
    return "herder_ts" not in doc and isinstance(doc["ts"], str) and bool(TS.match(doc["ts"]))


def run_noisy_job(conn, queue: str) -> tuple[str, str]:  # noqa: ANN001 - redis.Redis
    tag = uuid.uuid4().hex[:8]
    job = Queue(queue, connection=conn).enqueue("herder_jsonlogs.noisy", tag)
    wait_for(lambda: conn.lrange(f"finished:{tag}", 0, -1), 30, what="the noisy job to finish")
    return tag, job.id


def lines_of(docs: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """The job's own lines (RQ's lines about the job name it too: not those)."""
    return [d for d in docs if tag in json.dumps(d) and "herder_jsonlogs.noisy" not in str(d.get("msg"))]


@pytest.mark.slow
def test_every_line_is_json_and_an_apps_json_keeps_its_fields(herder, conn) -> None:
    h = herder(workers="1", log_format="json")
    h.wait_workers(1)
    master_pid = h.snapshot()["master"]["pid"]
    h.wait_status(lambda s: s["scheduler"]["holds"] == ["default"], what="the scheduler holding its lock")
    tag, job_id = run_noisy_job(conn, "default")
    worker_pid = h.worker_for_job(conn, job_id)
    h.stop_and_check()

    docs = parse_log(h.log())
    assert all(herders_own(d) for d in docs if tag not in json.dumps(d))
    assert all("msg" in d for d in docs if tag not in json.dumps(d))
    watchdog = [d for d in docs if d["process"] == "watchdog"]
    assert watchdog and all(d["pid"] == h.pid for d in watchdog)
    assert any(d["msg"] == f"master {master_pid} started" for d in watchdog)
    master = [d for d in docs if d["process"] == "master"]
    assert master and all(d["pid"] == master_pid for d in master)
    assert any(d["msg"].startswith(f"master {master_pid} stopped: spawned ") for d in master)
    assert any(d["level"] == "INFO" and "-> idle" in d["msg"] for d in master)
    assert any(
        d["process"] == "scheduler" and "holds the scheduler lock of default" in d["msg"] for d in docs
    )

    mine = lines_of(docs, tag)
    ours = {"pool": "default", "slot": 0, "job_id": job_id}
    text, app, no_msg, broken, array, nan, huge, big_json = mine
    assert text == {"ts": text["ts"], "msg": f"plain text {tag}", "pid": worker_pid, **WORKER, **ours}
    assert TS.match(text["ts"])
    # The app's own fields stay as the app wrote them; herder's differing values sit beside.
    assert app == {
        "msg": f"app says {tag}",
        "level": "warning",
        "ts": 12345,
        "pid": 1,
        "order": 7,
        "tag": tag,
        "herder_ts": app["herder_ts"],  # herder's stamp, checked below
        "herder_level": "INFO",
        "herder_pid": worker_pid,
        "process": "worker",
        **ours,
    }
    assert TS.match(app["herder_ts"])
    assert list(app)[:6] == ["msg", "level", "ts", "pid", "order", "tag"]  # the app's order first
    assert no_msg == {
        "event": f"no msg {tag}",
        "nested": {"a": [1, 2]},
        "ts": no_msg["ts"],
        "pid": worker_pid,
        **WORKER,
        **ours,
    }
    # Not one JSON object: relayed as text, whole.
    assert broken["msg"] == f'{{"broken": "{tag}",' and broken["pid"] == worker_pid
    assert array["msg"] == f'["array", "{tag}"]' and "array" not in array
    assert nan["msg"] == f'{{"nan": NaN, "tag": "{tag}"}}' and "nan" not in nan
    # Enormous lines, JSON or not: text cut at the line limit, with the marker.
    for doc, start in ((huge, f"huge {tag} xxx"), (big_json, f'{{"tag": "{tag}", "pad": "yyy')):
        assert doc["msg"].startswith(start) and doc["msg"].endswith(CUT)
        assert len(doc["msg"].encode()) == MAX_LINE_BYTES + len(CUT)
        assert {k: doc[k] for k in ("pid", "pool", "slot", "job_id", "process")} == {
            "pid": worker_pid,
            "process": "worker",
            **ours,
        }


@pytest.mark.slow
def test_a_pools_workers_carry_its_name_from_the_config_file_without_a_fork_server(
    herder, conn, tmp_path
) -> None:
    conf = tmp_path / "herder.toml"
    conf.write_text('[herder]\nlog_format = "json"\n[pools.bulk]\nqueues = ["bulk"]\nworkers = 1\n')
    h = herder(config=str(conf), no_fork_server=True, no_scheduler=True)
    h.wait_status(lambda s: s["pools"]["bulk"]["ready"] == 1, what="the bulk pool's worker")
    tag, job_id = run_noisy_job(conn, "bulk")
    worker_pid = h.worker_for_job(conn, job_id)
    h.stop_and_check()
    mine = lines_of(parse_log(h.log()), tag)
    assert len(mine) == 8
    for doc in mine:
        assert (doc["pool"], doc["slot"], doc["job_id"], doc["process"]) == ("bulk", 0, job_id, "worker")
        assert doc.get("herder_pid", doc["pid"]) == worker_pid


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "source"),
    [
        (["--log-format", "yaml"], {}, "command line"),
        ([], {"HERDER_LOG_FORMAT": "yaml"}, "environment"),
    ],
)
def test_an_unknown_log_format_exits_78_naming_the_key(
    tmp_path, args: list[str], env: dict[str, str], source: str
) -> None:
    r = run_herder("--redis-url", "redis://127.0.0.1:1/0", "--state-dir", str(tmp_path), *args, env=env)
    assert r.returncode == EX_CONFIG, r.stderr
    assert f"'log_format' from {source}" in r.stderr and "must be text or json, got 'yaml'" in r.stderr


@pytest.mark.slow
def test_herder_config_shows_the_log_format_from_the_environment() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
    env["HERDER_LOG_FORMAT"] = "json"
    r = subprocess.run([HERDER, "config"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^log_format +json +# environment \(HERDER_LOG_FORMAT\)$", r.stdout, re.M), r.stdout


# ---- the formatter itself, in this process ----------------------------------------------------


FIELDS = {"process": "worker", "pid": 42, "pool": "default", "slot": 3}


def relayed(line: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    out = jsonlog.relay_lines([line], "2026-11-25T01:30:00.103Z", fields or FIELDS)
    assert out.endswith("\n") and out.count("\n") == 1
    return json.loads(out)


def test_the_timestamp_is_utc_iso_with_milliseconds() -> None:
    assert jsonlog.iso_ts(1795570200.1036) == "2026-11-25T01:30:00.103Z"


@pytest.mark.parametrize("fields", [FIELDS, {}])
def test_a_text_line_is_its_fields_dumped_as_one_object(fields: dict[str, Any]) -> None:
    line = 'quotes " \\ tabs \t nul \x00 é \u2603'
    out = jsonlog.relay_lines([line, "second"], "2026-11-25T01:30:00.103Z", fields)
    docs = [{"ts": "2026-11-25T01:30:00.103Z", "level": "INFO", "msg": m, **fields} for m in (line, "second")]
    assert out == "".join(json.dumps(d) + "\n" for d in docs)


def test_herders_fields_never_overwrite_the_apps_and_move_aside_only_when_they_differ() -> None:
    doc = relayed(json.dumps({"pid": 42, "process": "billing", "herder_process": "x", "slot": 3}))
    assert doc["pid"] == 42 and "herder_pid" not in doc  # the same value: nothing to add
    assert doc["process"] == "billing" and doc["herder_process"] == "x"  # both the app's: herder's dropped
    assert doc["slot"] == 3 and doc["pool"] == "default" and doc["level"] == "INFO"


@pytest.mark.parametrize(
    "line",
    [
        '{"a": 1',
        '{"a": 1} trailing',
        "{}{}",
        '{"a": Infinity}',
        '{"deep": ' + "[" * 100_000 + "]" * 100_000 + "}",  # past every Python's limit (3.13 parses 3000)
        "{" + "\udcff" + "}",
        "\x00{not json}",
    ],
)
def test_anything_that_is_not_one_json_object_is_relayed_as_text(line: str) -> None:
    doc = relayed(line)
    assert doc["msg"] == line and doc["pid"] == 42 and doc["slot"] == 3


def test_an_exception_is_one_line_with_its_traceback_in_exc() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(jsonlog.JsonFormatter("master"))
    log = logging.getLogger("test_json_logs")
    log.addHandler(handler)
    log.propagate = False
    try:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            log.exception("it failed: %s", "why")
    finally:
        log.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["msg"] == "it failed: why" and doc["level"] == "ERROR" and doc["process"] == "master"
    assert doc["exc"].startswith("Traceback") and doc["exc"].endswith("ValueError: boom\nsecond line")


@pytest.mark.slow
def test_uncaught_exceptions_are_json_lines_too() -> None:
    code = (
        "import threading, warnings\n"
        "from herder.common import jsonlog\n"
        "jsonlog.setup('INFO', 'json', 'master', '%(message)s')\n"
        "t = threading.Thread(target=lambda: 1 / 0, name='reader'); t.start(); t.join()\n"
        "warnings.warn('careful')\n"
        "raise RuntimeError('the end')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    docs = [json.loads(line) for line in r.stderr.splitlines()]
    assert [d["level"] for d in docs] == ["CRITICAL", "WARNING", "CRITICAL"], r.stderr
    assert docs[0]["msg"] == "uncaught exception in thread reader" and "ZeroDivisionError" in docs[0]["exc"]
    assert "careful" in docs[1]["msg"]
    assert docs[2]["msg"] == "uncaught exception" and docs[2]["exc"].endswith("RuntimeError: the end")
