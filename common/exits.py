"""Exit codes herder gives and how it describes the ones it sees (every process uses these)."""

from __future__ import annotations

import signal

EX_TEMPFAIL = 75  # sysexits.h: another herder is alive on this state dir; try again once it is gone
EX_CONFIG = 78  # sysexits.h: a bad configuration; a restart cannot fix it


def describe(code: int) -> str:
    """A Popen-style return code in words: 'exit code 1', 'killed by SIGKILL'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
