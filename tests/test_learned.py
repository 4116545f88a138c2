"""A fast-path shortcut's state (herder.worker.fast_path.learned): learning, then ready with what
it learnt or refused with why; a refused shortcut never comes back (RQ's own code does the step
for the rest of the worker's life), and every change goes through the one allowed-transition check."""

from __future__ import annotations

import pytest

from herder.worker.fast_path.learned import Learned, Phase


def test_a_shortcut_learns_then_is_ready_with_what_it_learnt() -> None:
    learned: Learned[str] = Learned()
    assert learned.learning and not learned.ready and not learned.refused
    learned.become_ready("template")
    assert learned.phase is Phase.READY and learned.value == "template"
    learned.become_ready("another")  # learnt again for new objects (the restore's job class)
    assert learned.value == "another"


def test_a_refused_shortcut_keeps_its_reason_and_stays_refused() -> None:
    learned: Learned[str] = Learned()
    learned.become_ready("template")
    learned.refuse("RQ's start cannot be recorded")
    assert learned.refused and learned.reason == "RQ's start cannot be recorded"
    assert "REFUSED: RQ's start cannot be recorded" in repr(learned)
    with pytest.raises(AssertionError):
        learned.value  # noqa: B018 - only READY has one
    with pytest.raises(AssertionError, match="REFUSED -> READY"):
        learned.become_ready("template")
    with pytest.raises(AssertionError, match="REFUSED -> LEARNING"):
        learned.learn_again()
    learned.refuse("a later reason")  # said too
    assert learned.reason == "a later reason"


def test_a_ready_shortcut_can_learn_again() -> None:
    learned: Learned[str] = Learned()
    with pytest.raises(AssertionError, match="LEARNING -> LEARNING"):
        learned.learn_again()
    learned.become_ready("template")
    learned.learn_again()
    assert learned.learning
