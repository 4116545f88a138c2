"""The history ring: the last 15 minutes of every pool's figures at 1 s resolution, for the
dashboard's charts (API.md, /api/history).

The loop appends each snapshot it publishes (every 0.5 s at most); a sample whose second is
already taken replaces that second's, so the ring holds one sample a second and SPAN of them.
An append costs O(pools); the arrays are built only when a reader asks (`render`).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any

from herder.supervisor.views.model import WIRE_NAMES, HostSnapshot

STEP = 1.0  # seconds between two samples
SPAN = 15 * 60  # seconds kept
SERIES = ("queue_length", "growth", "demand", "running", "busy", "jobs_per_s", "failed_per_s")

Sample = tuple[float, dict[str, tuple[Any, ...]]]  # (wall time, pool -> SERIES' values)


class History:
    def __init__(self, span: float = SPAN, step: float = STEP) -> None:
        self.step = step
        self._ring: deque[Sample] = deque(maxlen=int(span / step))
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ring)

    def append(self, snap: HostSnapshot) -> None:
        pools = {p.name: tuple(getattr(p, k) for k in SERIES) for p in snap.pools}
        second = math.floor(snap.time / self.step)
        with self._lock:
            if self._ring and math.floor(self._ring[-1][0] / self.step) >= second:
                if math.floor(self._ring[-1][0] / self.step) == second:
                    self._ring[-1] = (snap.time, pools)  # the newest of that second
                return  # a clock stepped back: keep the timeline increasing
            self._ring.append((snap.time, pools))

    def render(self, since: float | None = None) -> dict[str, Any]:
        """API.md's arrays: `t` and, per pool, one array per series aligned with it (None where
        the pool had no sample). `since` bounds the samples too, so a poller gets what is new."""
        with self._lock:
            samples = [s for s in self._ring if since is None or s[0] > since]
        names: dict[str, None] = {}
        for _, pools in samples:
            names.update(dict.fromkeys(pools))
        out: dict[str, dict[str, list[Any]]] = {}
        for name in names:
            rows = [pools.get(name) for _, pools in samples]
            out[name] = {
                WIRE_NAMES.get(k, k): [None if r is None else r[i] for r in rows]
                for i, k in enumerate(SERIES)
            }
        return {"step": self.step, "t": [t for t, _ in samples], "pools": out}
