"""A queue's figures as the autoscaler last read them (QueueStats): the snapshot's builder
(views/build.py) shows them in every view."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueStats:
    backlog: int
    running: int
    growth: float  # jobs/s, smoothed as the scaling policy smooths it
    oldest_age: float = 0.0  # seconds the oldest waiting job has waited (0: none waits)
