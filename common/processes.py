"""Whether a process exists, by pid: the one `kill(pid, 0)` every process of herder asks with
(the watchdog of an embedded Redis, the CLI of a starting herder or a hand-over, the master of
a worker its fork server's middle process has not handed over yet). Standard library only."""

from __future__ import annotations

import os


def exists(pid: int) -> bool:
    """A process with this pid is there (another user's too; a zombie too, until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True
