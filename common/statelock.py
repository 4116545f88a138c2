"""One herder per state dir: an exclusive flock on `<state dir>/herder.pid`.

`herder run` takes it just before it execs the watchdog and passes the descriptor on
(inheritable for that one exec, its number in HERDER_LOCK_FD); the watchdog, the same pid,
adopts it, makes it close-on-exec again and holds it for its life. The kernel drops an
flock when the last descriptor of it closes, so a herder killed with kill -9 leaves a file
but no lock: the next one just takes it. No child may inherit the descriptor (every Popen
uses close_fds), or orphaned workers of a dead watchdog would keep the state dir locked.
Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import time

LOCK_NAME = "herder.pid"
ENV_LOCK_FD = "HERDER_LOCK_FD"


class Locked(Exception):
    """A live herder holds the state dir."""

    def __init__(self, state_dir: str, pid: int | None) -> None:
        self.state_dir, self.pid = state_dir, pid
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(
            f"another herder ({who}) is running on state dir {state_dir}; not starting a second one "
            "(stop that one first, or give this one its own --state-dir)"
        )


def lock_path(state_dir: str) -> str:
    return os.path.join(state_dir, LOCK_NAME)


def acquire(state_dir: str) -> int:
    """Take the lock and write our pid into the file; return the (close-on-exec) descriptor.
    Raises Locked if a live herder holds it, OSError if the file cannot be opened."""
    fd = os.open(lock_path(state_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Locked(state_dir, holder(state_dir)) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def holder(state_dir: str, wait: float = 0.5) -> int | None:
    """The pid in the lock file. A herder writes it just after it takes the lock, so an
    empty file is read again for a moment."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(lock_path(state_dir)) as f:
                text = f.read().strip()
        except OSError:
            return None
        if text.isdigit() or time.monotonic() > deadline:
            return int(text) if text.isdigit() else None
        time.sleep(0.05)


def adopt(fd_text: str, state_dir: str) -> int | None:
    """The descriptor `herder run` handed over (HERDER_LOCK_FD), if it is this state dir's
    lock file and we hold the lock on it; made close-on-exec again. Else None."""
    try:
        fd = int(fd_text)
        st, file_st = os.fstat(fd), os.stat(lock_path(state_dir))
    except (ValueError, OSError):
        return None
    if (st.st_dev, st.st_ino) != (file_st.st_dev, file_st.st_ino):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: a no-op that proves it
    except OSError:
        return None
    os.set_inheritable(fd, False)
    return fd


def held(state_dir: str) -> bool | None:
    """Whether a herder holds the state dir's lock (its watchdog is alive): a shared flock taken
    and dropped at once, so it is False once the watchdog's descriptor is closed, a zombie or
    not. None when the file cannot be read (another user's state dir). A `herder run` that
    takes the lock in that instant finds it held and exits 75, as with any live herder."""
    try:
        fd = os.open(lock_path(state_dir), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # drops a shared lock we took
    return False
