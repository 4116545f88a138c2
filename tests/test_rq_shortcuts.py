"""herder.worker.fast_path.shortcuts: each shortcut answers exactly as RQ's own function.

Pure functions against RQ's originals (no Redis): the common case and every edge where the
shortcut hands over to RQ. The whole job's Redis state is compared with RQ's SimpleWorker in
tests/test_fast_path.py.
"""

from __future__ import annotations

import datetime as dt
import random
import sys

import pytest
import rq.job
import rq.serializers
import rq.utils
from rq.serializers import JSONSerializer

from herder.worker.fast_path import shortcuts as rq_shortcuts

UTC = dt.UTC
RQ_FORMAT = rq.utils.utcformat
RQ_PARSE = rq.utils.utcparse


class Stamp(dt.datetime):
    """A datetime subclass that formats itself: the shortcut must leave it to RQ."""

    def strftime(self, fmt: str) -> str:
        return "its own"


def sample_datetimes() -> list[dt.datetime]:
    rng = random.Random(19)
    plus_one = dt.timezone(dt.timedelta(hours=1))
    fixed = [
        dt.datetime(2026, 1, 2, 3, 4, 5, 0, tzinfo=UTC),
        dt.datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(2026, 6, 1, 12, 0, 0, 7),  # naive
        dt.datetime(2026, 6, 1, 12, 0, 0, 7, tzinfo=plus_one),  # another zone: its wall time
        dt.datetime(1000, 1, 1, tzinfo=UTC),
        dt.datetime(999, 1, 1, tzinfo=UTC),  # RQ's own (strftime's padding of a short year)
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        Stamp(2026, 1, 1),
    ]
    drawn = [
        dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=rng.randrange(10**17))
        for _ in range(2000)
    ]
    return fixed + drawn


@pytest.mark.parametrize("value", sample_datetimes()[:8], ids=str)
def test_a_timestamp_is_formatted_as_rq_formats_it(value: dt.datetime) -> None:
    assert rq_shortcuts.fast_utcformat(RQ_FORMAT)(value) == RQ_FORMAT(value)


def test_drawn_timestamps_are_formatted_and_parsed_back_as_rq_does() -> None:
    fmt, parse = rq_shortcuts.fast_utcformat(RQ_FORMAT), rq_shortcuts.fast_utcparse(RQ_PARSE)
    for value in sample_datetimes()[8:]:
        text = fmt(value)
        assert text == RQ_FORMAT(value)
        assert parse(text) == RQ_PARSE(text)
        assert parse(text).tzinfo is RQ_PARSE(text).tzinfo


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-25T10:00:00.123456Z",
        "2026-11-25T10:00:00Z",  # RQ's older format, without the fraction
        "2026-11-25T10:00:00.1Z",  # a short fraction: strptime takes it
        "0999-01-01T00:00:00.000000Z",
        "２０２６-11-25T10:00:00.000000Z",  # non-ASCII digits: strptime takes them, RQ's function here
    ],
)
def test_a_timestamp_is_parsed_as_rq_parses_it(text: str) -> None:
    ours = rq_shortcuts.fast_utcparse(RQ_PARSE)(text)
    assert (ours, ours.tzinfo) == (RQ_PARSE(text), RQ_PARSE(text).tzinfo)


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-25T24:00:00.000000Z",  # fromisoformat and strptime disagree on neither: RQ's error
        "2026-02-30T00:00:00.000000Z",
        "2026-11-25T23:59:60.000000Z",
        "2026-11-25 10:00:00.000000Z",  # fromisoformat would take a space, strptime not
        "2026-11-25T10:00:00.000000+00:00",
        "",
    ],
)
def test_a_malformed_timestamp_raises_rqs_own_error(text: str) -> None:
    with pytest.raises(ValueError) as rqs:
        RQ_PARSE(text)
    with pytest.raises(ValueError) as ours:
        rq_shortcuts.fast_utcparse(RQ_PARSE)(text)
    assert str(ours.value) == str(rqs.value)


def test_the_serializer_check_is_rqs_answer_kept_per_serializer() -> None:
    calls: list[object] = []

    def original(serializer: object = None) -> object:
        calls.append(serializer)
        return rq.serializers.resolve_serializer(serializer)

    resolve = rq_shortcuts.remember_resolved_serializers(original)
    assert resolve(None) is resolve(None) is rq.serializers.resolve_serializer(None)
    assert resolve(JSONSerializer) is rq.serializers.resolve_serializer(JSONSerializer)
    assert calls == [None, JSONSerializer]  # each asked of RQ once
    unhashable: list[object] = []
    assert resolve(unhashable) is rq.serializers.resolve_serializer(unhashable)
    resolve(unhashable)
    assert calls[-2:] == [unhashable, unhashable]  # never kept: RQ's answer each time


def test_install_binds_the_shortcuts_into_rqs_modules_once() -> None:
    names = ("resolve_serializer", "utcformat", "utcparse")
    originals = {
        "resolve_serializer": rq.serializers.resolve_serializer,
        "utcformat": rq.utils.utcformat,
        "utcparse": rq.utils.utcparse,
    }
    try:
        rq_shortcuts.install()
        for name in names:
            bound = [
                m
                for m in list(sys.modules.values())
                if m and m.__name__.startswith("rq.") and hasattr(m, name)
            ]
            assert bound, name
            for module in bound:  # every rq module that had RQ's function has the shortcut
                assert getattr(getattr(module, name), "herder_shortcut", False), (module.__name__, name)
        formatted = rq.utils.utcformat
        rq_shortcuts.install()
        assert rq.utils.utcformat is formatted  # not wrapped twice
        value = dt.datetime(2026, 11, 25, 10, 0, 0, 42, tzinfo=UTC)
        assert rq.utils.str_to_date(rq.job.utcformat(value).encode()) == value  # rq.utils' own callers too
    finally:
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("rq"):
                for name in names:
                    if getattr(getattr(module, name, None), "herder_shortcut", False):
                        setattr(module, name, originals[name])
