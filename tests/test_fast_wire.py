"""The fast path's framing (herder.worker.fast_path.wire) encodes each argument as redis-py's
encoder does: its inlined cases (str, bytes, int, float) and the rest through redis-py."""

from __future__ import annotations

import math
from typing import Any

import pytest
from redis.connection import Encoder
from redis.exceptions import DataError

from herder.worker.fast_path.wire import Framed, _framed, framed_fields, make_encoder

VALUES: list[Any] = [
    "text", "é ünï", "", b"\x00bytes", 0, -7, 2**70, 1.5, 1795845020.458020, -0.0, 1e-300, 1e300,
    math.inf, -math.inf, 3.0, 0.1 + 0.2, bytearray(b"ba"), memoryview(b"mv"),
]  # fmt: skip


class FloatSub(float):
    def __repr__(self) -> str:
        return "not redis-py's"


def stable_id(value: Any) -> str:
    """A test id the same in every process (pytest-xdist compares them): no object address."""
    return (
        f"{type(value).__name__}:{bytes(value)!r}"
        if isinstance(value, memoryview)
        else (repr(value) if type(value).__repr__ is not object.__repr__ else type(value).__name__)
    )


@pytest.mark.parametrize("value", [*VALUES, FloatSub(2.5)], ids=stable_id)
def test_each_argument_is_redis_pys_bytes(value: Any) -> None:
    redis_py = Encoder("utf-8", "strict", False)
    encode = make_encoder(redis_py)
    assert bytes(encode(value)) == bytes(redis_py.encode(value))
    framed = Framed(_framed([value], encode), 1, 0)
    data = framed.data
    want = bytes(redis_py.encode(value))
    assert data == b"$%d\r\n%b\r\n" % (len(want), want)


@pytest.mark.parametrize("value", [True, None, object()], ids=stable_id)
def test_what_redis_py_refuses_is_refused(value: Any) -> None:
    encode = make_encoder(Encoder("utf-8", "strict", False))
    with pytest.raises(DataError):
        encode(value)
    with pytest.raises(DataError):
        _framed([value], encode)


FIELDS: list[dict[Any, Any]] = [
    {},
    {"status": "finished", "data": b"\x00\x01", "timeout": 180, "score": 1.25, "é": "ü"},
    {"status": "finished", "data": b"other", "timeout": -1, "score": 2.5, "é": ""},  # the names kept
    {"x" * 600: "y" * 600, b"bytes name": 1},  # long headers, a name not a str
]


@pytest.mark.parametrize("fields", FIELDS, ids=range(len(FIELDS)))
@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_mapping_is_framed_as_its_flat_list(fields: dict[Any, Any], encoding: str) -> None:
    """framed_fields (a job hash's fields, its names' framing kept) gives _framed's bytes for
    the flat key, value list, twice (the second time from the kept names)."""
    encode = make_encoder(Encoder(encoding, "strict", False))
    flat = [x for pair in fields.items() for x in pair]
    for _ in range(2):
        assert framed_fields(fields, encode) == (_framed(flat, encode), len(flat))
