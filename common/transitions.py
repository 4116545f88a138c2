"""The one check every state machine of herder makes: is this move in its table?

A table maps each state to the states it may move to; a move the table does not list is a
bug in the code that asked for it, and says so loudly (IllegalTransition). Staying put is a
move like any other: allowed only where the table lists it (callers for whom it is a no-op
check for it first). Standard library only: the watchdog uses it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

S = TypeVar("S")


class IllegalTransition(RuntimeError):
    pass


def move(table: Mapping[S, frozenset[S]], old: S, new: S, who: str, why: str = "") -> S:
    """`new`, if `table` allows `old` -> `new`; else IllegalTransition naming `who` (and `why`)."""
    if new not in table[old]:
        raise IllegalTransition(f"{who}: {old} -> {new} is not allowed" + (f" ({why})" if why else ""))
    return new
