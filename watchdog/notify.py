"""sd_notify, by hand: systemd's readiness and watchdog protocol is one datagram per message
to the socket in $NOTIFY_SOCKET (a path, or '@name' for the abstract namespace). Standard
library only, so the watchdog stays dependency-free. Without NOTIFY_SOCKET it does nothing.

It never blocks. A service manager that reads its socket only now and then (busy, stalled)
lets the socket's queue fill up (10 datagrams by default on Linux); a blocking send would
then hang the watchdog, signals and all. So the socket is non-blocking, and a full queue
(EAGAIN) leaves a message waiting instead:

- READY=1, STOPPING=1, WATCHDOG=1, RELOADING=1, EXTEND_TIMEOUT_USEC=: the newest of each
  kind waits, in order, and is tried again on the next tick (`flush`). A newer message of
  the same kind replaces a waiting one, which then counts as dropped.
- STATUS=: at most one a second; the newest text waits for its turn, so the last status
  still goes out once the second has passed (or the queue drains).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time

log = logging.getLogger("herder.watchdog")

STATUS_INTERVAL = 1.0  # seconds between STATUS= datagrams: one per job state change would flood
FULL = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS)  # ENOBUFS: macOS's word for a full queue


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
        self._pending: dict[str, tuple[str, ...]] = {}  # kind -> the newest message, oldest kind first
        self._status = ""  # the newest STATUS= text
        self._status_sent = ""
        self._status_at = float("-inf")  # when a STATUS= was last tried
        self._last_ping = 0.0
        self._failed = False
        self._full_logged = False
        self.dropped = 0  # messages that never went out because the queue was full

    # ---- sending ---------------------------------------------------------------------

    def _sendto(self, fields: tuple[str, ...]) -> bool:
        """One datagram, without blocking. False if the queue is full (try again later);
        True if it went out, or failed for good (said once; the service runs on without)."""
        assert self.address is not None
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as exc:
            if exc.errno in FULL:
                self._on_full()
                return False
            if not self._failed:
                log.warning("sd_notify to %s failed: %s", self.address.replace("\0", "@"), exc)
                self._failed = True
        return True

    def _on_full(self) -> None:
        if not self._full_logged:  # once: a stalled manager must not flood the log either
            self._full_logged = True
            log.warning(
                "sd_notify: the queue of %s is full (is the service manager reading it?): STATUS= "
                "updates are dropped but the newest, READY/STOPPING/WATCHDOG wait for room; herder runs on",
                self.address.replace("\0", "@") if self.address else "",
            )

    def send(self, *fields: str) -> None:
        """An important message: the newest of its kind waits if the queue is full."""
        if self.address is None:
            return
        kind = fields[0].split("=", 1)[0]
        if self._pending.pop(kind, None) is not None:
            self.dropped += 1  # replaced before it could go out
        self._pending[kind] = fields
        self.flush(status=False)

    def flush(self, status: bool = True, force: bool = False) -> None:
        """Send what waits, oldest kind first, stopping at a full queue; then the newest
        STATUS= if a second has passed since the last (`force`: now, as herder exits)."""
        if self.address is None:
            return
        for kind, fields in list(self._pending.items()):
            if not self._sendto(fields):
                return
            del self._pending[kind]
        now = time.monotonic()
        due = force or now - self._status_at >= STATUS_INTERVAL
        if status and self._status != self._status_sent and due:
            self._status_at = now
            if self._sendto((f"STATUS={self._status}",)):
                self._status_sent = self._status
            else:
                self.dropped += 1  # the newest text is tried again a second later

    def close(self) -> None:
        """Last words, still without blocking: what waits, and the final status."""
        if self.address is None:  # no service manager listens (a container, a terminal)
            return
        self.flush(force=True)
        self.dropped += len(self._pending) + (self._status != self._status_sent)
        if self.dropped:
            log.info("sd_notify: %d messages dropped: the service manager's queue was full", self.dropped)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # ---- messages --------------------------------------------------------------------

    def ready(self, status: str = "") -> None:
        if status:
            self._status = self._status_sent = status
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        """Kept, not sent: the next flush sends the newest text, at most once a second."""
        self._status = text

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
        if self.watchdog_interval is None:
            return
        if not healthy:
            self._pending.pop("WATCHDOG", None)  # a ping that waited must not vouch for a hung master
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")
