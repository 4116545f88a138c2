"""The control socket's wire format (docs/control.md): one JSON object per line each way.

The master serves it (herder.supervisor.control.server); `herder status`, `scale`, ... call it
(herder.supervisor.ctl.client). Standard library only.
"""

from __future__ import annotations

import json
import os
import socket

SOCKET_NAME = "herder.sock"
MAX_REQUEST = 64 * 1024
MAX_REPLY = 16 * 1024 * 1024  # a status of a very large fleet still fits
LOOP_TIMEOUT = 5.0  # seconds the master's loop has to answer before the client hears so


def socket_path(state_dir: str) -> str:
    return os.path.join(state_dir, SOCKET_NAME)


def encode(message: dict) -> bytes:
    return json.dumps(message, default=str).encode() + b"\n"


def recv_line(sock: socket.socket, limit: int) -> bytes:
    """One newline-terminated message (or what came before EOF), at most `limit` bytes."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("message too long")
    return data


def decode_request(data: bytes) -> dict:
    body = json.loads(data.decode("utf-8") or "null")
    if not isinstance(body, dict) or not isinstance(body.get("cmd"), str):
        raise ValueError('expected a JSON object with a "cmd"')
    return body
