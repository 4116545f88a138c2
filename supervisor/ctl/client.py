"""The client end of the control socket: one request, one reply (herder.common.control_protocol)."""

from __future__ import annotations

import json
import socket

from herder.common.control_protocol import LOOP_TIMEOUT, MAX_REPLY, encode, recv_line, socket_path


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
