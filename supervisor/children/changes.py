"""Which workers changed since the loop last looked: a pass costs what changed, not the fleet.

The readers say so as they record a line that moves what the master knows (a `ready`, a
`busy`, a `done`, a pause, an EOF; not an `idle` that only says the worker is alive), and a
new process says so at its birth. Each pass takes the lot; murder (policy/murder.py) judges
those, the few in motion (starting, stopping, being killed: the master's own moves put them
there) and those whose deadline has come, and the other rooms look only at what changed.
What only time moves (silence, a job's timeout, age, memory) has its own deadlines, and a
sweep of the whole fleet every SWEEP_EVERY seconds is the safety net under them.

One registry per master process (`CHANGED`), like the pipes' hub: every WorkerProcess's
readers add to it. A loop composed without it (the unit tests' fakes, which do not say what
changed) looks at every worker every pass, as a sweep.
"""

from __future__ import annotations

import threading

SWEEP_EVERY = 5.0  # seconds between two looks at the whole fleet


class Changes:
    """A set of pids the readers add to (any thread) and the loop takes once a pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pids: set[int] = set()

    def add(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)

    def take(self) -> set[int]:
        with self._lock:
            pids, self._pids = self._pids, set()
        return pids

    def pending(self) -> bool:
        return bool(self._pids)


CHANGED = Changes()


class Sweeps:
    """When the loop looks at the whole fleet: every SWEEP_EVERY seconds, when asked (a SIGCHLD,
    a reload, a command), or every pass for a loop with no registry of changes."""

    def __init__(self, changes: Changes | None, every: float = SWEEP_EVERY) -> None:
        self.changes, self.every = changes, every
        self._next_at = float("-inf")
        self._asked = False

    def ask(self) -> None:
        """The next pass looks at every worker."""
        self._asked = True

    def take(self, now: float) -> set[int] | None:
        """This pass's changed pids, or None: look at every worker."""
        changed = self.changes.take() if self.changes is not None else None
        if changed is None or self._asked or now >= self._next_at:
            self._asked, self._next_at = False, now + self.every
            return None
        return changed
