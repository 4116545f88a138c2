"""The master's log: one line per event on stderr, and the relay of workers' stderr into it.

A busy fleet's workers write a few log lines per job (RQ's own), so relaying them is the
master's largest per-job cost. Going through `logging` record by record cost about 0.3 ms
of CPU per job (measured by scripts/bench/run); the relay writes each chunk a worker sends as
one write, in the same format, under the handler's lock so lines never interleave. In JSON
(`log_format = "json"`, herder.common.jsonlog) each line is one json.dumps, still no LogRecord.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any

from herder.common import jsonlog

FORMAT = "%(asctime)s herder[%(process)d] %(levelname)s %(message)s"
log = logging.getLogger("herder")
json_lines = False  # log_format = "json": set once, by setup()


def setup(level: str, log_format: str = jsonlog.TEXT) -> None:
    global json_lines
    json_lines = log_format == jsonlog.JSON
    jsonlog.setup(level, log_format, "master", FORMAT)


_held: list[str] = []  # relayed text waiting for the pipe hub's end of pass (flush_held)
_held_lock = threading.Lock()


def flush_held() -> None:
    """Write what `relay(..., hold=True)` kept, as one write: the pipe hub calls it after each
    pass, so a big fleet's lines cost one write a pass, not one a worker."""
    with _held_lock:
        if not _held:
            return
        text = "".join(_held)
        _held.clear()
    _write(text)


@functools.lru_cache(maxsize=4)
def _second(epoch: int) -> str:
    """The date and time of an epoch second, as logging's asctime shows it: formatted once a
    second, not once a chunk (with many workers the relay sees many small chunks)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def relay(prefix: str, lines: list[str], fields: dict[str, Any] | None = None, hold: bool = False) -> None:
    """Log `lines` from a worker (already decoded, without newlines) at INFO, prefixed; in
    JSON, each line carries `fields` (process, pid, pool, slot, job_id) instead of the prefix.
    `hold`: keep them for flush_held (the pipe hub's end of pass)."""
    if not lines or not log.isEnabledFor(logging.INFO):
        return
    handlers = logging.getLogger().handlers
    if not handlers or not isinstance(handlers[0], logging.StreamHandler):
        for line in lines:  # an unusual logging setup: take the slow, general path
            log.info("%s: %s", prefix, line)
        return
    now = time.time()
    if json_lines:
        text = jsonlog.relay_lines(lines, jsonlog.iso_ts(now), fields or {"process": prefix})
    else:
        stamp = _second(int(now)) + f",{int(now % 1 * 1000):03d}"
        head = f"{stamp} herder[{os.getpid()}] INFO {prefix}: "
        text = "".join(f"{head}{line}\n" for line in lines)
    if hold:
        with _held_lock:
            _held.append(text)
        return
    _write(text)


def _write(text: str) -> None:
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    with handler.lock:  # StreamHandler always creates one
        try:
            handler.stream.write(text)
            handler.stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone: nothing sensible to do from a reader thread
