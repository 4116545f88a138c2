"""sd_notify, by hand: systemd's readiness and watchdog protocol is one datagram per message
to the socket in $NOTIFY_SOCKET (a path, or '@name' for the abstract namespace). Standard
library only, so the watchdog stays dependency-free. Without NOTIFY_SOCKET it does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("herder.watchdog")


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if address:
            self.address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_interval: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = (
                int(usec) / 1e6 / 2
            )  # ping at half the deadline, as sd_watchdog_enabled says
        self._sock: socket.socket | None = None
        self._last_status = ""
        self._last_ping = 0.0
        self._failed = False

    def send(self, *fields: str) -> None:
        if self.address is None:
            return
        message = "\n".join(fields).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.sendto(message, self.address)
        except OSError as exc:
            if not self._failed:  # say it once; the service keeps running without notifications
                log.warning("sd_notify to %s failed: %s", self.address.replace("\0", "@"), exc)
                self._failed = True

    def ready(self, status: str = "") -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        if text != self._last_status:
            self._last_status = text
            self.send(f"STATUS={text}")

    def reloading(self) -> None:
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def extend_timeout(self, seconds: float) -> None:
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def ping_if_due(self, healthy: bool) -> None:
        """WATCHDOG=1 every half interval, but only while the master is healthy: a hung
        master stops the pings, and systemd restarts the service."""
        if self.watchdog_interval is None or not healthy:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")
