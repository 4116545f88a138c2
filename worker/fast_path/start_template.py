"""RQ's start writes for the next job, as a template the finish-and-take script fills in.

A job's start (RQ's prepare_execution and prepare_job_execution) writes about fifteen commands
whose arguments depend on five things only: the job's id, its origin queue, a new execution
id, the time, and the heartbeat TTL (from the job's timeout). So RQ's own code is run once for
a stand-in job, with a stand-in execution id and a stand-in clock (`frozen_clock`), and what
it records becomes a template: each stand-in value replaced by a marker (NUL and a letter).
The script that finishes a job and takes the next one fills the markers in with the taken
job's id and origin and the time and execution id the worker sends, and writes the start in
the same round trip.

A template is trusted only once it has matched a real start byte for byte: the worker's first
job (and the first of each other timeout) starts the two-round-trip way, its commands recorded
under the same frozen clock, and the template filled in with that job's values must give the
same commands. If they differ (an RQ version whose start depends on something else) the
template is dropped and every start keeps its own round trip. The script uses a template
only for a job whose `timeout` field is the one the template was made for.
"""

from __future__ import annotations

import calendar
import re
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import rq
import rq.executions
import rq.utils

# Stand-ins no real job, queue or time has: a NUL-free id and queue name, an execution id that
# is valid hex (RQ makes it a UUID's hex) and a time in the next century with odd microseconds.
STAND_IN_JOB = "herder-stand-in-job"
STAND_IN_QUEUE = "herder-stand-in-queue"
STAND_IN_EXECUTION = "e0" * 16
STAND_IN_FUNCTION = "herder.stand_in"  # named only: a stand-in job never runs
STAND_IN_TIME = datetime(2101, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
INT_RANGE = 10**8  # an integer argument this close to the stand-in time is a time (a score)
MARK = re.compile(rb"\x00(.)", re.DOTALL)
MARK_SPLIT = re.compile(rb"(\x00.)", re.DOTALL)  # an argument cut into its markers and the bytes between


class NotTemplatable(Exception):
    """The recorded start cannot be a template (it says why)."""


def stand_in_job(job_class: type, connection: Any, serializer: Any, timeout: Any) -> Any:
    """A job like any other, of the stand-in id and queue and the given timeout (never saved)."""
    job = job_class.create(STAND_IN_FUNCTION, id=STAND_IN_JOB, connection=connection, serializer=serializer)
    job.origin, job.timeout = STAND_IN_QUEUE, timeout
    return job


def timeout_key(timeout: Any) -> str:
    """The job hash's `timeout` field as RQ writes it (to_dict: the number, absent when None)."""
    return "" if timeout is None else str(timeout)


class _Pin(threading.local):
    """A thread's pin: none (the class's None) until a window in that thread sets one. RQ calls
    `now()` about ten times a job, outside any window too: a missing attribute with a default
    (getattr) cost twice the class's None."""

    now: datetime | None = None
    stamp: int | None = None
    uuid: UUID | None = None


class FrozenClock:
    """RQ's clock and execution ids pinned for the length of a `with`, in this thread only:
    every `now()` and `current_timestamp()` in RQ's modules gives one time, Execution.create
    one id. The worker's other threads (RQ's pubsub listener, herder's sentinel, another
    thread's worker) keep the real clock, even while their own windows overlap this one.

    RQ's functions are replaced once per process by stand-ins that read this thread's pin
    (a threading.local) and fall through to the real function where none is set; a window
    only sets and clears its own thread's pin, so no window can undo another's."""

    _local = _Pin()
    _installed = False
    _install_lock = threading.Lock()

    def __init__(self) -> None:
        with FrozenClock._install_lock:
            if not FrozenClock._installed:
                _install_pins(FrozenClock._local)
                FrozenClock._installed = True

    def __call__(self, t: datetime, execution_id: str) -> FrozenClock:
        """Pinned from here to the end of the `with` (a plain context manager: a generator's
        would cost more than the pinning itself, twice a job)."""
        pin = self._local
        pin.now, pin.stamp, pin.uuid = t, calendar.timegm(t.utctimetuple()), uuid.UUID(hex=execution_id)
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pin = self._local
        pin.now = pin.stamp = pin.uuid = None


def _install_pins(pin: _Pin) -> None:
    """Every RQ module's `now` and `current_timestamp` (each its own reference to rq.utils'
    functions) and rq.executions' `uuid4`, replaced by stand-ins reading `pin`."""
    real_now, real_stamp, real_uuid4 = rq.utils.now, rq.utils.current_timestamp, rq.executions.uuid4

    def now() -> Any:
        return pin.now or real_now()

    def current_timestamp() -> Any:
        stamp = pin.stamp
        return real_stamp() if stamp is None else stamp

    def uuid4() -> Any:
        return pin.uuid or real_uuid4()

    stand_ins = {"now": (real_now, now), "current_timestamp": (real_stamp, current_timestamp)}
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name != "rq" and not name.startswith("rq."):
            continue
        for attr, (real, stand_in) in stand_ins.items():
            if getattr(module, attr, None) is real:
                setattr(module, attr, stand_in)
    rq.executions.uuid4 = uuid4  # type: ignore[assignment]


def time_values(t: datetime, encode: Callable[[Any], bytes], offsets: list[int]) -> list[bytes]:
    """What the markers I, F and a, b, ... stand for at time t: RQ's ISO form, the float
    timestamp as redis-py sends it, and each integer score (whole seconds + an offset)."""
    stamp = whole_seconds(t)
    return [rq.utils.utcformat(t).encode(), encode(t.timestamp()), *(b"%d" % (stamp + k) for k in offsets)]


_EPOCH, _SECOND = datetime(1970, 1, 1, tzinfo=UTC), timedelta(seconds=1)


def whole_seconds(t: datetime) -> int:
    """calendar.timegm(t.utctimetuple()), RQ's whole-second timestamp, in integer arithmetic (a
    fifth of the time) for the aware times RQ's clock gives; a naive one goes to timegm."""
    if t.tzinfo is None:
        return calendar.timegm(t.utctimetuple())
    return (t - _EPOCH) // _SECOND


def script_command(command: list[bytes]) -> list[bytes]:
    """One command as the script reads it: its number of pieces, its plan (a byte an argument:
    `.` for one piece, else 48 + its number of pieces), then the pieces, each a marker or the
    bytes between markers. The script looks each piece up among the markers' values and joins
    an argument's pieces: no pattern matching per argument (a gsub per argument was the
    largest part of the script's own cost)."""
    plan, pieces = bytearray(), []
    for a in command:
        parts = [p for p in MARK_SPLIT.split(a) if p] or [b""]
        if len(parts) > 200:
            raise NotTemplatable("an argument of more than 200 pieces")
        plan.append(46 if len(parts) == 1 else 48 + len(parts))
        pieces.extend(parts)
    return [b"%d" % len(pieces), bytes(plan), *pieces]


class StartTemplate:
    """One recorded start with its stand-ins marked, for jobs of one `timeout` field."""

    def __init__(self, key: str, commands: list[list[bytes]], offsets: list[int]) -> None:
        self.key = key
        self.commands = commands
        self.offsets = offsets
        script_args = [v for c in commands for v in script_command(c)]
        self.size = len(script_args)  # the script arguments the commands take
        self.framed = b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in script_args)  # RESP, made once

    @classmethod
    def from_recording(
        cls, key: str, recorded: list[tuple[Any, ...]], encode: Callable[[Any], bytes]
    ) -> StartTemplate:
        stamp = calendar.timegm(STAND_IN_TIME.utctimetuple())
        iso, flt = time_values(STAND_IN_TIME, encode, [])
        marks = [
            (STAND_IN_EXECUTION.encode(), b"\x00E"),
            (STAND_IN_JOB.encode(), b"\x00J"),
            (STAND_IN_QUEUE.encode(), b"\x00Q"),
            (iso, b"\x00I"),
            (flt, b"\x00F"),
        ]
        offsets: list[int] = []
        commands = []
        for command in recorded:
            args = []
            for a in command:
                if type(a) is int and abs(a - stamp) < INT_RANGE:
                    if a - stamp not in offsets:
                        offsets.append(a - stamp)
                    if len(offsets) > 26:
                        raise NotTemplatable("more than 26 different times")
                    args.append(b"\x00" + bytes([96 + offsets.index(a - stamp) + 1]))
                    continue
                v = encode(a)
                if b"\x00" in v:
                    raise NotTemplatable("a NUL byte in a recorded argument")
                for stand_in, mark in marks:
                    v = v.replace(stand_in, mark)
                args.append(v)
            commands.append(args)
        return cls(key, commands, offsets)

    def script_values(self, t: datetime, execution_id: str, encode: Callable[[Any], bytes]) -> list[Any]:
        """The arguments before the template's commands: their number, the timeout field it is
        for, the execution id, the time's forms and the scores."""
        iso, flt, *ints = time_values(t, encode, self.offsets)
        return [len(self.commands), self.key, execution_id, iso, flt, len(ints), *ints]

    def fill(
        self, job_id: str, origin: str, execution_id: str, t: datetime, encode: Callable[[Any], bytes]
    ) -> list[list[bytes]]:
        """The template filled in here, as the script fills it in (to check it against RQ)."""
        iso, flt, *ints = time_values(t, encode, self.offsets)
        values = {
            b"J": job_id.encode(),
            b"Q": origin.encode(),
            b"E": execution_id.encode(),
            b"I": iso,
            b"F": flt,
        }
        values.update({bytes([96 + i + 1]): v for i, v in enumerate(ints)})
        return [[MARK.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in c] for c in self.commands]
