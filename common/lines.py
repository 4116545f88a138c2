"""The one line splitter every channel uses: a byte stream into lines, memory bounded.

Every pipe herder reads (a worker's stdout and stderr, a worker's stdin, the master's
uplink) carries newline-terminated lines from a peer that may misbehave. Whatever the
peer sends, a reader holds at most one line of `max_line` bytes.
"""

from __future__ import annotations

# A protocol line is short (a verb, a job id, two numbers). Anything longer is a
# misbehaving peer: the rest of the line is discarded, not buffered.
MAX_LINE_BYTES = 4096


class LineSplitter:
    """Splits a byte stream into lines with a hard cap on line length.

    An over-long line is cut at ``max_line`` bytes and flagged; the remainder up to the
    next newline is dropped (the caller counts the cuts).
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._discarding = False

    def feed(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        """Return complete lines as (line, was_truncated)."""
        if not self._buf and not self._discarding and chunk.find(b"\n") == len(chunk) - 1 <= self.max_line:
            return [(chunk[:-1], False)]  # one whole line, the usual read of a quiet pipe
        out: list[tuple[bytes, bool]] = []
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            piece = chunk[start:end]
            if not self._discarding:
                room = self.max_line - len(self._buf)
                if len(piece) > room:
                    self._buf += piece[:room]
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

    @property
    def empty(self) -> bool:
        """No part of a line held: the next chunk starts a line."""
        return not self._buf and not self._discarding

    def flush(self) -> bytes | None:
        """At EOF: the unterminated tail, if any."""
        if self._buf and not self._discarding:
            tail = bytes(self._buf)
            self._buf.clear()
            return tail
        return None
