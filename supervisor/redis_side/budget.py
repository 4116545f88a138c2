"""The kill budget: a widespread fault must never make herder kill every worker at once.

When Redis hangs, or a shared dependency stalls, every worker can look unresponsive at
the same moment. Killing them all does not help (the fault is elsewhere) and loses all
capacity. So each kill of an unresponsive worker takes a token: at most `limit` kills per
`window` seconds, counted with a sliding window (the previous window's count weighted by
how much of it still overlaps, plus the current window's). Locally always; cluster-wide
too when a cluster cap is set (the same counter in Redis, INCR per window, so every host
shares one budget). No token: the worker is left alone, health is reported degraded and
a line is logged for a person.

Kills that are part of a stop (the stop timeout, a hurried stop) and workers that died
by themselves are not counted: only herder's own judgement that a worker is hung is.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


def sliding_count(previous: int, current: int, window: float, now: float) -> float:
    """The estimate of events in the last `window` seconds from two fixed windows' counts."""
    elapsed = now % window
    return previous * (1 - elapsed / window) + current


@dataclass
class SlidingWindow:
    """Events of the last `window` seconds, estimated from two fixed windows' counts."""

    window: float
    _counts: dict[int, int] = field(default_factory=dict)  # window index -> events

    def count(self, now: float) -> float:
        index = int(now // self.window)
        return sliding_count(self._counts.get(index - 1, 0), self._counts.get(index, 0), self.window, now)

    def add(self, now: float) -> None:
        index = int(now // self.window)
        self._counts[index] = self._counts.get(index, 0) + 1
        for old in [i for i in self._counts if i < index - 1]:
            del self._counts[old]


@dataclass
class KillBudget:
    window: float = 60.0
    fraction: float = 0.5  # of the fleet, per window
    _kills: SlidingWindow | None = None

    def __post_init__(self) -> None:
        self._kills = SlidingWindow(self.window)

    def limit(self, fleet: int) -> int:
        return max(1, math.floor(fleet * self.fraction))

    def carry(self, index: int, kills: int) -> None:
        """Start with `kills` already counted in window `index` (a reload's new window length)."""
        assert self._kills is not None
        self._kills._counts[index] = kills

    def local_count(self, now: float) -> float:
        assert self._kills is not None
        return self._kills.count(now)

    def take(
        self, fleet: int, now: float | None = None, cluster: tuple[ClusterView, int] | None = None
    ) -> bool:
        """Take a token for one kill; False if the budget is spent, locally or, given
        (the cluster's view, the cluster's fleet), cluster-wide."""
        now = time.time() if now is None else now
        if self.local_count(now) + 1 > self.limit(fleet):
            return False
        if cluster is not None:
            view, cluster_fleet = cluster
            if view.estimate(now, self.window) + 1 > self.limit(cluster_fleet):
                return False
            view.since_read += 1
        assert self._kills is not None
        self._kills.add(now)
        return True


CLUSTER_KEY = "herder:cluster:kills"


def cluster_keys(now: float, window: float) -> tuple[str, str]:
    """The Redis counters of the current and the previous window."""
    index = int(now // window)
    return f"{CLUSTER_KEY}:{index}", f"{CLUSTER_KEY}:{index - 1}"


@dataclass
class ClusterView:
    """The cluster-wide kill counts as the load reader last read them (the loop never waits on Redis)."""

    current: int = 0
    previous: int = 0
    read_at: float = 0.0
    since_read: int = 0  # kills this host made after that reading, not yet in it

    def estimate(self, now: float, window: float) -> float:
        if int(now // window) != int(self.read_at // window):
            return self.current * (1 - (now % window) / window) + self.since_read  # a new window began
        return sliding_count(self.previous, self.current, window, now) + self.since_read


# The cull budget: a fixed number of culls per window for the whole cluster, taken in one
# atomic script (check the sliding estimate, then INCR) so hosts never overspend it.
# KEYS: 1 the current window's counter, 2 the previous one's
# ARGV: 1 limit, 2 window seconds, 3 share of the current window elapsed
CULL_TAKE = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
if prev * (1 - tonumber(ARGV[3])) + cur + 1 > tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 2) + 1)
return 1
"""
CULL_KEY = "herder:cluster:culls"


def cull_keys(now: float, window: float) -> tuple[str, str, float]:
    """The cull counters of the current and previous window, and how much of it has passed."""
    index = int(now // window)
    return f"{CULL_KEY}:{index}", f"{CULL_KEY}:{index - 1}", (now % window) / window
