"""RQ's own writes, recorded instead of sent: the fast path runs RQ's code for a job's start and
finish with a stand-in connection whose pipelines keep the commands, and sends them later in one
script call (script.py). What is recorded is exactly what RQ would have sent, because RQ built it.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.client import Pipeline


class NotRecordable(Exception):
    """RQ's code asked Redis something a recording cannot answer: RQ's own path does it."""


class RecordingPipeline(Pipeline):
    """A pipeline that records what RQ's code would send and sends nothing.

    A WATCHed set read before MULTI is answered empty and becomes a guard that the script
    checks when the commands run; any other read raises NotRecordable."""

    def __init__(self, real: Redis) -> None:
        super().__init__(real.connection_pool, real.response_callbacks, True, None)
        self.guards: list[str] = []
        self.recorded: list[tuple[Any, ...]] = []

    def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        name = str(args[0]).upper()
        if name == "WATCH":
            self.guards.extend(str(k) for k in args[1:])
            self.watching = True
            return True
        if name == "SMEMBERS" and str(args[1]) in self.guards:
            return set()
        raise NotRecordable(name)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.recorded.extend(args for args, _ in self.command_stack)
        n = len(self.command_stack)
        self.reset()
        return [None] * n

    def reset(self) -> None:
        self.command_stack = []
        self.watching = False
        self.explicit_transaction = False

    def take_recorded(self) -> list[tuple[Any, ...]]:
        self.execute()
        recorded, self.recorded = self.recorded, []
        return recorded


class Recorder:
    """Stands in for the worker's connection while RQ's code runs: every pipeline it hands out
    records. Strict (a job's start): any command sent outside a pipeline raises NotRecordable, so
    an RQ whose start reads or writes Redis directly is found, not half-recorded. Otherwise (a
    finish) anything else is the real connection's."""

    # What RQ's code may read off a connection without sending a command.
    ATTRIBUTES = frozenset({"connection_pool", "response_callbacks", "get_encoder", "get_connection_kwargs"})

    def __init__(self, real: Redis, strict: bool = False) -> None:
        self._real = real
        self._strict = strict
        self.pipelines: list[RecordingPipeline] = []

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> RecordingPipeline:
        p = RecordingPipeline(self._real)
        self.pipelines.append(p)
        return p

    def recorded(self) -> list[tuple[Any, ...]]:
        """Every pipeline's commands, in the order they were made."""
        return [command for p in self.pipelines for command in p.take_recorded()]

    def __getattr__(self, name: str) -> Any:
        if self._strict and name not in self.ATTRIBUTES:
            raise NotRecordable(f"a direct {name}() outside RQ's pipelines")
        return getattr(self._real, name)


class Discard(Recorder):
    """Runs RQ's code for the objects it leaves (its writes are in Redis already) and keeps
    nothing: its pipelines take any command, build none."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return _DiscardPipeline()


class _DiscardPipeline:
    def __enter__(self) -> _DiscardPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return []

    def __getattr__(self, name: str) -> Any:
        return _ignore


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None
