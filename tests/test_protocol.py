"""Unit tests of the pure protocol code: the parser and the bounded line splitter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.common.worker_protocol import LineSplitter, Message, ProtocolError, parse_line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"ready 42 1700000000.5 1", Message("ready", 1700000000.5, pid=42)),
        (b"ready 42 1700000000.5", Message("ready", 1700000000.5, pid=42)),
        (b"busy abc-1 10.0 180", Message("busy", 10.0, job_id="abc-1", timeout=180.0)),
        (b"busy abc-1 10.0 -1", Message("busy", 10.0, job_id="abc-1", timeout=-1.0)),
        (b"busy abc-1 10.0", Message("busy", 10.0, job_id="abc-1")),
        (b"beat abc-1 11.0", Message("beat", 11.0, job_id="abc-1")),
        (b"done abc-1 12.0 ok", Message("done", 12.0, job_id="abc-1", ok=True)),
        (b"done abc-1 12.0 failed", Message("done", 12.0, job_id="abc-1", ok=False)),
        (b"idle 13.25", Message("idle", 13.25)),
        (b"stop 14", Message("stop", 14.0)),
        (b"idle 13.25\r", Message("idle", 13.25)),
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
        (b"ready 1 1.0 2", "unsupported protocol version"),
        (b"\xff\xfe", "not UTF-8"),
        (b"busy " + b"j" * 300 + b" 1.0", "bad job id"),
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


def test_splitter_cuts_long_lines_and_drops_the_rest() -> None:
    s = LineSplitter(max_line=10)
    out = s.feed(b"x" * 25)
    out += s.feed(b"y" * 1000 + b"\nidle 1\n")
    assert out == [(b"x" * 10, True), (b"idle 1", False)]
    assert s.oversized == 1
    assert s.dropped_bytes == 15 + 1000


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
