"""What every part of scripts/bench/run shares: its errors, its progress lines, polling, medians
and the steady-state rate of a run."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]


class BenchError(Exception):
    """One run failed; the benchmark records it and goes on."""


class UsageError(Exception):
    """Options that do not go together: scripts/bench/run says so as argparse does, and exits 2."""


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C, through every `finally`."""


@dataclass
class Findings:
    """What the report lists besides the numbers."""

    problems: list[str] = field(default_factory=list)  # failures, and misbehaviour of a contender
    warnings: list[str] = field(default_factory=list)  # noise


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def p90(xs: list[float]) -> float:
    """Nearest-rank 90th percentile: the 9th of 10 sorted samples."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def steady_rate(ends: list[float]) -> float:
    """Jobs per second between the 10% and the 90% job done, from every job's end time, sorted."""
    n = len(ends)
    lo, hi = n // 10, n - 1 - n // 10
    return (hi - lo) / (ends[hi] - ends[lo]) if hi > lo and ends[hi] > ends[lo] else math.nan


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.01) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
