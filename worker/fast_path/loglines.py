"""RQ's INFO lines of a job, the same bytes, written without the logging module's dispatch.

RQ's worker says three INFO lines a job (the dequeue, its finish, "Job OK"); making and
dispatching a LogRecord for each was about a sixth of a no-op job's cost. When the worker's
logger goes nowhere but herder's own handler (log_to_master: no handler or filter of a user's
on the logger, no propagation, a plain Formatter of fields known here), `info` formats the line
as that Formatter would (`fmt % fields`) and hands it to the handler, which writes it as its
emit does (held with the job's other lines, or a write and a flush). Anything else, a user's
handler, filter, record factory, level name, logger class or format, takes logging's own path,
so each of a user's handlers and filters sees every record as before.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from herder.worker.rq_worker import ToMaster, held_log_lines

# The record's fields a line may use here: fixed for an INFO line of a logger, or its message.
FIELDS = frozenset({"levelname", "levelno", "name", "message"})
_FIELD = re.compile(r"%\((\w+)\)")

# The formatter last found plain, its style, format and defaults: plain while they are the same.
_known: tuple[Any, ...] = (None, None, None, None)
enabled = True  # off: every line through logging (tests compare the two)


def _plain(formatter: logging.Formatter | None) -> bool:
    """Whether this formatter's output for an INFO record is `fmt % fields` (remembered)."""
    global _known
    style = getattr(formatter, "_style", None)
    fmt, defaults = getattr(style, "_fmt", None), getattr(style, "_defaults", None)
    if (
        type(formatter) is not logging.Formatter
        or type(style) is not logging.PercentStyle
        or not isinstance(fmt, str)
        or defaults  # merged into each record's fields
        or formatter.usesTime()
        or not set(_FIELD.findall(fmt)) <= FIELDS
    ):
        return False
    _known = (formatter, style, fmt, defaults)
    return True


def direct(logger: logging.Logger) -> ToMaster | None:
    """herder's handler, if an INFO record of `logger` would go to it alone, through nothing
    of a user's, and be formatted plainly; else None (logging's own path)."""
    handler = held_log_lines()
    if (
        handler is None
        or not enabled
        or type(logger) is not logging.Logger
        or logger.propagate
        or logger.filters
        or len(logger.handlers) != 1
        or logger.handlers[0] is not handler
        or not logger.isEnabledFor(logging.INFO)
        or type(handler) is not ToMaster
        or handler.filters
        or handler.level > logging.INFO
        or logging.getLogRecordFactory() is not logging.LogRecord
        or logging.getLevelName(logging.INFO) != "INFO"
    ):
        return None
    formatter, style, fmt, defaults = _known
    f = handler.formatter
    if (
        f is formatter
        and f is not None
        and f._style is style
        and style._fmt is fmt
        and style._defaults is defaults
    ):  # type: ignore[union-attr]
        return handler
    return handler if _plain(f) else None


def info(logger: logging.Logger, msg: str, *args: Any, stacklevel: int = 2) -> None:
    """`logger.info(msg, *args)`, the same bytes out (logging's own call names the caller's
    caller, `stacklevel` frames up, as the one who logged)."""
    if type(logger) is InfoLines:  # the worker's log while it says a job's success
        logger = logger._logger
    handler = direct(logger)
    if handler is None or (len(args) == 1 and isinstance(args[0], Mapping)):  # LogRecord's rule for one
        logger.info(msg, *args, stacklevel=stacklevel)
        return
    message = str(msg) % args if args else str(msg)
    fields = {"levelname": "INFO", "levelno": logging.INFO, "name": logger.name, "message": message}
    line = handler.formatter._style._fmt % fields  # type: ignore[union-attr]
    handler.write_line(line, lambda: logger.makeRecord(logger.name, logging.INFO, "", 0, msg, args, None))


class InfoLines:
    """A worker's logger whose `info` is `info` above; the rest is the logger's own. Set as the
    worker's `log` while RQ's code says a job's success ("Job OK")."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        if kwargs:
            self._logger.info(msg, *args, **{"stacklevel": 2, **kwargs})
        else:
            info(self._logger, msg, *args, stacklevel=3)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)
