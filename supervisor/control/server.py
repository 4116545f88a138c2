"""The control socket's server, in the master: `herder status`, `scale`, `stop`, ... talk
to it (wire format: herder.common.control_protocol; the client: herder.supervisor.ctl.client).

A Unix stream socket in the state dir, mode 0600 inside the 0700 directory. A peer with
another uid is refused unless it is root. Each connection carries one JSON request line
and gets one JSON reply line (docs/control.md).

A socket at the path that someone answers on belongs to a live master (one outliving its
killed watchdog, draining): it is never unlinked. This master then runs without a control
socket, looking every second, and takes the path once nobody answers there (the old master
unlinks it as it exits). Exiting instead would only make the watchdog restart this master
until it gives up, and a healthy new fleet with it. Only a socket nobody answers on (a
dead master's) is unlinked.

This thread only accepts and parses. Whatever reads or changes the fleet is handed to
the reconcile loop (`Commands.handle_requests`, supervisor/control/commands.py) and answered from
there, so replies are consistent with what the loop decides, and a hung loop shows up as a
timeout instead of a stale answer.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
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
from herder.supervisor.control.peercred import peer_uid

log = logging.getLogger("herder")

RECHECK = 1.0  # seconds between looks at a control socket another master still answers on
HANDOVER = "handover"  # the one request that keeps its connection: master B's channel to A


def answering(path: str, timeout: float = 1.0) -> str | None:
    """Who answers on the socket at `path`: 'master pid N', 'someone', or None if nobody
    does (no such file, or a stale socket: connection refused)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        except OSError:
            return "someone"  # cannot tell (busy, not ours): do not take it
        try:
            sock.sendall(encode({"cmd": "ping"}))
            pid = json.loads(recv_line(sock, MAX_REQUEST) or b"null").get("pid")
        except (OSError, ValueError, AttributeError):
            return "someone"
    return f"master pid {pid}" if pid else "someone"


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
        self._inode: int | None = None  # of the socket file we bound, so close() unlinks only ours
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._yielded = threading.Event()  # `herder upgrade`: the listening socket is B's alone now
        # A yield or a close writes here, so the accepting thread sleeps until a connection or
        # one of those comes (no timed poll: an idle master's threads stay asleep).
        self._stir_r, self._stir_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def hand_over(self, wake: Callable[[], None], direct: Callable[[dict], dict | None]) -> None:
        """The loop takes over: from now on requests wake it and `direct` answers what it can.
        Requests queued before (the master was still starting) are answered on its first pass."""
        with self._lock:
            self._wake, self._direct = wake, direct
        wake()

    def adopt(self, sock: socket.socket) -> None:
        """`herder upgrade`: serve on the listening socket master A handed over (the path keeps
        answering throughout: the same socket, never a new one), from start()."""
        sock.setblocking(False)  # see _serve
        self._sock, self._inode = sock, os.stat(self.path).st_ino

    def listener(self) -> socket.socket | None:
        return self._sock

    def yield_path(self) -> None:
        """A's last act before it exits: accept no more (B does), and leave the path to B."""
        with self._lock:
            self._yielded.set()
            self._inode = None  # close() must not unlink B's socket
        self._stir()

    def _stir(self) -> None:
        try:
            os.write(self._stir_w, b"\0")
        except OSError:
            pass  # already stirred (a full pipe)

    def start(self) -> None:
        """Bind now if the path is free or stale; if a live master answers there, serve once
        it is gone (a thread looks every second). OSError if binding fails."""
        holder = None if self._sock is not None else answering(self.path)
        if self._sock is not None:
            target = self._serve
        elif holder is None:
            self._bind()
            target = self._serve
        else:
            log.error(
                "control socket %s is answered by another herder (%s): not taking it; this master runs "
                "without one until nobody answers there",
                self.path,
                holder,
            )
            target = self._wait_then_serve
        self._thread = threading.Thread(target=target, name="control", daemon=True)
        self._thread.start()

    def _bind(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            if os.path.exists(self.path) and not os.path.islink(self.path):
                os.unlink(self.path)  # a stale socket: nobody answered on it
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old_umask = os.umask(0o177)  # born 0600: no window in which others could connect
            try:
                sock.bind(self.path)
            except OSError:
                sock.close()
                raise
            finally:
                os.umask(old_umask)
            os.chmod(self.path, 0o600)
            sock.listen(16)
            sock.setblocking(False)  # see _serve
            self._inode = os.stat(self.path).st_ino
            self._sock = sock
        log.info("control socket %s", self.path)

    def _wait_then_serve(self) -> None:
        while not self._closed.wait(RECHECK):
            if answering(self.path) is not None:
                continue
            try:
                self._bind()
            except OSError as exc:
                log.error("cannot open the control socket %s: %s", self.path, exc)
                return
            self._serve()
            return

    def close(self) -> None:
        self._closed.set()
        self._stir()  # the accepting thread wakes, sees it closed, and ends
        with self._lock:
            if self._sock is None:
                return
            try:
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except OSError:
                pass
            self._sock.close()

    def _serve(self) -> None:
        """Accept until closed or yielded. The listening socket is non-blocking, and may be
        shared with another master during a hand-over (`herder upgrade`): a connection the
        other took first is no connection here, and a blocked accept() could not be stopped."""
        sock = self._sock
        if sock is None:
            return  # closed before it was bound
        while not self._yielded.is_set():
            try:
                ready, _, _ = select.select([sock, self._stir_r], [], [])
                if self._stir_r in ready:
                    if self._closed.is_set() or self._yielded.is_set():
                        return
                    continue
                conn, _ = sock.accept()
            except BlockingIOError:
                continue  # the other master took it
            except (OSError, ValueError):
                return  # closed
            conn.setblocking(True)
            threading.Thread(target=self._handle, args=(conn,), name="control-conn", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(LOOP_TIMEOUT)
            uid = peer_uid(conn)
            body: dict | None = None
            try:
                # Read the request even from a peer about to be refused: closing with its bytes
                # unread would reset the connection before it could read why.
                body = decode_request(recv_line(conn, MAX_REQUEST))
            except (OSError, ValueError) as exc:
                problem = f"bad request: {exc}"
            if uid is not None and uid not in (os.geteuid(), 0):
                log.warning("control socket: refused a client with uid %d", uid)
                self._send(conn, {"ok": False, "error": "permission denied: another user's herder"})
                return
            if body is None:
                self._send(conn, {"ok": False, "error": problem})
                return
            self._send(conn, self._answer(body))
            if body.get("cmd") == HANDOVER:
                self._session(conn)

    def _answer(self, body: dict) -> dict:
        with self._lock:
            direct, wake = self._direct, self._wake
        reply = direct(body)
        if reply is None:
            request = Request(body)
            self.requests.put(request)
            wake()
            try:
                reply = request.reply.result(timeout=LOOP_TIMEOUT)
            except FutureTimeout:
                reply = {"ok": False, "error": "the master did not answer in time (is its loop hung?)"}
        return reply

    def _session(self, conn: socket.socket) -> None:
        """Master B's channel to this master (handoff.py): one request per line,
        answered by the loop, until B closes it (or dies): then the loop is told."""
        conn.settimeout(None)
        try:
            for line in conn.makefile("rb"):
                try:
                    body = decode_request(line)
                except ValueError:
                    break
                if not self._send(conn, self._answer(body)):
                    break
        except OSError:  # reset by a B that died: the end all the same
            pass
        finally:
            self._answer({"cmd": HANDOVER, "op": "end"})

    @staticmethod
    def _send(conn: socket.socket, reply: dict) -> bool:
        fds = reply.pop("_fds", None)  # listening sockets handed over (SCM_RIGHTS)
        try:
            if fds:
                data = encode(reply)
                sent = socket.send_fds(conn, [data], fds)
                conn.sendall(data[sent:])
            else:
                conn.sendall(encode(reply))
        except OSError:
            return False
        return True
