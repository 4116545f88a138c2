"""The events ring: every death, kill, cull, recycle, restart, reload, scale, pause and
spawn, as a person's sentence (model.Event), recorded once where the master decides it.

The loop records (`record`); the HTTP threads read (`since`, `newest`), so a lock guards the
ring. Bounded: the last KEPT events; ids keep increasing, so a reader asks for what is new.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from herder.supervisor.views.model import EVENT_KINDS, Event

KEPT = 300


class Journal:
    def __init__(self, wall: Callable[[], float], kept: int = KEPT) -> None:
        self.wall = wall
        self._ring: deque[Event] = deque(maxlen=kept)
        self._lock = threading.Lock()
        self._next = 1

    def record(
        self, kind: str, pool: str, text: str, slot: int | None = None, pid: int | None = None
    ) -> Event:
        assert kind in EVENT_KINDS, kind
        with self._lock:
            event = Event(self._next, self.wall(), pool, kind, slot, pid, text)
            self._next += 1
            self._ring.append(event)
        return event

    def newest(self, n: int = KEPT) -> tuple[Event, ...]:
        """The last `n` events, newest first."""
        with self._lock:
            return tuple(reversed(self._ring))[:n]

    def since(self, time: float | None = None) -> list[Event]:
        """Events newer than `time` (wall clock; all kept when None), oldest first."""
        with self._lock:
            return [e for e in self._ring if time is None or e.time > time]
