"""The worker -> master line protocol, version 1 (docs/protocol.md).

Pure code: parsing and bounded line splitting, no I/O, so it is unit-tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass

PROTOCOL_VERSION = 1
# A protocol line is short (a verb, a job id, two numbers). Anything longer is a
# misbehaving worker: the rest of the line is discarded, not buffered.
MAX_LINE_BYTES = 4096

VERBS = ("ready", "busy", "beat", "done", "idle", "stop")


class ProtocolError(ValueError):
    """A line that is not a valid protocol message. Counted and logged, never fatal."""


@dataclass(frozen=True, slots=True)
class Message:
    verb: str
    ts: float
    job_id: str | None = None
    pid: int | None = None
    ok: bool | None = None
    # Seconds the job may run (RQ's job.timeout); None when the worker did not say,
    # -1 for a job that may run forever.
    timeout: float | None = None


def _ts(field: str) -> float:
    try:
        value = float(field)
    except ValueError:
        raise ProtocolError(f"bad timestamp {field[:40]!r}") from None
    if value != value or value < 0:  # NaN or negative
        raise ProtocolError(f"bad timestamp {field[:40]!r}")
    return value


def _job_id(field: str) -> str:
    if not field or len(field) > 256 or not field.isprintable():
        raise ProtocolError("bad job id")
    return field


def parse_line(raw: bytes) -> Message:
    """Parse one line (without its newline) into a Message or raise ProtocolError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("not UTF-8") from None
    fields = text.strip().split()
    if not fields:
        raise ProtocolError("empty line")
    verb, args = fields[0], fields[1:]
    match verb, len(args):
        case "ready", 2 | 3:
            # ready <pid> <ts> [<protocol-version>]
            try:
                pid = int(args[0])
            except ValueError:
                raise ProtocolError(f"bad pid {args[0][:40]!r}") from None
            if len(args) == 3 and args[2] != str(PROTOCOL_VERSION):
                raise ProtocolError(f"unsupported protocol version {args[2][:20]!r}")
            return Message("ready", _ts(args[1]), pid=pid)
        case "busy", 2 | 3:
            # busy <job-id> <ts> [<timeout-seconds>]
            timeout = None
            if len(args) == 3:
                timeout = _ts(args[2]) if args[2] != "-1" else -1.0
            return Message("busy", _ts(args[1]), job_id=_job_id(args[0]), timeout=timeout)
        case "beat", 2:
            # beat <job-id> <ts>: the process is alive while a job runs
            return Message("beat", _ts(args[1]), job_id=_job_id(args[0]))
        case "done", 3:
            # done <job-id> <ts> ok|failed
            if args[2] not in ("ok", "failed"):
                raise ProtocolError(f"bad outcome {args[2][:20]!r}")
            return Message("done", _ts(args[1]), job_id=_job_id(args[0]), ok=args[2] == "ok")
        case "idle", 1:
            return Message("idle", _ts(args[0]))
        case "stop", 1:
            return Message("stop", _ts(args[0]))
        case _ if verb in VERBS:
            raise ProtocolError(f"wrong number of fields for {verb!r}")
        case _:
            raise ProtocolError(f"unknown verb {verb[:40]!r}")


class LineSplitter:
    """Splits a byte stream into lines with a hard cap on line length.

    Memory stays bounded by ``max_line`` whatever the peer sends: an over-long line
    is cut, the remainder up to the next newline is dropped, and the cut is counted.
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._discarding = False
        self.oversized = 0  # lines cut because they were longer than max_line
        self.dropped_bytes = 0

    def feed(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        """Return complete lines as (line, was_truncated)."""
        out: list[tuple[bytes, bool]] = []
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            piece = chunk[start:end]
            if self._discarding:
                self.dropped_bytes += len(piece)
            else:
                room = self.max_line - len(self._buf)
                if len(piece) > room:
                    self._buf += piece[:room]
                    self.dropped_bytes += len(piece) - room
                    self.oversized += 1
                    out.append((bytes(self._buf), True))
                    self._buf.clear()
                    self._discarding = True
                else:
                    self._buf += piece
            if nl < 0:
                break
            if not self._discarding:
                out.append((bytes(self._buf), False))
            self._buf.clear()
            self._discarding = False
            start = nl + 1
        return out

    def flush(self) -> bytes | None:
        """At EOF: the unterminated tail, if any."""
        if self._buf and not self._discarding:
            tail = bytes(self._buf)
            self._buf.clear()
            return tail
        return None
