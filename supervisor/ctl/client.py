"""The client end of the control socket: one request, one reply (herder.common.control_protocol);
a herder still starting is waited for (`request`); with no state dir named, the herder is found
where `herder run` and an installed service keep theirs (`locate`)."""

from __future__ import annotations

import json
import os
import socket
import time

from herder.common import processes, statelock
from herder.common.control_protocol import LOOP_TIMEOUT, MAX_REPLY, encode, recv_line, socket_path


class Unreachable(Exception):
    """No herder answers at that state dir; the message says where and why."""


def call(state_dir: str, body: dict, timeout: float = LOOP_TIMEOUT + 2) -> dict:
    """Send one request to the herder whose state dir this is; return its reply.
    Raises OSError if nobody listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path(state_dir))
        sock.sendall(encode(body))
        data = recv_line(sock, MAX_REPLY)
    if not data:
        raise ConnectionError("the master closed the connection without a reply")
    return json.loads(data)


# How long a request waits for the control socket of a herder that is starting: `herder run`
# holds the state dir's lock from its first moment, its master binds the socket ~0.3 s later.
STARTING_WAIT = 5.0


def starting(state_dir: str) -> bool:
    """A live herder holds this state dir (herder.pid names a live process) but its master
    has not bound the control socket yet."""
    pid = statelock.holder(state_dir, wait=0.0)
    if pid is None:
        return False
    return processes.exists(pid)


PING_TIMEOUT = 2.0  # seconds a herder found by `locate` has to answer, when several are there


def locate(state_dirs: list[str]) -> str:
    """The first of these state dirs where a herder answers (one socket: that one, unasked),
    else one where a herder is starting. Raises Unreachable naming every place looked at."""
    sockets = [d for d in state_dirs if os.path.exists(socket_path(d))]
    if len(sockets) == 1:
        return sockets[0]
    for d in sockets:  # a stale socket beside a live one: the one that answers
        try:
            call(d, {"cmd": "ping"}, timeout=PING_TIMEOUT)
            return d
        except (OSError, ValueError):
            continue
    for d in state_dirs:
        if starting(d):
            return d
    if sockets:
        return sockets[0]  # nobody answers: `request` says why, at the first
    closed = [d for d in state_dirs if os.path.isdir(d) and not os.access(d, os.X_OK)]
    hint = (
        f"; {' and '.join(closed)} cannot be read by this user (try sudo, or the service's user)"
        if closed
        else "; name another with --state-dir or HERDER_STATE_DIR"
    )
    raise Unreachable(f"no herder answering at {' or '.join(state_dirs)} (not running){hint}")


def request(state_dir: str, body: dict) -> dict:
    """One request to the running herder, its reply as sent (`ok` true or false). A herder
    still starting is waited for (up to STARTING_WAIT): it answers `starting` soon. Raises
    Unreachable when nobody answers."""
    deadline = time.monotonic() + STARTING_WAIT
    while True:
        try:
            return call(state_dir, body)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() < deadline and starting(state_dir):
                time.sleep(0.05)
                continue
            raise Unreachable(f"no herder answering at {state_dir} (not running)") from None
        except (OSError, ValueError) as exc:
            raise Unreachable(
                f"no herder answering at {state_dir} ({exc.__class__.__name__}: {exc})"
            ) from None
