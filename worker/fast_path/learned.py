"""What the fast path learnt about one of its shortcuts, as a state with a name.

Each shortcut (the start templates, the start objects built directly, a finish template, the
restore of a taken job) is first LEARNING: RQ's own code runs and is watched. It becomes READY
once it was checked to give RQ's own result, with what it learnt, or REFUSED with the reason
(said once in the log), and from then on RQ's own code does that step for this worker.

    LEARNING -> READY -> REFUSED     (a ready shortcut that RQ's code later shows wrong)
    LEARNING -> REFUSED -> REFUSED   (refused again, for a later reason: said too)
    READY -> LEARNING                (learnt for objects the worker no longer has: again)
"""

from __future__ import annotations

from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")


class Phase(Enum):
    LEARNING = "learning"
    READY = "ready"
    REFUSED = "refused"


# Each transition allowed, from -> to; every change goes through Learned._become.
_ALLOWED = {
    (Phase.LEARNING, Phase.READY),
    (Phase.LEARNING, Phase.REFUSED),
    (Phase.READY, Phase.READY),  # learnt again for new objects (the restore's job class...)
    (Phase.READY, Phase.REFUSED),
    (Phase.READY, Phase.LEARNING),
    (Phase.REFUSED, Phase.REFUSED),
}


class Learned(Generic[T]):
    """One shortcut's state: its phase, what it learnt (READY) and why not (REFUSED)."""

    __slots__ = ("phase", "reason", "_value")

    def __init__(self) -> None:
        self.phase = Phase.LEARNING
        self.reason = ""  # REFUSED: why RQ's own code does the step
        self._value: T | None = None

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    @property
    def learning(self) -> bool:
        return self.phase is Phase.LEARNING

    @property
    def refused(self) -> bool:
        return self.phase is Phase.REFUSED

    @property
    def value(self) -> T:
        """What it learnt; only READY has one."""
        assert self.phase is Phase.READY, self.phase
        return self._value  # type: ignore[return-value]

    def become_ready(self, value: T) -> None:
        self._become(Phase.READY)
        self._value = value

    def refuse(self, reason: str) -> None:
        self._become(Phase.REFUSED)
        self._value, self.reason = None, reason

    def learn_again(self) -> None:
        self._become(Phase.LEARNING)
        self._value = None

    def _become(self, phase: Phase) -> None:
        assert (self.phase, phase) in _ALLOWED, f"{self.phase.name} -> {phase.name}"
        self.phase = phase

    def __repr__(self) -> str:
        said = f": {self.reason}" if self.phase is Phase.REFUSED else ""
        return f"<Learned {self.phase.name}{said}>"
