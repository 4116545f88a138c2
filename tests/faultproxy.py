"""A TCP proxy that breaks connections the way a production network does, one at a time.

Between herder and a real redis-server on loopback: every client connection gets its own
upstream connection, pumped by a thread a direction. On command it resets a connection (RST,
at whatever byte it is), kills one silently (stops forwarding both ways and never closes:
a dropped NAT entry, a failover that moved the address), or stalls all traffic for a while
and then delivers it. Faults hit connections at random moments; nothing here knows Redis.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time


class Link:
    """One client connection and its upstream twin."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.dead = False  # silently dead: bytes go nowhere, nothing is closed
        self.closed = False

    def reset(self) -> None:
        """Both ends get a RST (SO_LINGER 0), as a middlebox that dropped the flow sends."""
        if self.closed:
            return
        self.closed = True
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                s.close()


class FaultProxy:
    def __init__(self, upstream_port: int, seed: int | None = None) -> None:
        self.upstream_port = upstream_port
        self.random = random.Random(seed)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)
        self.port = self.listener.getsockname()[1]
        self.links: list[Link] = []
        self.lock = threading.Lock()
        self.stalled_until = 0.0
        self.counts = {"connections": 0, "resets": 0, "silenced": 0, "stalls": 0}
        self._running = True
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # ---- faults ---------------------------------------------------------------------

    def open_links(self) -> list[Link]:
        with self.lock:
            self.links = [link for link in self.links if not link.closed]
            return [link for link in self.links if not link.dead]

    def reset_one(self) -> bool:
        links = self.open_links()
        if not links:
            return False
        self.random.choice(links).reset()
        self.counts["resets"] += 1
        return True

    def reset_all(self) -> int:
        links = self.open_links()
        for link in links:
            link.reset()
        self.counts["resets"] += len(links)
        return len(links)

    def silence_one(self) -> bool:
        """One connection goes silently dead: no byte either way, no FIN, no RST."""
        links = self.open_links()
        if not links:
            return False
        self.random.choice(links).dead = True
        self.counts["silenced"] += 1
        return True

    def stall(self, seconds: float) -> None:
        """Hold every byte in both directions for `seconds`, then deliver it all."""
        self.stalled_until = max(self.stalled_until, time.monotonic() + seconds)
        self.counts["stalls"] += 1

    def heal(self) -> None:
        """The network is healthy again: dead connections are closed (their owners learn by
        their own timeouts, not by this), and nothing is held."""
        self.stalled_until = 0.0

    def close(self) -> None:
        self._running = False
        with contextlib.suppress(OSError):
            self.listener.close()
        with self.lock:
            links, self.links = self.links, []
        for link in links:
            link.reset()

    # ---- pumping ----------------------------------------------------------------------

    def _accept(self) -> None:
        while self._running:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()  # Redis itself refuses: so does the proxy
                continue
            link = Link(client, upstream)
            with self.lock:
                self.links.append(link)
            self.counts["connections"] += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(link, src, dst), daemon=True).start()

    def _pump(self, link: Link, src: socket.socket, dst: socket.socket) -> None:
        while not link.closed:
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            while time.monotonic() < self.stalled_until and not link.closed:
                time.sleep(0.01)
            if link.dead:
                continue  # swallowed: the peer waits for ever, as behind a dead NAT entry
            try:
                dst.sendall(data)
            except OSError:
                break
        link.reset()  # one side went away (a dead link's owner gave up on it): so does the other
