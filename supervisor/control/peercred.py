"""Who is on the other end of a Unix socket: SO_PEERCRED on Linux, getpeereid on macOS/BSD."""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import struct
import sys


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's effective uid, or None if the platform cannot tell."""
    if sys.platform.startswith("linux"):
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    uid, gid = ctypes.c_uint32(), ctypes.c_uint32()
    if libc.getpeereid(conn.fileno(), ctypes.byref(uid), ctypes.byref(gid)) != 0:
        return None
    return uid.value
