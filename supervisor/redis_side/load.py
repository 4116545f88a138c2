"""What one load reading observed: a pure value, the load reader's output and the autoscaling
policy's input (herder.supervisor.policy.scaling). Here, beside its reader, so the Redis side imports
nothing of the master's but herder.common."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """One observation, read from Redis in a single round trip."""

    at: float  # monotonic seconds
    backlog: int  # jobs waiting in the queues herder serves
    running: int  # jobs started and not finished (RQ's StartedJobRegistry)
    oldest_age: float = 0.0  # seconds the oldest waiting job has waited (0: none waits)
