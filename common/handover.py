"""The resolved configuration handed from a process to its child, never in the environment.

The config carries the Redis password, and a job's code can read `os.environ` (so can an
error reporter that captures it, a debug dump, `/proc/PID/environ`). So every herder process
gets it another way (docs/design.md, "The configuration's way down"):

- a new interpreter (the watchdog exec'd by `herder run`, a master, a spawned template,
  worker or scheduler): on an inherited descriptor, a memfd (Linux) or else an unlinked 0600
  temporary file, named by HERDER_CONFIG_FD; `receive()` reads it once at start, closes it
  and drops the variable;
- a process the fork server forks: in its request, over the master's private socket
  (`accept()`).

Inside the master a child's would-be environment keeps the config under ENV_RESOLVED until
the moment it starts (`seal()`): one dict describes a child, whichever way it starts.
Standard library only: the watchdog imports it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

ENV_RESOLVED = "HERDER_RESOLVED_CONFIG"  # in a child's spec inside herder; never in a real environment
ENV_CONFIG_FD = "HERDER_CONFIG_FD"  # the descriptor a new interpreter reads its config from

_received: list[str] = []  # the config handed to this process, once read


def sealed(text: str) -> int:
    """A close-on-exec descriptor holding `text`, for a child to inherit (pass_fds) and read
    from its start: nothing on disk where Linux has memfd_create."""
    try:
        fd = os.memfd_create("herder-config", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # macOS; a kernel without memfd
        import tempfile

        with tempfile.TemporaryFile() as f:  # 0600, unlinked at once
            fd = os.dup(f.fileno())
    data = text.encode()
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)
    return fd


def seal(env: dict[str, str]) -> tuple[dict[str, str], int | None]:
    """A child's spec made ready to start: its config moved out of `env` onto a descriptor
    (HERDER_CONFIG_FD names it). Returns (the environment, the descriptor to pass and then
    close, or None when the spec holds no config, as a --worker-command's does not)."""
    env = dict(env)
    text = env.pop(ENV_RESOLVED, None)
    env.pop(ENV_CONFIG_FD, None)
    if text is None:
        return env, None
    fd = sealed(text)
    env[ENV_CONFIG_FD] = str(fd)
    return env, fd


@contextlib.contextmanager
def handed(
    env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> Iterator[tuple[dict[str, str], tuple[int, ...]]]:
    """A child's spec ready for Popen (`seal`): its environment and the descriptors to pass,
    the config's among them; that one is closed here once the child has started."""
    env, fd = seal(env)
    try:
        yield env, pass_fds if fd is None else (*pass_fds, fd)
    finally:
        if fd is not None:
            os.close(fd)


def accept(env: dict[str, str]) -> dict[str, str]:
    """In a forked child: its spec's config taken into memory; the rest, its environment."""
    env = dict(env)
    text = env.pop(ENV_RESOLVED, None)
    env.pop(ENV_CONFIG_FD, None)
    _received[:] = [text] if text is not None else []
    return env


def receive() -> str | None:
    """The config handed to this process (None if none was): read from its descriptor at the
    first call, which closes it and drops the variable; from memory after that."""
    fd_text = os.environ.pop(ENV_CONFIG_FD, None)
    if fd_text is not None:
        fd = int(fd_text)
        try:
            chunks = []
            offset = 0
            while chunk := os.pread(fd, 1 << 16, offset):
                chunks.append(chunk)
                offset += len(chunk)
        finally:
            os.close(fd)
        _received[:] = [b"".join(chunks).decode()]
    return _received[0] if _received else None
