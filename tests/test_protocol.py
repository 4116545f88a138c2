"""Unit tests of the pure protocol code: both channels' formats and parsers, and the one
bounded line splitter."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.common import uplink_protocol as up
from herder.common import worker_protocol as wp
from herder.common.worker_protocol import LineSplitter, Message, ProtocolError, parse_line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"ready 42 1700000000.5 1", Message("ready", 1700000000.5)),
        (b"ready 42 1700000000.5", Message("ready", 1700000000.5)),
        (b"busy abc-1 10.0 180", Message("busy", 10.0, job_id="abc-1", timeout=180.0)),
        (b"busy abc-1 10.0 -1", Message("busy", 10.0, job_id="abc-1", timeout=-1.0)),
        (b"busy abc-1 10.0", Message("busy", 10.0, job_id="abc-1")),
        (
            b"busy abc-1 10.0 none bulk app.tasks.resize",
            Message("busy", 10.0, job_id="abc-1", queue="bulk", func="app.tasks.resize"),
        ),
        (
            b"busy abc-1 10.0 60 high f",
            Message("busy", 10.0, job_id="abc-1", timeout=60.0, queue="high", func="f"),
        ),
        (b"beat abc-1 11.0", Message("beat", 11.0, job_id="abc-1")),
        (b"beat abc-1 11.0 42.5", Message("beat", 11.0, job_id="abc-1", stuck=42.5)),
        (b"done abc-1 12.0 ok", Message("done", 12.0, job_id="abc-1", ok=True)),
        (b"done abc-1 12.0 failed", Message("done", 12.0, job_id="abc-1", ok=False)),
        # version 10: the job's CPU seconds
        (b"done abc-1 12.0 ok 0.0125", Message("done", 12.0, job_id="abc-1", ok=True, cpu=0.0125)),
        (b"done j 1 ok 0.5 0.25", Message("done", 1.0, job_id="j", ok=True, cpu=0.5, runq=0.25)),
        (b"idle 13.25", Message("idle", 13.25)),
        (b"stop 14", Message("stop", 14.0)),
        (b"idle 13.25\r", Message("idle", 13.25)),
        (
            b"wait 15.0 12.5 Redis at r.example:16390: connection refused",
            Message("wait", 15.0, waited=12.5, what="Redis at r.example:16390: connection refused"),
        ),
    ],
)
def test_parses_every_verb(line: bytes, expected: Message) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"", "empty"),
        (b"launch missiles", "unknown verb"),
        (b"busy", "wrong number of fields"),
        (b"idle soon", "bad timestamp"),
        (b"idle nan", "bad timestamp"),
        (b"idle -5", "bad timestamp"),
        (b"done j 1.0 maybe", "bad outcome"),
        (b"ready x 1.0", "bad pid"),
        (b"ready 1 1.0 11", "unsupported protocol version"),
        (b"wait 1.0 2.0", "wrong number of fields for 'wait'"),
        (b"wait 1.0 soon Redis", "bad timestamp"),
        (b"wait 1.0 2.0 " + b"x" * 400, "bad text in 'wait'"),
        (b"t0 busy j 1.0", "bad thread tag"),  # thread 0 goes untagged
        (b"t256 busy j 1.0", "bad thread tag"),
        (b"t1 ready 1 1.0", "bad thread tag"),  # the process's own lines carry no thread
        (b"t1", "bad thread tag"),
        (b"beat abc-1 11.0 -2", "bad timestamp"),
        (b"\xff\xfe", "not UTF-8"),
        (b"idle 1.0\xff", "not UTF-8"),
        (b"busy " + b"j" * 300 + b" 1.0", "bad job id"),
        (b"busy j 1.0 none q " + b"f" * 700, "bad queue or function name"),
        (b"busy j 1.0 none q%0A mod.f", "bad queue or function name"),  # decodes to a newline
    ],
)
def test_rejects_malformed_lines_with_a_reason(line: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        parse_line(line)


@given(st.binary(max_size=300))
def test_parser_never_raises_anything_but_protocol_error(data: bytes) -> None:
    try:
        parse_line(data)
    except ProtocolError:
        pass


def test_splitter_reassembles_lines_across_chunks() -> None:
    s = LineSplitter(max_line=100)
    assert s.feed(b"idle 1\nbu") == [(b"idle 1", False)]
    assert s.feed(b"sy j 2\n\nidle") == [(b"busy j 2", False), (b"", False)]
    assert s.flush() == b"idle"


@pytest.mark.parametrize("size", [0, 9, 10, 11, 40])
def test_splitter_takes_a_chunk_of_one_whole_line_as_any_other(size: int) -> None:
    """A chunk that is one whole line (a quiet pipe's usual read) is cut at the cap as in any
    other chunk, and a line begun in an earlier chunk is joined."""
    s = LineSplitter(max_line=10)
    assert s.feed(b"x" * size + b"\n") == [(b"x" * min(size, 10), size > 10)]
    assert s.feed(b"ab") == [] and s.feed(b"c\n") == [(b"abc", False)]
    assert s.flush() is None


def test_splitter_cuts_long_lines_and_drops_the_rest() -> None:
    s = LineSplitter(max_line=10)
    out = s.feed(b"x" * 25)
    out += s.feed(b"y" * 1000 + b"\nidle 1\n")
    assert out == [(b"x" * 10, True), (b"idle 1", False)]
    assert s.flush() is None


@given(st.lists(st.binary(max_size=200), max_size=50), st.integers(min_value=1, max_value=64))
def test_splitter_memory_is_bounded_and_lines_are_capped(chunks: list[bytes], cap: int) -> None:
    s = LineSplitter(max_line=cap)
    for chunk in chunks:
        for line, truncated in s.feed(chunk):
            assert len(line) <= cap
            assert b"\n" not in line
            assert truncated == (len(line) == cap and truncated)
        assert len(s._buf) <= cap


@given(st.lists(st.text(alphabet="abc ", max_size=20), max_size=20), st.integers(min_value=1, max_value=7))
def test_splitter_is_lossless_for_short_lines_whatever_the_chunking(lines: list[str], step: int) -> None:
    data = "".join(line + "\n" for line in lines).encode()
    s = LineSplitter(max_line=64)
    out = []
    for i in range(0, len(data), step):
        out += s.feed(data[i : i + step])
    assert [line.decode() for line, _ in out] == lines


@given(
    job=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=256),
    ts=st.floats(0, 4e9),
    timeout=st.one_of(st.none(), st.just(-1.0), st.integers(0, 10**6).map(float), st.floats(0.001, 1e6)),
    ok=st.booleans(),
    name=st.text(min_size=0, max_size=300),
)
def test_what_the_worker_writes_the_master_reads(
    job: str, ts: float, timeout: float | None, ok: bool, name: str
) -> None:
    """Both ends import one module: every line a worker can build parses back to its meaning."""
    lines = {
        wp.ready_line(42, ts): ("ready", None),
        wp.idle_line(ts): ("idle", None),
        wp.busy_line(job, ts, timeout): ("busy", job),
        wp.beat_line(job, ts): ("beat", job),
        wp.done_line(job, ts, ok): ("done", job),
        wp.stop_line(ts): ("stop", None),
    }
    for line, (verb, job_id) in lines.items():
        assert line.endswith(b"\n") and len(line) <= wp.MAX_LINE_BYTES
        msg = parse_line(line[:-1])
        assert (msg.verb, msg.job_id) == (verb, job_id)
        assert abs(msg.ts - ts) < 1e-5
    stuck = parse_line(wp.beat_line(job, ts, 12.34)[:-1])
    assert stuck.stuck == pytest.approx(12.3) and parse_line(wp.beat_line(job, ts)[:-1]).stuck == 0.0
    busy = parse_line(wp.busy_line(job, ts, timeout)[:-1])
    assert busy.timeout == (None if timeout is None else pytest.approx(timeout, rel=1e-9))
    # Version 5 names the queue and function; any name a user has comes through (version 7:
    # spaces and all, as RQ allows them), or as `?` when empty, unprintable or too long.
    named = parse_line(wp.busy_line(job, ts, timeout, name, "mod.f")[:-1])
    assert named.timeout == busy.timeout and named.func == "mod.f"
    fits = len(quote(name, safe=wp.NAME_SAFE)) <= wp.MAX_FIELD
    assert named.queue == (name if name and len(name) <= wp.MAX_NAME and name.isprintable() and fits else "?")
    assert len(wp.busy_line(job, ts, timeout, name, name)) <= wp.MAX_LINE_BYTES
    assert parse_line(wp.done_line(job, ts, ok)[:-1]).ok is ok
    lines = (wp.STOP, wp.PAUSE, wp.RESUME, b"stopp\n", wp.end_request(job), b"end\n", b"end a b\n", wp.RETIRE)
    assert [wp.master_request(x) for x in lines] == [
        ("stop", None), ("pause", None), ("resume", None), None, ("end", job), None, None, ("retire", None)
    ]  # fmt: skip
    for thread in (1, 7, wp.MAX_THREADS - 1):  # version 8: a thread's busy, beat and done
        for line in (
            wp.busy_line(job, ts, timeout, "q", "m.f"),
            wp.beat_line(job, ts),
            wp.done_line(job, ts, ok),
        ):
            tagged = parse_line(wp.for_thread(line, thread)[:-1])
            assert (tagged.thread, tagged.job_id) == (thread, job) and tagged == replace(
                parse_line(line[:-1]), thread=thread
            )
    assert wp.for_thread(wp.beat_line(job, ts), 0) == wp.beat_line(job, ts)  # thread 0 untagged
    ended = parse_line(wp.done_line(job, ts, None)[:-1])
    assert ended.verb == "done" and ended.ok is None  # an ending: neither ok nor failed
    for paused in wp.PAUSE_REASONS:  # version 9: `retiring` among them
        assert parse_line(wp.idle_line(ts, paused)[:-1]).paused == paused
    assert parse_line(wp.idle_line(ts)[:-1]).paused is None
    with pytest.raises(ProtocolError):
        parse_line(b"idle 1.0 napping")
    # Version 9: what a worker waits for, any text it has: one printable line, cut to size.
    waiting = parse_line(wp.wait_line(ts, 3.04, f"Redis: {name}")[:-1])
    assert waiting.verb == "wait" and waiting.waited == pytest.approx(3.0)
    assert waiting.what == " ".join(f"Redis: {name}".split())[: wp.MAX_WAIT_TEXT] or not name.isprintable()
    assert len(waiting.what or "") <= wp.MAX_WAIT_TEXT and (waiting.what or "").isprintable()


def test_what_the_master_writes_the_watchdog_reads() -> None:
    assert up.parse_uplink(up.ready_line(7, 1.0)[:-1]) == up.UplinkMessage("ready")
    assert up.parse_uplink(up.alive_line(1.0)[:-1]) == up.UplinkMessage("alive")
    assert up.parse_uplink(up.status_line("3/4  workers,\n 1 busy")[:-1]) == up.UplinkMessage(
        "status", "3/4 workers, 1 busy"
    )
    assert up.parse_uplink(up.reloading_line(1.0)[:-1]).verb == "reloading"  # type: ignore[union-attr]
    assert up.parse_uplink(up.stopping_line(1.0)[:-1]).verb == "stopping"  # type: ignore[union-attr]
    assert up.parse_uplink(b"bogus 1") is None
    assert len(up.status_line("x" * 10_000)) <= up.MAX_STATUS + 10
