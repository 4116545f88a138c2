"""client.locate: which state dir a bare `herder status` talks to (real Unix sockets, no herder)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from herder.common.control_protocol import MAX_REQUEST, encode, recv_line, socket_path
from herder.supervisor.ctl import client


def listen(state_dir: Path) -> socket.socket:
    """A control socket that answers every request with ok, as a live herder would."""
    state_dir.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path(str(state_dir)))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                recv_line(conn, MAX_REQUEST)
                conn.sendall(encode({"ok": True}))

    threading.Thread(target=serve, daemon=True).start()
    return server


def stale(state_dir: Path) -> None:
    """A socket file nobody listens on: what a herder killed by SIGKILL leaves."""
    state_dir.mkdir(mode=0o700)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(socket_path(str(state_dir)))
    s.close()


def test_the_only_socket_is_the_one(tmp_path: Path) -> None:
    server = listen(tmp_path / "service")
    try:
        assert client.locate([str(tmp_path / "mine"), str(tmp_path / "service")]) == str(tmp_path / "service")
    finally:
        server.close()


def test_a_live_herder_wins_over_a_stale_socket_before_it(tmp_path: Path) -> None:
    stale(tmp_path / "mine")
    server = listen(tmp_path / "service")
    try:
        assert client.locate([str(tmp_path / "mine"), str(tmp_path / "service")]) == str(tmp_path / "service")
    finally:
        server.close()


def test_nobody_anywhere_names_every_place(tmp_path: Path) -> None:
    with pytest.raises(client.Unreachable) as exc:
        client.locate([str(tmp_path / "a"), str(tmp_path / "b")])
    assert f"{tmp_path / 'a'} or {tmp_path / 'b'}" in str(exc.value)
