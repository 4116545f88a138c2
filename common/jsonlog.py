"""The log's two shapes (`log_format`): text, or one JSON object per line. Standard library
only: the watchdog and the master both set their logging up here, so they write the same shape.

A JSON line carries `ts` (ISO 8601, UTC, milliseconds), `level`, `msg`, `process` (watchdog,
master, worker, scheduler, forkserver) and `pid`; an exception logged with its traceback adds
`exc`, never extra lines. A line the master relays from a worker's stderr adds `pool`, `slot`
and `job_id` (the job the worker was running when the master read it, best effort). A relayed
line that is itself a JSON object keeps its own fields at the top level: herder adds its own
beside them and never over them. Where the app already has one of herder's keys with another
value, herder's value goes under `herder_<key>` (or nowhere, if the app has that key too).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

TEXT, JSON = "text", "json"
FORMATS = (TEXT, JSON)


def iso_ts(t: float) -> str:
    """2026-11-25T01:30:00.103Z: UTC with milliseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def dumps(doc: dict[str, Any]) -> str:
    """One line of JSON (ASCII: whatever the journal or terminal's encoding, it stays valid)."""
    return json.dumps(doc, default=str)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python reads them, strict readers do not


def app_object(text: str) -> dict[str, Any] | None:
    """The line as a JSON object, if it is exactly one (else None: it is relayed as text)."""
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def merge(app: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """The app's object with herder's fields beside its own, never over them: a key the app
    has with another value moves herder's value to `herder_<key>`, if that is free."""
    for key, value in ours.items():
        if key not in app:
            app[key] = value
        elif app[key] != value and f"herder_{key}" not in app:
            app[f"herder_{key}"] = value
    return app


def relay_lines(lines: list[str], ts: str, fields: dict[str, Any], level: str = "INFO") -> str:
    """Relayed lines (each without its newline) as JSON lines, newline-terminated: a text
    line in `msg`, a JSON object merged with herder's fields."""
    # A text line is json.dumps({"ts", "level", "msg", **fields}) byte for byte, built from
    # parts: only `msg` is encoded per line (half the cost of dumping each line's dict).
    head = f'{{"ts": {json.dumps(ts)}, "level": {json.dumps(level)}, "msg": '
    tail = ", " + dumps(fields)[1:] if fields else "}"
    out = []
    for line in lines:
        obj = app_object(line) if line[:1] == "{" else None
        if obj is not None:
            try:
                out.append(dumps(merge(obj, {"ts": ts, "level": level, **fields})))
                continue
            except (ValueError, RecursionError):  # deeper than json.dumps goes: as text
                pass
        out.append(head + json.dumps(line) + tail)
    out.append("")
    return "\n".join(out)


class JsonFormatter(logging.Formatter):
    """A log record as one JSON line, `process` naming herder's process."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": iso_ts(record.created),
            "level": record.levelname,
            "msg": record.getMessage(),
            "process": self.process,
            "pid": record.process,
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return dumps(doc)


def setup(level: str, log_format: str, process: str, text_format: str) -> None:
    """The root logger on stderr, in the chosen shape. In JSON, uncaught exceptions (main
    thread or any other) and warnings are logged too, so no traceback reaches stderr as text."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == JSON:
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(logging.Formatter(text_format))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if log_format != JSON:
        return
    logging.captureWarnings(True)
    log = logging.getLogger("herder")

    def uncaught(exc_type: Any, exc: Any, tb: Any) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            sys.__excepthook__(exc_type, exc, tb)
            return
        log.critical("uncaught exception", exc_info=(exc_type, exc, tb))

    def uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread else "?"
        exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        log.critical("uncaught exception in thread %s", name, exc_info=exc_info)

    sys.excepthook = uncaught
    threading.excepthook = uncaught_in_thread
