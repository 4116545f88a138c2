"""The control socket's server, in the master: `herder status`, `scale`, `stop`, ... talk
to it (wire format: herder.common.control_protocol; the client: herder.supervisor.ctl.client).

A Unix stream socket in the state dir, mode 0600 inside the 0700 directory. A peer with
another uid is refused unless it is root. Each connection carries one JSON request line
and gets one JSON reply line (docs/control.md).

This thread only accepts and parses. Whatever reads or changes the fleet is handed to
the reconcile loop (`Master.handle_requests`) and answered from there, so replies are
consistent with what the loop decides, and a hung loop shows up as a timeout instead
of a stale answer.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from herder.common.control_protocol import (
    LOOP_TIMEOUT,
    MAX_REQUEST,
    decode_request,
    encode,
    recv_line,
    socket_path,
)
from herder.supervisor.peercred import peer_uid

log = logging.getLogger("herder")


@dataclass
class Request:
    body: dict
    reply: Future = field(default_factory=Future)


class ControlServer:
    def __init__(
        self, state_dir: str, wake: Callable[[], None], direct: Callable[[dict], dict | None]
    ) -> None:
        """`direct` answers requests that need not go through the loop (or returns None)."""
        self.path = socket_path(state_dir)
        self.requests: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._wake = wake
        self._direct = direct
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, name="control", daemon=True)

    def start(self) -> None:
        if os.path.exists(self.path) and not os.path.islink(self.path):
            os.unlink(self.path)  # a stale socket from a dead master
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # born 0600: no window in which others could connect
        try:
            sock.bind(self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        self._sock = sock
        self._thread.start()
        log.info("control socket %s", self.path)

    def close(self) -> None:
        if self._sock is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self._sock.close()

    def _serve(self) -> None:
        assert self._sock is not None
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._handle, args=(conn,), name="control-conn", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(LOOP_TIMEOUT)
            uid = peer_uid(conn)
            if uid is not None and uid not in (os.geteuid(), 0):
                log.warning("control socket: refused a client with uid %d", uid)
                self._send(conn, {"ok": False, "error": "permission denied: another user's herder"})
                return
            try:
                body = decode_request(recv_line(conn, MAX_REQUEST))
            except (OSError, ValueError) as exc:
                self._send(conn, {"ok": False, "error": f"bad request: {exc}"})
                return
            reply = self._direct(body)
            if reply is None:
                request = Request(body)
                self.requests.put(request)
                self._wake()
                try:
                    reply = request.reply.result(timeout=LOOP_TIMEOUT)
                except FutureTimeout:
                    reply = {"ok": False, "error": "the master did not answer in time (is its loop hung?)"}
            self._send(conn, reply)

    @staticmethod
    def _send(conn: socket.socket, reply: dict) -> None:
        try:
            conn.sendall(encode(reply))
        except OSError:
            pass
