"""A taken job rebuilt from its hash as RQ's `Job(id)` + `Job.restore` leaves it, more cheaply.

RQ's dequeue makes a Job and restores it from the hash: its __init__ sets some fifty fields (and
validates the id, reads the clock, resolves the serializer), then restore decodes every key of
the hash and sets the fields again, through a helper call each. About a sixth of a no-op job's
cost. `FastRestore` does the same work once per job on a dict: the fields __init__ leaves, copied
from a job made once, then the hash's own fields parsed as restore parses them.

It is used only where it is checked to be RQ's: RQ's own Job class (or a subclass that changes
neither __init__, restore nor any field restore sets), RQ's default serializer, and a hash with
no field it does not know (a result, an exception, webhooks: RQ's restore). When a worker makes
one it restores stand-in hashes both ways (every field it knows, with values unlike the
defaults; every field empty; only the fields a job must have) and the first real job too, and
keeps it only if every field of the job is the same (type, value, and which values two jobs
share). Anything it cannot parse goes to RQ's restore, whose answer or error stands.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import zlib
from typing import Any

import rq.utils
from rq.job import JOB_ID_PATTERN, UNEVALUATED, Job, JobStatus
from rq.serializers import DefaultSerializer, resolve_serializer

# How restore reads each field it knows, by kind. A field not here (result, exc_info, webhooks...)
# makes the job RQ's to restore. An empty value leaves the field as Job() made it (restore sets the
# same default), except for the fields read whenever they are there (_PRESENT).
_SKIP, _TEXT, _DATE, _INT, _STATUS, _JSON, _BOOL, _META, _DEP_IDS, _DEP_ID = range(10)
_CALLBACKS = ("success", "failure", "stopped")
FIELDS: dict[bytes, tuple[int, str]] = {
    b"data": (_SKIP, ""), b"created_at": (_SKIP, ""),  # read before the others
    b"origin": (_TEXT, "origin"), b"worker_name": (_TEXT, "worker_name"),
    b"description": (_TEXT, "description"), b"group_id": (_TEXT, "group_id"),
    b"rate_limit_key": (_TEXT, "rate_limit_key"),
    b"enqueued_at": (_DATE, "enqueued_at"), b"started_at": (_DATE, "started_at"),
    b"ended_at": (_DATE, "ended_at"), b"last_heartbeat": (_DATE, "last_heartbeat"),
    b"timeout": (_INT, "timeout"),  # RQ's parse_timeout: an int's digits (a '1h' goes to RQ's restore)
    **{name.encode(): (_INT, name) for name in (
        "result_ttl", "failure_ttl", "ttl", "number_of_retries", "retries_left", "repeats_left",
        "rate_limit_concurrency",
    )},
    b"status": (_STATUS, "_status"),
    **{f"{c}_callback_name".encode(): (_TEXT, f"_{c}_callback_name") for c in _CALLBACKS},
    **{f"{c}_callback_timeout".encode(): (_INT, f"_{c}_callback_timeout") for c in _CALLBACKS},
    b"retry_intervals": (_JSON, "retry_intervals"), b"repeat_intervals": (_JSON, "repeat_intervals"),
    b"allow_dependency_failures": (_BOOL, "allow_dependency_failures"),
    b"enqueue_at_front": (_BOOL, "enqueue_at_front"),
    b"enqueue_at_front_on_retry": (_BOOL, "enqueue_at_front_on_retry"),
    b"meta": (_META, "meta"),
    b"dependency_ids": (_DEP_IDS, "_dependency_ids"), b"dependency_id": (_DEP_ID, "_dependency_ids"),
}  # fmt: skip
KNOWN = frozenset(FIELDS)
_PRESENT = frozenset({b"enqueue_at_front", *(k for k in FIELDS if k.endswith(b"_callback_timeout"))})
# RQ's own timestamps, read as its utcparse reads them (anything else: RQ's utcparse).
_RQ_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", re.ASCII)
_STATUSES = {s.value.encode(): s for s in JobStatus}
# Values two jobs may share (RQ's restore shares them too): of immutable types, or these objects.
_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, dt.datetime, JobStatus)


class NotRestorable(Exception):  # noqa: N818 - a verdict, not a mistake
    """This worker's jobs are restored by RQ (its job class, serializer or restore differ)."""


class FastRestore:
    """RQ's restore of a job hash for one worker's job class, connection and serializer."""

    def __init__(self, job_class: type[Job], connection: Any, serializer: Any) -> None:
        if resolve_serializer(serializer) is not DefaultSerializer:
            raise NotRestorable("a serializer other than RQ's default")
        if job_class.__init__ is not Job.__init__ or job_class.restore is not Job.restore:
            raise NotRestorable(f"{job_class.__qualname__} has its own __init__ or restore")
        self.job_class, self.connection, self.serializer = job_class, connection, serializer
        made = job_class("herder-restore-base", connection=connection, serializer=serializer)
        base = dict(vars(made))
        shared = (UNEVALUATED, made.serializer, made.log, connection)
        for name, value in base.items():
            if not (
                isinstance(value, _IMMUTABLE)
                or any(value is s for s in shared)
                or type(value) in (list, dict)
            ):
                raise NotRestorable(f"the job's field {name} is a {type(value).__name__}")
        sets = {*base, *(name for _, name in FIELDS.values()), "data"}  # what __init__ and restore set
        for cls in job_class.__mro__[: job_class.__mro__.index(Job)]:  # a subclass's own names
            if set(vars(cls)) & sets:
                raise NotRestorable(f"{cls.__qualname__} defines a field restore sets")
        # Fields __init__ makes a new list or dict for: a new one for each job, as RQ's.
        self._fresh = tuple(k for k, v in base.items() if type(v) in (list, dict))
        self._base = base
        self._loads = made.serializer.loads

    def restore(self, job_id: str, data: dict[bytes, bytes]) -> Job | None:
        """The job RQ's `job_class(job_id, connection, serializer).restore(data)` makes, or None:
        a hash or an id this does not take (RQ's restore then, which may raise)."""
        if not JOB_ID_PATTERN.fullmatch(job_id):
            return None
        try:
            return self._restore(job_id, data)
        except Exception:  # a field not known here (KeyError), or a value RQ parses its own way
            return None

    def _restore(self, job_id: str, data: dict[bytes, bytes]) -> Job | None:
        raw, created = data.get(b"data"), data.get(b"created_at")
        if raw is None or not created:  # no job (RQ raises), or made now (RQ reads the clock)
            return None
        f = self._base.copy()
        for name in self._fresh:
            f[name] = f[name].copy()
        f["_id"] = job_id
        f["connection"] = self.connection
        try:
            raw = zlib.decompress(raw)
        except zlib.error:
            pass
        # The data setter: the job's function and arguments unread until asked for.
        f["_data"], f["_func_name"], f["_instance"], f["_args"], f["_kwargs"] = (
            raw, UNEVALUATED, UNEVALUATED, UNEVALUATED, UNEVALUATED,
        )  # fmt: skip
        f["created_at"] = _date(created)
        dep_id = None
        for key, v in data.items():
            kind, name = FIELDS[key]
            if not v and key not in _PRESENT:
                continue
            if kind is _TEXT:
                f[name] = v.decode()
            elif kind is _DATE:
                f[name] = _date(v)
            elif kind is _INT:
                f[name] = int(v)
            elif kind is _STATUS:
                f[name] = _STATUSES[v]
            elif kind is _SKIP:
                pass
            elif kind is _JSON or kind is _DEP_IDS:
                f[name] = json.loads(v.decode())
            elif kind is _BOOL:
                f[name] = bool(int(v))
            elif kind is _META:
                f[name] = self._loads(v)  # one it cannot read: RQ's restore keeps its bytes
            elif kind is _DEP_ID:
                dep_id = v
        if dep_id is not None and not data.get(b"dependency_ids"):  # an older RQ's single dependency
            f["_dependency_ids"] = [dep_id.decode()]
        job = self.job_class.__new__(self.job_class)
        job.__dict__ = f
        return job


def _date(value: bytes) -> dt.datetime:
    """RQ's str_to_date: its own timestamp read directly, anything else by RQ's utcparse."""
    text = value.decode()
    if _RQ_TIMESTAMP.fullmatch(text):
        return dt.datetime.fromisoformat(text)  # 3.11's reads the Z as UTC, as RQ's replace() sets it
    return rq.utils.utcparse(text)


def rqs_restore(
    job_class: type[Job], connection: Any, serializer: Any, job_id: str, data: dict[bytes, bytes]
) -> Job:
    """RQ's own: what its dequeue does with a job's hash."""
    job = job_class(job_id, connection=connection, serializer=serializer)
    job.restore(data)
    return job


def same_jobs(first: list[Job], second: list[Job]) -> str | None:
    """None if two lists of jobs made from the same hashes are alike field for field (type,
    value, repr), and share the same values between their jobs; else the first field that is not."""
    for a, b in zip(first, second, strict=True):
        fa, fb = vars(a), vars(b)
        if type(a) is not type(b) or fa.keys() != fb.keys():
            return f"fields {sorted(fa.keys() ^ fb.keys())}"
        for name, va in fa.items():
            vb = fb[name]
            if va is not vb and not (type(va) is type(vb) and va == vb and repr(va) == repr(vb)):
                return f"{name}: {vb!r}, RQ's {va!r}"
    if len(first) < 2:
        return None
    r0, r1, o0, o1 = vars(first[0]), vars(first[1]), vars(second[0]), vars(second[1])
    for name, value in r0.items():  # a value two of RQ's jobs do not share is never shared here
        if (value is r1[name]) != (o0[name] is o1[name]) and not isinstance(value, _IMMUTABLE):
            return f"{name}: shared between two jobs, or not, unlike RQ's"
    return None


def stand_in_hashes() -> list[dict[bytes, bytes]]:
    """Hashes a check restores both ways: every known field with values unlike the defaults,
    every field empty (the ones an empty value fails in RQ too left out), and the least a job has."""
    data = zlib.compress(DefaultSerializer.dumps(("herder.stand_in", None, (1,), {"k": 2})))
    full: dict[bytes, bytes] = {}
    for i, (key, (kind, _)) in enumerate(FIELDS.items()):
        full[key] = {
            _TEXT: b"stand-in " + key, _DATE: b"2002-03-04T05:06:%02d.123456Z" % i, _INT: b"%d" % (100 + i),
            _STATUS: b"queued", _JSON: b"[%d, 2]" % i, _BOOL: b"1", _DEP_IDS: b'["a", "b"]', _DEP_ID: b"c",
            _META: DefaultSerializer.dumps({"m": [i]}),
        }.get(kind, b"")  # fmt: skip
    full[b"data"], full[b"created_at"] = data, b"2001-02-03T04:05:06.000007Z"
    empty = {k: b"" for k in KNOWN - _PRESENT}
    empty[b"created_at"] = full[b"created_at"]  # none: RQ reads the clock (RQ's restore here)
    old = {b"data": data, b"created_at": b"2001-02-03T04:05:06Z", b"dependency_id": b"d", b"timeout": b"-3"}
    least = {b"data": data, b"created_at": full[b"created_at"], b"status": b"started"}
    return [full, empty, least, old]


def checked(
    job_class: type[Job], connection: Any, serializer: Any, job_id: str, data: dict[bytes, bytes]
) -> tuple[FastRestore | None, str]:
    """A FastRestore for this worker if it makes what RQ's restore makes of the stand-in hashes
    and of this real job's hash; else None and why."""
    try:
        fast = FastRestore(job_class, connection, serializer)
    except NotRestorable as exc:
        return None, str(exc)
    hashes = [*stand_in_hashes(), data]
    ids = [f"herder-stand-in-{i}" for i in range(len(hashes) - 1)] + [job_id]
    theirs = [rqs_restore(job_class, connection, serializer, i, h) for i, h in zip(ids, hashes, strict=True)]
    ours = [fast.restore(i, h) for i, h in zip(ids, hashes, strict=True)]
    if any(job is None for job in ours[:-1]):
        return None, "a stand-in job was not restored"
    if ours[-1] is None:  # a real job of fields not known here: the stand-ins only
        theirs, ours = theirs[:-1], ours[:-1]
    why = same_jobs(theirs, ours)  # type: ignore[arg-type]
    return (None, why) if why else (fast, "")
