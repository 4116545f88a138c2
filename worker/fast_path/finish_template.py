"""RQ's finish writes for a successful job, as a template filled in per job.

RQ's finish (handle_job_success) writes one transaction whose arguments depend, for jobs of
one "shape" (the result TTL, whether there is a return value, the job and queue classes), on a
few things only: the job's id and origin queue, its execution's id and start time, the job's
end, the working time, the serialized return value, the time (the finished registry's score)
and the job's hash as RQ's `Job.to_dict` makes it. So RQ's own code is run once per shape for a
stand-in job whose every such value is one no real job has, under a pinned clock
(start_template.FrozenClock), and what it records becomes a template: each stand-in value
replaced by a marker (NUL and a letter), and the job hash's fields by a slot that RQ's own
`to_dict` fills in for each job.

A template is trusted only once it has given RQ's own finish byte for byte twice: for a second
stand-in job of other values (and the same objects left behind: the job's, the worker's and
the execution's fields), and for the first real job of its shape, whose finish RQ's code
records as before. A shape whose finish reads Redis (result_ttl=0 deletes the job, which lists
its executions first), or whose recording the markers cannot describe, keeps RQ's finish.
"""

from __future__ import annotations

import re
from base64 import b64encode
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from herder.worker.fast_path.start_template import (
    INT_RANGE,
    STAND_IN_EXECUTION,
    STAND_IN_JOB,
    STAND_IN_QUEUE,
    STAND_IN_TIME,
    NotTemplatable,
    whole_seconds,
)
from herder.worker.fast_path.wire import Framed, _framed, frame, framed_fields

# The finish's stand-in times: the job started at STAND_IN_TIME (its execution a moment
# before), ended a little over a second later, and the finish ran half a second after that.
# Their floats (redis-py's repr) are distinct and appear in no other argument.
STAND_IN_EXECUTION_START = STAND_IN_TIME - timedelta(microseconds=4321)
STAND_IN_ENDED = STAND_IN_TIME + timedelta(seconds=1, microseconds=234567)
STAND_IN_CLOCK = STAND_IN_ENDED + timedelta(microseconds=500123)
STAND_IN_RESULT = "herder-stand-in-result"
# The second stand-in, the template's check: other values everywhere.
CHECK_JOB, CHECK_QUEUE, CHECK_EXECUTION = "herder-check-job", "herder-check-queue", "c1" * 16
CHECK_SHIFT = timedelta(days=3, seconds=7, microseconds=111)
CHECK_RESULT = {"herder": "check", "n": 7}

_MARK = re.compile(rb"\x00(.)", re.DOTALL)
_SLOT = object()  # the job hash's fields, from the job's own to_dict


class FinishTemplate:
    """One recorded finish with its stand-ins marked, for the jobs of one shape."""

    def __init__(self, shape: tuple[Any, ...], commands: list[list[Any]], offsets: list[int]) -> None:
        self.shape = shape
        self.offsets = offsets
        self.count = len(commands)
        self.args = sum(1 + len(c) for c in commands) - 1  # and the job hash's fields (the slot)
        # The commands framed as far as they are the same for every job: constant bulk strings
        # (each command's argument count first) joined into one bytes, then what a job fills
        # in: a marker's letter (a whole argument: str), (literals, marks) to join, the slot, or
        # the argument count of the command that holds the slot (_Count: without the slot's).
        segments: list[Any] = []
        for command in commands:
            head: Any = b"%d" % len(command)
            if _SLOT in command:
                head = _Count(len(command) - 1)
                self.slot_command_args = head.n
            for a in (head, *command):
                if type(a) is bytes and b"\x00" not in a:
                    framed = frame(a)
                    if segments and type(segments[-1]) is bytes:
                        segments[-1] += framed
                    else:
                        segments.append(framed)
                elif type(a) is bytes and len(a) == 2:
                    segments.append(a[1:].decode("latin-1"))
                elif type(a) is bytes:
                    parts = _MARK.split(a)
                    segments.append((parts[0::2], [m.decode("latin-1") for m in parts[1::2]]))
                else:
                    segments.append(a)
        self.segments = segments
        self._fill = _compiled(segments)

    @classmethod
    def from_recording(
        cls,
        shape: tuple[Any, ...],
        recorded: list[tuple[Any, ...]],
        mapping: list[Any],
        values: dict[str, bytes],
        stamp: int,
        encode: Callable[[Any], bytes],
    ) -> FinishTemplate:
        """`recorded`: RQ's finish for the stand-in; `mapping`: its job hash's fields as its
        to_dict gives them; `values`: the stand-in values by their marker letter (J, Q and E
        wherever they appear, the others only as a whole argument); `stamp`: the pinned clock's
        whole seconds (an integer near it is a score: a marker of its offset)."""
        whole = {v: b"\x00" + k.encode() for k, v in values.items() if k not in "JQE"}
        inner = [(values[k], b"\x00" + k.encode()) for k in "EJQ"]
        flat = [encode(a) for a in mapping]
        offsets: list[int] = []
        commands: list[list[Any]] = []
        slots = 0
        for command in recorded:
            args: list[Any] = []
            tail: list[Any] = []
            if (
                len(command) > 4
                and [encode(a) for a in command[2:]] == flat
                and encode(command[0]) == b"HSET"
            ):
                slots += 1
                command, tail = command[:2], [_SLOT]
            for a in command:
                if type(a) is int:
                    if abs(a - stamp) < INT_RANGE:
                        if a - stamp not in offsets:
                            offsets.append(a - stamp)
                        if len(offsets) > 26:
                            raise NotTemplatable("more than 26 different times")
                        args.append(b"\x00" + bytes([96 + offsets.index(a - stamp) + 1]))
                    else:
                        args.append(b"%d" % a)
                    continue
                a = encode(a)
                if b"\x00" in a:
                    raise NotTemplatable("a NUL byte in a recorded argument")
                if a in whole:
                    args.append(whole[a])
                    continue
                for stand_in, mark in inner:
                    a = a.replace(stand_in, mark)
                args.append(a)
            commands.append(args + tail)
        if slots != 1:
            raise NotTemplatable(f"the job's hash written {slots} times, not once")
        return cls(shape, commands, offsets)

    def fill(
        self, values: dict[str, bytes], mapping: list[Any] | dict[str, Any], t: datetime, encode: Any
    ) -> Framed:
        """The commands for one job, framed: `values` by marker letter (as from_recording's, of
        this job), `mapping` its to_dict's fields (the dict, or flat_mapping's list), `t` the
        finish's time."""
        if self.offsets:
            stamp = whole_seconds(t)
            for i, k in enumerate(self.offsets):
                values[chr(97 + i)] = b"%d" % (stamp + k)
        if isinstance(mapping, list):
            framed, n = _framed(mapping, encode), len(mapping)
        else:
            framed, n = framed_fields(mapping, encode)
        count = b"%d" % (self.slot_command_args + n)  # the slot's command's arguments
        data = self._fill(values, framed, count)
        return Framed(data, self.args + n, self.count)


def _compiled(segments: list[Any]) -> Callable[[dict[str, bytes], bytes, bytes], bytes]:
    """The segments as one bytes format, filled in by one `%`: a function made here for the
    template (its source holds marker letters and lengths only; the constant bytes are in the
    format), as the per-segment loop it replaces cost a tenth of a job."""
    fmt: list[bytes] = []
    args: list[str] = []
    used: set[str] = set()
    for segment in segments:
        if type(segment) is bytes:
            fmt.append(segment.replace(b"%", b"%%"))
        elif type(segment) is str:
            fmt.append(b"$%d\r\n%b\r\n")
            args += [f"len(v_{segment})", f"v_{segment}"]
            used.add(segment)
        elif type(segment) is tuple:
            literals, marks = segment
            fmt.append(
                b"$%d\r\n" + b"%b".join(literal.replace(b"%", b"%%") for literal in literals) + b"\r\n"
            )
            args.append(" + ".join([str(sum(map(len, literals))), *(f"len(v_{m})" for m in marks)]))
            args += [f"v_{m}" for m in marks]
            used.update(marks)
        elif segment is _SLOT:
            fmt.append(b"%b")
            args.append("mapping")
        else:  # the slot's command's argument count: its own arguments and the slot's
            fmt.append(b"$%d\r\n%b\r\n")
            args += ["len(count)", "count"]
    if not all(m.isascii() and m.isalpha() and len(m) == 1 for m in used):
        raise NotTemplatable(f"a marker that is no letter: {sorted(used)}")
    source = "def fill(values, mapping, count):\n"
    source += "".join(f"    v_{m} = values[{m!r}]\n" for m in sorted(used))
    source += f"    return FORMAT % ({', '.join(args)},)\n"
    scope: dict[str, Any] = {"FORMAT": b"".join(fmt)}
    exec(compile(source, "<finish template>", "exec"), scope)  # noqa: S102 - letters and numbers only
    return scope["fill"]


class _Count:
    """The argument count of the command holding the slot: n, and the slot's arguments."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


def flat_mapping(fields: dict[str, Any]) -> list[Any]:
    """A to_dict's fields as redis-py's HSET(mapping=...) sends them: key, value, key, value."""
    flat: list[Any] = []
    for pair in fields.items():
        flat.extend(pair)
    return flat


def result_value(serializer: Any, value: Any) -> str:
    """The XADD's return_value as RQ's Result.serialize makes it (RQ's own serializer)."""
    return b64encode(serializer.dumps(value)).decode()


def stand_in_values(
    job_id: str, queue: str, execution: str, result: Any, start: datetime, ended: datetime,
    execution_start: datetime, serializer: Any, encode: Callable[[Any], bytes],
) -> dict[str, bytes]:  # fmt: skip
    """The marker letters' values for a job of these values (the stand-ins', or a real job's)."""
    values = {
        "J": job_id.encode(),
        "Q": queue.encode(),
        "E": execution.encode(),
        "W": encode((ended - start).total_seconds()),
        "S": encode(execution_start.timestamp()),
        "T": encode(ended.timestamp()),
    }
    if result is not None:
        values["R"] = result_value(serializer, result).encode()
    return values


__all__ = [
    "CHECK_EXECUTION",
    "CHECK_JOB",
    "CHECK_QUEUE",
    "CHECK_RESULT",
    "CHECK_SHIFT",
    "STAND_IN_CLOCK",
    "STAND_IN_ENDED",
    "STAND_IN_EXECUTION",
    "STAND_IN_EXECUTION_START",
    "STAND_IN_JOB",
    "STAND_IN_QUEUE",
    "STAND_IN_RESULT",
    "STAND_IN_TIME",
    "FinishTemplate",
    "flat_mapping",
    "result_value",
    "stand_in_values",
]
