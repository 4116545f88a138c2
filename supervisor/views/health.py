"""Is the fleet healthy? One answer, with its reasons, for `herder status` (the health
line, exit 3), /healthz (200 or 503) and /metrics (herder_healthy).

Degraded, each with a reason a person can act on:
- starting: the fleet has not yet been ready once (a readiness probe waits for it);
- stopping: herder is draining (a load balancer should stop sending work here);
- a kill or cull budget is spent (herder.supervisor.policy.guard, herder.supervisor.policy.retirement);
- fewer ready workers than the minimum for longer than `health_grace` (a replacement
  takes a moment: a single crash must not flap a load balancer), counted only while Redis
  answers: workers that cannot start for want of Redis are its symptom, not a second cause;
- Redis unreachable for longer than `health_grace`;
- the master's loop lagging: a pass came more than LAG_LIMIT late within LAG_MEMORY.
Pure bookkeeping on the loop's clock: unit tests drive it with plain numbers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

LAG_LIMIT = 1.0  # seconds a pass of the loop may come late (it ticks every 1 s, 0.25 s in motion)
LAG_MEMORY = 10.0  # seconds a late pass keeps health degraded, so a scrape can see it


@dataclass
class HealthWatch:
    below_since: float | None = None  # monotonic: when ready workers fell below the minimum
    _lags: deque[tuple[float, float]] = field(default_factory=deque)  # (at, lag), late passes only
    last_lag: float = 0.0

    def loop_pass(self, began: float, worked: float, wait: float, woke: float) -> None:
        """A pass began, did its work until `worked`, waited (planned: `wait`) until `woke`.
        The next pass is late by this pass's work plus the wait's overshoot."""
        now = woke
        lag = self.last_lag = (worked - began) + max(0.0, woke - worked - wait)
        if lag > LAG_LIMIT:
            self._lags.append((now, lag))
        while self._lags and self._lags[0][0] < now - LAG_MEMORY:
            self._lags.popleft()

    def worst_recent_lag(self) -> float:
        return max((lag for _, lag in self._lags), default=0.0)

    def observe(self, now: float, ready: int, floor: int, short: str = "", redis_down: bool = False) -> None:
        """`short`: the pools below their own minimum (a pool can be short while the host is not).
        While Redis is down the count waits: short workers then are the outage's doing."""
        if (ready >= floor and not short) or redis_down:
            self.below_since = None
        elif self.below_since is None:
            self.below_since = now

    def reasons(
        self,
        now: float,
        *,
        ready: int,
        floor: int,
        was_ready: bool,
        stopping: bool,
        redis_down_since: float | None,
        grace: float,
        budgets: list[tuple[str, str]],
        short: str = "",
    ) -> list[tuple[str, str]]:
        """Why health is degraded, as (kind, reason) pairs; empty when it is ok. `short`: which
        pools are below their own minimum, when there are several."""
        out = [(kind, text) for kind, text in budgets if text]
        redis_out = redis_down_since is not None and now - redis_down_since > grace
        if stopping:
            out.append(("stopping", "stopping: herder is draining its workers"))
        elif not was_ready and not redis_out:  # no worker starts without Redis: that is the reason
            out.append(("starting", f"starting: {ready} of {floor} workers ready"))
        elif self.below_since is not None and now - self.below_since > grace:
            below = now - self.below_since
            out.append(
                (
                    "below_minimum",
                    f"below minimum workers: {short} for {below:.0f} s"
                    if short
                    else f"below minimum workers: {ready} ready of {floor} for {below:.0f} s",
                )
            )
        if redis_out:
            assert redis_down_since is not None
            out.append(("redis_unreachable", f"redis unreachable for {now - redis_down_since:.0f} s"))
        lag = self.worst_recent_lag()
        if lag:
            late = f"master loop lagging: a pass came {lag:.1f} s late within {LAG_MEMORY:g} s"
            out.append(("loop_lagging", late))
        return out
