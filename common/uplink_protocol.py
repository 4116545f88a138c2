"""The master -> watchdog channel ("uplink", docs/protocol.md): both ends import this.

The master writes these lines on its private stdout from its reconcile loop, so a hung
loop goes silent; the watchdog reads them with the shared LineSplitter. Standard library
only (the watchdog's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from herder.common.lines import MAX_LINE_BYTES

VERSION = 1
VERBS = ("ready", "alive", "status", "reloading", "stopping")
MAX_STATUS = 4000  # systemd's STATUS= is one short line
# The watchdog tells each master it starts how many times it restarted one before.
MASTER_RESTARTS_ENV = "HERDER_MASTER_RESTARTS"


@dataclass(frozen=True, slots=True)
class UplinkMessage:
    verb: str
    text: str = ""  # the summary of a `status` line


def ready_line(pid: int, ts: float) -> bytes:
    return f"ready {pid} {ts:.6f} {VERSION}\n".encode()


def alive_line(ts: float) -> bytes:
    return f"alive {ts:.6f}\n".encode()


def status_line(text: str) -> bytes:
    return f"status {' '.join(text.split())[:MAX_STATUS]}\n".encode()


def reloading_line(ts: float) -> bytes:
    return f"reloading {ts:.6f}\n".encode()


def stopping_line(ts: float) -> bytes:
    return f"stopping {ts:.6f}\n".encode()


def parse_uplink(raw: bytes) -> UplinkMessage | None:
    """One line from the master, or None for an empty or unknown one (the watchdog only
    counts any line as a sign of life)."""
    fields = raw[:MAX_LINE_BYTES].decode("utf-8", "replace").split()
    if not fields or fields[0] not in VERBS:
        return None
    return UplinkMessage(fields[0], " ".join(fields[1:]) if fields[0] == "status" else "")
