"""Every input surface a stranger controls, fuzzed with hypothesis: a worker's stdout, the
control socket, config files and flags, and queue and function names on the wire.

Each property has a fixed budget (EXAMPLES below) so CI's run is bounded; HERDER_FUZZ_SCALE=N
multiplies every budget for a long run (docs/development.md, "Fuzzing", gives the command and
the figures).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import string
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness import free_port, wait_for
from herder.common import config as cfg_module
from herder.common.control_protocol import MAX_REQUEST, socket_path
from herder.common.worker_protocol import (
    MAX_FIELD,
    MAX_LINE_BYTES,
    NAME_SAFE,
    ProtocolError,
    busy_line,
    done_line,
    for_thread,
    idle_line,
    parse_line,
    ready_line,
    stop_line,
    wait_line,
)
from herder.supervisor.children.dispatchers import StdoutReader
from herder.supervisor.children.observations import Observations
from herder.supervisor.ctl.cli import cli

SCALE = max(1, int(os.environ.get("HERDER_FUZZ_SCALE", "1")))


def budget(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# ---- the worker protocol: any bytes on a worker's stdout -----------------------------------


class FakeWorker:
    """What the stdout reader writes to (dispatchers.Piped), without a process."""

    label = "fuzz"

    def __init__(self) -> None:
        self.obs = Observations(last_seen=0.0)
        self.lock = threading.Lock()
        self.finished: deque = deque(maxlen=1000)
        self.stdout_done = threading.Event()

    stdout = stderr = None

    @contextlib.contextmanager
    def changing(self) -> Iterator[Observations]:
        with self.lock:
            yield self.obs

    def json_fields(self) -> dict[str, Any]:
        return {}


def state_of(obs: Observations) -> dict[str, Any]:
    """What a line may change, less the receipt times (each run reads its own clock) and the
    error counters a malformed line is meant to move."""
    state = asdict(obs)
    for key in (
        "last_seen",
        "eof_at",
        "busy_seconds",
        "malformed",
        "oversized",
        "last_error",
        "throttled",
        "ready_refused",
    ):
        state.pop(key)
    state["jobs"] = {t: (h["job_id"], h["timeout"], h["queue"], h["func"]) for t, h in state["jobs"].items()}
    return state


job_ids = st.text(alphabet=string.ascii_letters + string.digits + "-_:", min_size=1, max_size=40)
stamps = st.floats(min_value=0, max_value=2e9, allow_nan=False)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)  # a job's CPU and run-queue wait
names = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=60)
valid_lines = st.one_of(
    st.builds(ready_line, st.integers(1, 2**22), stamps),
    st.builds(idle_line, stamps, st.sampled_from([None, "paused", "suspended"])),
    st.builds(busy_line, job_ids, stamps, st.one_of(st.none(), st.integers(1, 3600)), names, names),
    st.builds(done_line, job_ids, stamps, st.sampled_from([True, False, None])),
    st.builds(done_line, job_ids, stamps, st.booleans(), seconds, st.one_of(st.none(), seconds)),  # v10
    st.builds(stop_line, stamps),
).map(lambda line: line.rstrip(b"\n"))
threaded_lines = st.builds(
    for_thread,
    st.one_of(
        st.builds(busy_line, job_ids, stamps, st.none()),
        st.builds(done_line, job_ids, stamps, st.booleans()),
    ),
    st.integers(1, 8),
).map(lambda line: line.rstrip(b"\n"))
# Garbage a worker (or a job that wrote to the wrong descriptor) may send, one line each.
garbage_lines = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.builds(
        lambda v, rest: f"{v} {rest}".encode(),
        st.sampled_from(["ready", "busy", "done", "idle", "stop", "beat", "t1", "t999"]),
        st.text(max_size=80),
    ),  # fmt: skip
).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))


def is_malformed(line: bytes) -> bool:
    try:
        parse_line(line)
    except ProtocolError:
        return True
    return False


@pytest.mark.slow
@budget(300)
@given(
    st.lists(st.one_of(valid_lines, threaded_lines), max_size=30),
    st.lists(garbage_lines, max_size=30),
    st.randoms(),
    st.integers(1, 64),
)
def test_any_bytes_on_a_workers_stdout_are_parsed_or_counted(valid, garbage, rng, chunk) -> None:
    """Garbage interleaved with a worker's valid lines, in chunks of any size: the reader never
    raises, counts every malformed line, and ends in the same state as from the valid lines
    alone: a malformed line changes nothing."""
    garbage = [g for g in garbage if is_malformed(g)]  # a random line may happen to be valid
    mixed = [*valid, *garbage]
    rng.shuffle(mixed)
    # The valid lines keep their order among themselves: only garbage is slotted in between.
    order = iter(valid)
    mixed = [m if m in garbage else next(order) for m in mixed]

    def feed(lines: list[bytes]) -> FakeWorker:
        worker = FakeWorker()
        reader = StdoutReader(worker, lambda: None)
        data = b"".join(line + b"\n" for line in lines)
        for i in range(0, len(data), chunk):
            reader.feed(data[i : i + chunk], now=0.0)
        return worker

    clean, noisy = feed(valid), feed(mixed)
    assert state_of(noisy.obs) == state_of(clean.obs)
    long_ones = sum(len(g) > MAX_LINE_BYTES for g in garbage)
    assert noisy.obs.malformed + noisy.obs.oversized == len(garbage) + clean.obs.malformed, (long_ones,)


# An `idle` line in every shape a worker or a stray write may give it, valid or not.
idle_like = st.one_of(
    st.builds(idle_line, stamps, st.sampled_from([None, "paused", "suspended"])),
    st.sampled_from(["nan", "-1", "-0", "inf", "1e3", "1_0", " 1", "1 ", "1\t", "0x1", "\u0661", ""]).map(
        lambda ts: f"idle {ts}\n".encode()
    ),
    st.binary(max_size=24).map(lambda rest: b"idle " + rest.replace(b"\n", b" ") + b"\n"),
    st.binary(max_size=24).map(lambda rest: b"idle " + rest),  # a line cut by the pipe, or two
)
before_idle = st.lists(
    st.one_of(valid_lines, st.builds(wait_line, stamps, seconds, st.sampled_from(["Redis", "a name"]))),
    max_size=4,
)


@pytest.mark.slow
@budget(300)
@given(before_idle, st.binary(max_size=6), idle_like)
def test_an_idle_line_read_the_short_way_changes_what_the_general_way_does(
    before: list[bytes], tail: bytes, chunk: bytes
) -> None:
    """The stdout reader's short way for an idle fleet's `idle <ts>` (alive) against every line
    parsed and recorded (record): the same state, counters, error, answer and activity, after
    any lines, a wait or a pause, and a piece of a line already held."""

    def read(short: bool) -> tuple[Any, ...]:
        worker = FakeWorker()
        reader = StdoutReader(worker, lambda: None)
        if not short:
            reader.alive = lambda chunk: False  # type: ignore[method-assign]
        for line in before:
            reader.feed(line.rstrip(b"\n") + b"\n", now=0.0)
        reader.feed(tail.replace(b"\n", b" "), now=0.0)
        worker.obs.last_seen = -1.0
        answer = reader.feed(chunk, now=0.0)
        obs, said = worker.obs, (answer, reader.active, reader.lines)
        state = state_of(obs)
        if state["waiting"]:
            state["waiting"].pop("since")  # a receipt time, of each run's own clock
        return state, obs.last_seen >= 0, obs.malformed, obs.last_error, said

    assert read(short=True) == read(short=False)


@budget(500)
@given(names, names)
@example("\U0001f600" * 55, "jobs.f")  # printable, 55 characters, but 660 once encoded: `?`
def test_queue_and_function_names_survive_the_wire(queue: str, func: str) -> None:
    """Any printable name RQ accepts (up to the protocol's 200 characters, and 600 once
    percent-encoded: MAX_FIELD) comes out of a busy line exactly as it went in; any other is
    `?`, never an error."""
    msg = parse_line(busy_line("job-1", 1.0, None, queue, func).rstrip(b"\n"))
    for sent, got in ((queue, msg.queue), (func, msg.func)):
        if sent.isprintable() and len(quote(sent, safe=NAME_SAFE)) <= MAX_FIELD:
            assert got == sent
        else:
            assert got == "?"


# ---- config files and flags ---------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML's basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=40),
)
toml_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
setting_keys = st.one_of(st.sampled_from(sorted(cfg_module.KEYS)), st.text(max_size=20))
plausible = st.one_of(  # values near what a key takes, so validation, not only typing, is reached
    st.integers(-5, 10**9), st.sampled_from(["0", "1", "-1", "1e9", "abc", "", "default", "redis://x"])
)


@st.composite
def config_files(draw: st.DrawFn) -> str:
    table = draw(st.dictionaries(setting_keys, st.one_of(toml_values, plausible), max_size=6))
    lines = ["[herder]", *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items())]
    if draw(st.booleans()):  # pools: a table of tables, any names, any settings
        tables = st.dictionaries(setting_keys, toml_values, max_size=3)
        pools = draw(st.dictionaries(st.text(max_size=12), tables, max_size=3))
        for name, settings_ in pools.items():
            lines.append(f"[pools.{json.dumps(name)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in settings_.items()]
    if draw(st.integers(0, 9)) == 0:  # sometimes not TOML at all
        lines.append(draw(st.text(max_size=40)))
    return "\n".join(lines) + "\n"


def assert_valid_or_78(result: Any) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 78), result.output
    if result.exit_code == 78:  # the key as Python quotes it: 'workers', or "pools.'" for a quote in it
        assert re.search(r"config key ('[^']*'|\"[^\"]*\") from ", result.output), result.output


@pytest.mark.slow
@budget(300)
@given(text=config_files())
@example(text='[herder]\n[pools."\'"]\n')  # found by a long run: a quote in a pool's name
def test_any_config_file_is_a_config_or_exit_78_naming_the_key(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("conf") / "herder.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    result = CliRunner().invoke(cli, ["config", "--config", str(path)], env={"HERDER_CONFIG": None})
    assert_valid_or_78(result)


flag_keys = sorted(k for k in cfg_module.KEYS if k not in ("pools",))
BOOLEAN_KEYS = {k for k in flag_keys if isinstance(getattr(cfg_module.Config(), k), bool)}


@pytest.mark.slow
@budget(300)
@given(
    st.lists(
        st.tuples(st.sampled_from(flag_keys), st.text(max_size=30), st.booleans()), min_size=1, max_size=4
    )
)
@example([("worker_command", "'", False)])  # found by a long run: an unclosed quote was a traceback
def test_any_flag_or_variable_is_a_config_or_exit_78_naming_the_key(
    given_: list[tuple[str, str, bool]],
) -> None:
    """Any value for any setting, as a flag or as its HERDER_* variable (a boolean's flag takes
    no value: its variable does)."""
    argv, env = ["config"], {"HERDER_CONFIG": None}
    for key, value, as_flag in given_:
        value = value.replace("\x00", "")
        if as_flag and key not in BOOLEAN_KEYS:
            argv.append(f"{cfg_module.flag_of(key)}={value}")
        else:
            env[cfg_module.env_of(key)] = value
    result = CliRunner().invoke(cli, argv, env=env)
    if result.exit_code == 2:  # click's own, for --workers: a value that is no count (UsageError)
        assert "Invalid value for '--workers'" in result.output, result.output
        return
    assert_valid_or_78(result)


# ---- the control socket: any bytes from a client ------------------------------------------

COMMANDS = ["status", "scale", "restart", "pause", "resume", "reload", "enqueue", "ping", "nope"]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
requests = st.one_of(
    st.binary(max_size=400),
    json_values.map(lambda v: json.dumps(v).encode() + b"\n"),
    st.builds(
        lambda cmd, rest: json.dumps({**rest, "cmd": cmd}).encode() + b"\n",
        st.one_of(st.sampled_from(COMMANDS), st.text(max_size=12)),
        st.dictionaries(
            st.sampled_from(["pool", "workers", "min", "max", "func", "args", "queue", "timeout"]),
            json_values,
            max_size=4,
        ),  # fmt: skip
    ),
    st.just(b"x" * (MAX_REQUEST + 10)),
)


def send_all_read_all(s: socket.socket, data: bytes) -> bytes:
    """Send a whole request, then read until the peer closes: its whole answer."""
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the peer hung up on an oversized request: that is an answer too
    reply = b""
    while chunk := s.recv(65536):
        reply += chunk
    return reply


def exchange(state_dir: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(socket_path(state_dir))
        return send_all_read_all(s, data)


@pytest.mark.slow
def test_the_control_socket_survives_any_client(herder, tmp_path: Path) -> None:
    """Whatever a client sends, it gets a JSON answer (or, past the size cap, a closed
    connection), and the master stays up and serves the next request."""
    h = herder(workers="1", workers_limit="3", queue=["fuzz-only"])
    h.wait_workers(1)
    master = h.master()
    tried = {"n": 0}

    @budget(150)
    @given(requests)
    def survive(data: bytes) -> None:
        tried["n"] += 1
        if b'"stop"' in data:
            return  # the one request that may end the master: its own tests cover it
        reply = exchange(h.state_dir, data)
        if reply or len(data) <= MAX_REQUEST:  # past the cap the master may hang up mid-send
            answer = json.loads(reply)
            assert isinstance(answer, dict) and "ok" in answer, answer
            if not answer["ok"]:
                assert isinstance(answer.get("error"), str) and answer["error"]
        assert json.loads(exchange(h.state_dir, b'{"cmd": "ping"}\n'))["ok"]

    survive()
    assert tried["n"] >= 150 * SCALE
    assert h.master().pid == master.pid, "the master was replaced"
    wait_for(lambda: h.status().get("ok"), 10, what="status after the fuzz")
    h.stop_and_check()


# ---- the HTTP endpoint: any method, path, header and body ---------------------------------

MARK = "<x-fuzz-mark"  # in every path: an answer that carries it raw echoed input unescaped
ALLOWED_CODES = {200, 400, 403, 404, 405, 414, 431, 501}  # 501: a method HTTP does not define
methods = st.one_of(
    st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    st.text(string.ascii_uppercase, min_size=1, max_size=10),
)
paths = st.one_of(
    st.sampled_from(["/", "/healthz", "/metrics", "/api/snapshot", "/api/history", "/api/hosts", "/api/login",
                     "/api/command", "/static/app.js", "/static/../../etc/passwd", "/static/%2e%2e/x"]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=60).map(lambda p: "/" + p),
).flatmap(lambda p: st.sampled_from([p, f"{p}?since={MARK}>", f"{p}{MARK}>"]))  # fmt: skip
headers = st.dictionaries(
    st.sampled_from(["Content-Length", "Cookie", "X-CSRF-Token", "Content-Type", "Host", "X-Any"]),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    max_size=4,
)
bodies = st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()))


def http_exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=8) as s:
        return send_all_read_all(s, raw)


@pytest.mark.slow
def test_the_http_endpoint_answers_any_request_without_a_500_or_an_echo(herder, tmp_path: Path) -> None:
    """With controls on (a token), any request line, headers and body get one of the expected
    codes within the endpoint's deadline, never a 5xx but 501, never input echoed raw; the
    endpoint and the master serve on afterwards."""
    token_file = tmp_path / "token"
    token_file.write_text("fuzz-token-0123456789\n")
    token_file.chmod(0o600)
    port = free_port()
    h = herder(workers="1", http=str(port), http_token_file=str(token_file), queue=["fuzz-only"])
    h.wait_workers(1)
    master = h.master()
    wait_for(lambda: b" 200 " in http_exchange(port, b"GET /api/snapshot HTTP/1.0\r\n\r\n")[:20], 10,
             what="a published snapshot")  # fmt: skip
    codes: dict[int, int] = {}

    @budget(200)
    @given(methods, paths, headers, bodies)
    def answer(method: str, path: str, hdrs: dict[str, str], body: bytes) -> None:
        lines = [f"{method} {path} HTTP/1.0", *(f"{k}: {v}" for k, v in hdrs.items())]
        if "Content-Length" not in hdrs and body:
            lines.append(f"Content-Length: {len(body)}")
        reply = http_exchange(port, "\r\n".join(lines).encode() + b"\r\n\r\n" + body)
        assert reply.startswith(b"HTTP/1."), reply[:200]
        code = int(reply.split(b" ", 2)[1])
        codes[code] = codes.get(code, 0) + 1
        assert code in ALLOWED_CODES, reply[:500]
        assert MARK.encode() not in reply, reply[:500]

    answer()
    assert sum(codes.values()) >= 200 * SCALE, codes
    assert b" 200 " in http_exchange(port, b"GET /api/snapshot HTTP/1.0\r\n\r\n")[:20]
    assert h.master().pid == master.pid, "the master was replaced"
    h.stop_and_check()


# ---- names end to end: a queue named as RQ allows keeps its name everywhere -----------------

RECORD = "herder_testjobs.record"  # tests/jobs: records its run in Redis
queue_names = st.text(
    st.characters(exclude_categories=["Cs", "Cc", "Zl", "Zp"], exclude_characters=","),
    min_size=1,
    max_size=40,
).filter(lambda s: s.strip() == s and s.isprintable())


def queue_labels(port: int) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    text = http_exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n").split(b"\r\n\r\n", 1)[1].decode()
    return {
        s.labels["queue"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "herder_job_duration_seconds_count" and "queue" in s.labels
    }


@pytest.mark.slow
def test_any_queue_name_survives_status_metrics_and_the_dashboard(herder, conn) -> None:
    """A job on a queue of any printable name (but a comma, herder's list separator) runs, and
    status, the per-function metrics and the dashboard's snapshot name the queue exactly."""
    from rq import Queue

    tried = []

    @budget(4)
    @given(queue_names)
    @example('<img src=x onerror=alert(1)> "q" \\ é 名')
    def survives(name: str) -> None:
        tried.append(name)
        port = free_port()
        h = herder(workers="1", http=str(port), queue=name, no_scheduler=True)
        h.wait_workers(1)
        job = Queue(name, connection=conn).enqueue(RECORD, f"named{len(tried)}", 0.0)
        wait_for(lambda: job.get_status(refresh=True) == "finished", 30, what=f"the job on {name!r}")
        h.wait_status(lambda s: [q["name"] for q in s["queues"]] == [name] and s["jobs"]["ok"] == 1, 10)
        wait_for(lambda: name in queue_labels(port), 10, what=f"{name!r} as a metrics label")
        snapshot = json.loads(
            http_exchange(port, b"GET /api/snapshot HTTP/1.0\r\n\r\n").split(b"\r\n\r\n", 1)[1]
        )
        assert snapshot["pools"][0]["queues"] == [name]
        h.stop_and_check()

    survives()
    assert len(tried) >= 4
