"""The master's end of the master -> watchdog channel (herder.common.uplink_protocol).

Like a worker, the master keeps a private duplicate of its stdout for these lines and
points fd 1 at stderr. Heartbeats are sent from the reconcile loop itself, so a hung
loop goes silent and the watchdog restarts the master.
"""

from __future__ import annotations

import os
import time

from herder.common import uplink_protocol as up


class Uplink:
    def __init__(self) -> None:
        self._fd: int | None = os.dup(1)
        os.dup2(2, 1)
        self._parent = os.getppid()
        self._last_status = b""

    def _send(self, line: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, line)
        except OSError:
            self._fd = None  # the watchdog is gone; watchdog_gone() reports it

    def ready(self) -> None:
        self._send(up.ready_line(os.getpid(), time.time()))

    def alive(self) -> None:
        self._send(up.alive_line(time.time()))

    def status(self, text: str) -> None:
        """A one-line summary for systemd's STATUS=; sent only when it changes."""
        line = up.status_line(text)
        if line != self._last_status:
            self._last_status = line
            self._send(line)

    def reloading(self) -> None:
        self._send(up.reloading_line(time.time()))

    def stopping(self) -> None:
        self._send(up.stopping_line(time.time()))

    def watchdog_gone(self) -> bool:
        return self._fd is None or os.getppid() != self._parent
