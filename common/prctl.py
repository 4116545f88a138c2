"""Linux's prctl(2), the two uses herder has for it; elsewhere both do nothing (stdlib only:
the watchdog imports this too)."""

from __future__ import annotations

import ctypes
import sys

PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int | bytes) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make this process a child subreaper: orphans below it become its children (Linux);
    False where that is not possible."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_process_name(name: str) -> None:
    """The kernel's name for this process (`ps -o comm`, top, psutil's name()), at most 15 bytes."""
    _prctl(PR_SET_NAME, name.encode()[:15])
