"""What the bench reads from herder's log: the master's lines about its workers, with their
millisecond timestamps (asctime, truncated to the millisecond, local time).

    2026-11-22 02:27:08,264 herder[3798] INFO slot 0 pid 3814: spawned -> starting
    2026-11-22 02:27:08,431 herder[3798] INFO slot 0 pid 3814: starting -> idle (ready)
    2026-11-22 02:27:11,999 herder[3798] INFO slot 0 pid 3814: idle -> stopping (SIGTERM)
    2026-11-22 02:27:12,015 herder[3798] INFO slot 0 pid 3814: stopping -> exited (exit code 0; stopped ...
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

LOG_TS = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) herder\[\d+\] \w+ slot \d+ pid (\d+): "
SPAWNED_RE = re.compile(LOG_TS + r"spawned -> ")
# Ready: `starting -> idle (ready)`, or `starting -> busy` when its `ready` and its first job's
# `busy` came in one read (a busy queue: the worker takes a job within a millisecond of ready).
READY_RE = re.compile(LOG_TS + r"starting -> (idle \(ready\)|busy\b)")
STOP_SENT_RE = re.compile(LOG_TS + r"\w+ -> stopping\b")  # the master has sent `stop` (or SIGTERM)
STOPPED_RE = re.compile(LOG_TS + r"\w+ -> exited \([^;]*; stopped as asked;")  # a graceful exit after a stop


def read_log(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def stamp(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first_times(lines: list[str], pattern: re.Pattern[str]) -> dict[int, float]:
    """pid -> epoch seconds of the first line matching `pattern` for that pid."""
    found: dict[int, float] = {}
    for line in lines:
        if m := pattern.match(line):
            found.setdefault(int(m[2]), stamp(m[1]))
    return found


def spawn_ready_times(lines: list[str]) -> tuple[dict[int, float], dict[int, float]]:
    """pid -> when the master logged it spawned; pid -> when it logged it ready."""
    return first_times(lines, SPAWNED_RE), first_times(lines, READY_RE)


def stop_times(lines: list[str]) -> dict[int, float]:
    """pid -> seconds from the master's `... -> stopping` line for that worker to its
    `-> exited (...; stopped as asked; ...)` line: how long a graceful stop of that worker took."""
    sent, stopped = first_times(lines, STOP_SENT_RE), first_times(lines, STOPPED_RE)
    return {pid: stopped[pid] - sent[pid] for pid in stopped if pid in sent}
