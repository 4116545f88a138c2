"""The worker <-> master channel, at version VERSION below (docs/protocol.md): both ends import this.

worker -> master, on the worker's private stdout: one line per message, built by the
`*_line` functions, read by `parse_line`. master -> worker, on the worker's stdin:
`STOP`, `PAUSE`, `RESUME`, `RETIRE`, and `end <job-id>` (`end_request`), read by `master_request`.
A program given as --worker-command learns what it needs from the environment variables
named here (it may ignore `end`: herder sends it only to its own RQ workers). Pure code,
standard library only, unit-tested directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote

from herder.common.lines import MAX_LINE_BYTES, LineSplitter

__all__ = ["MAX_LINE_BYTES", "LineSplitter"]  # re-exported: the cap is part of the protocol

# Version 2: `busy` comes the moment the dequeue returns, before the queue's own
# bookkeeping (version 1 workers may send it later; the master accepts both).
# Version 3: `idle` may say why the worker takes no jobs (PAUSE_REASONS), and the master
# may send `pause` and `resume`.
# Version 4: the master may send `end <job-id>`: end a job herder gave up on as RQ ends an
# abandoned job (docs/design.md, "When herder gives up on a job"); the worker frames that
# work as `busy <job-id> ...` then `done <job-id> <ts> ended`, which counts as no job.
# Version 5: `busy` may also name the job's queue and function (the per-function job metrics):
# `busy <job-id> <ts> <timeout|none> <queue> <function>`.
# Version 6: `beat` may say for how many seconds the worker's main loop has made no progress
# outside the job's own code (a Redis call that never returns): `beat <job-id> <ts> <stuck>`.
# Version 7: `busy`'s queue and function are percent-encoded (a space, `%`, non-ASCII), so a
# queue named as RQ allows (`"bulk jobs"`) keeps its name in the metrics.
# Version 8: a worker process running jobs in several threads tags `busy`, `beat` and `done`
# with the thread they are about: `t<i> busy ...` (no tag: thread 0, as every older worker).
# Version 9: a worker knows its own jobs limit (ENV_JOBS_LIMIT) and the master may send `retire`;
# a worker that takes no more jobs for either says `idle <ts> retiring` until `stop`. And
# `wait <ts> <seconds> <what>`: a worker that cannot reach what it needs (Redis) says what it
# waits for and for how long, each heartbeat interval, even while its main thread is blocked in
# a call (a side thread writes it). An older worker never sends either.
# Version 10: `done` may say the CPU seconds the job took, and the seconds its thread waited for
# a CPU (`done <job-id> <ts> <outcome> <cpu> [<runq>]`), for the advice on threads or processes
# (CPU time against busy time, a busy host's wait for a CPU left out).
VERSION = 10
SUPPORTED_VERSIONS = tuple(str(v) for v in range(1, VERSION + 1))  # `ready` accepts each of them
MAX_THREADS = 256  # a tag past this is malformed
VERBS = ("ready", "busy", "beat", "done", "idle", "stop", "wait")
MAX_WAIT_TEXT = 300  # characters of a `wait` line's `what`; a longer one is cut
# Why an idle worker takes no jobs: `rq suspend` (every host), or `herder pause` (this one);
# or, for good, `retiring`: at its jobs limit, or told `retire`, it waits for `stop`.
RETIRING = "retiring"
PAUSE_REASONS = ("suspended", "paused", RETIRING)

STOP = b"stop\n"  # master -> worker: finish the current job, then exit
PAUSE = b"pause\n"  # master -> worker: finish the current job, then take no new one
RESUME = b"resume\n"  # master -> worker: take jobs again
RETIRE = b"retire\n"  # master -> worker: finish the current job, take no more, wait for `stop`
END = "end"  # master -> worker: `end <job-id>`, run the given-up job's ending (RQ's callbacks...)
OUTCOMES = ("ok", "failed", "ended")  # `done`: the job's own outcome, or an ending's

# The environment a worker starts with: the interface of any --worker-command program.
ENV_REDIS_URL = "HERDER_REDIS_URL"  # never on argv, where `ps` would show a password
ENV_SLOT = "HERDER_SLOT"
ENV_POOL = "HERDER_POOL"  # the pool the worker works for ("default" without pools)
ENV_QUEUES = "HERDER_QUEUES"  # comma-separated, in priority order (no comma in a name then)
ENV_HEARTBEAT_INTERVAL = "HERDER_HEARTBEAT_INTERVAL"  # seconds between `idle`/`beat` lines
ENV_PROTOCOL_VERSION = "HERDER_PROTOCOL_VERSION"
# The most jobs this worker takes (its pool's max_jobs plus its own jitter draw); unset: no limit.
ENV_JOBS_LIMIT = "HERDER_JOBS_LIMIT"  # not HERDER_MAX_JOBS: that is the setting, for the master
# Set by the fork server only: "master,middle", the pids a forked worker's parent may be.
ENV_PARENT_PIDS = "HERDER_PARENT_PIDS"


class ProtocolError(ValueError):
    """A line that is not a valid protocol message. Counted and logged, never fatal."""


@dataclass(slots=True)  # not frozen: a frozen __init__ sets each field through object.__setattr__,
# and the master makes one of these for every line of every worker
class Message:
    verb: str
    ts: float
    job_id: str | None = None
    ok: bool | None = None  # `done`: True ok, False failed, None an ending (no job of its own)
    # Seconds the job may run (RQ's job.timeout); None when the worker did not say,
    # -1 for a job that may run forever.
    timeout: float | None = None
    paused: str | None = None  # `idle`: why it takes no jobs (PAUSE_REASONS), if it does not
    queue: str | None = None  # `busy` (version 5): the job's queue
    func: str | None = None  # `busy` (version 5): the job's function, as RQ names it
    stuck: float = 0.0  # `beat` (version 6): seconds the main loop made no progress outside the job
    thread: int = 0  # version 8: the thread of a threaded worker the line is about
    waited: float = 0.0  # `wait` (version 9): seconds it has waited
    what: str | None = None  # `wait` (version 9): what it waits for, a short sentence
    cpu: float | None = None  # `done` (version 10): the job's CPU seconds; None: not said
    runq: float | None = None  # `done` (version 10): seconds it waited for a CPU; None: not said


# ---- worker side: building lines -------------------------------------------------------


def ready_line(pid: int, ts: float) -> bytes:
    return f"ready {pid} {ts:.6f} {VERSION}\n".encode()


def idle_line(ts: float, paused: str | None = None) -> bytes:
    return f"idle {ts:.6f}{' ' + paused if paused else ''}\n".encode()


def busy_line(
    job_id: str, ts: float, timeout: float | None, queue: str | None = None, func: str | None = None
) -> bytes:
    field = "" if timeout is None else f" {int(timeout) if timeout == int(timeout) else timeout}"
    if queue is not None and func is not None:  # a name with a space or too long is unnamed
        field = field or " none"
        field += f" {_name(queue)} {_name(func)}"
    return f"busy {job_id} {ts:.6f}{field}\n".encode()


def _name(text: str) -> str:
    """A queue or function name fit for one field (version 7): a space, a `%` and any character
    outside printable ASCII percent-encoded (RQ accepts any queue name); an empty, unprintable
    or overlong one is `?`."""
    if not 0 < len(text) <= MAX_NAME or not text.isprintable():
        return "?"
    field = quote(text, safe=NAME_SAFE)
    return field if len(field) <= MAX_FIELD else "?"


# Printable ASCII but the space (the field separator) and `%` (the escape): left as they are.
NAME_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
MAX_NAME = 200
MAX_FIELD = 3 * MAX_NAME  # encoded: a busy line with two names stays far below MAX_LINE_BYTES


def beat_line(job_id: str, ts: float, stuck: float = 0.0) -> bytes:
    """`stuck`: seconds the main loop has made no progress outside the job's own code (0: none)."""
    return f"beat {job_id} {ts:.6f}{f' {stuck:.1f}' if stuck > 0 else ''}\n".encode()


def done_line(
    job_id: str, ts: float, ok: bool | None, cpu: float | None = None, runq: float | None = None
) -> bytes:
    """ok True/False: the job's outcome; None: an ending the master asked for (`end`). `cpu`:
    the CPU seconds the job took, `runq` the seconds it waited for a CPU (version 10), each left
    out when unknown (`runq` needs `cpu`)."""
    outcome = "ended" if ok is None else "ok" if ok else "failed"
    extra = "" if cpu is None else f" {max(0.0, cpu):.4f}"
    if cpu is not None and runq is not None:
        extra += f" {max(0.0, runq):.4f}"
    return f"done {job_id} {ts:.6f} {outcome}{extra}\n".encode()


def wait_line(ts: float, waited: float, what: str) -> bytes:
    """Waiting `waited` seconds so far for `what` ("Redis at host:6379: connection refused"):
    one line, printable, cut to MAX_WAIT_TEXT characters."""
    text = " ".join("".join(c if c.isprintable() else "?" for c in what).split())[:MAX_WAIT_TEXT]
    return f"wait {ts:.6f} {max(0.0, waited):.1f} {text or '?'}\n".encode()


def stop_line(ts: float) -> bytes:
    return f"stop {ts:.6f}\n".encode()


def for_thread(line: bytes, thread: int) -> bytes:
    """A `busy`, `beat` or `done` line about one thread of a threaded worker (version 8)."""
    return line if thread == 0 else b"t%d %s" % (thread, line)


# ---- master side: reading lines --------------------------------------------------------


def _ts(field: str) -> float:
    try:
        value = float(field)
    except ValueError:
        raise ProtocolError(f"bad timestamp {field[:40]!r}") from None
    if value != value or value < 0:  # NaN or negative
        raise ProtocolError(f"bad timestamp {field[:40]!r}")
    return value


def _job_id(field: str) -> str:
    if not field or len(field) > 256 or not field.isprintable():
        raise ProtocolError("bad job id")
    return field


def parse_line(raw: bytes) -> Message:
    """Parse one line (without its newline) into a Message or raise ProtocolError."""
    if raw[:5] == b"idle " and raw.count(b" ") == 1:  # a fleet's most common line: `idle <ts>`
        try:
            return Message("idle", _ts(raw[5:].decode("ascii")))
        except (ProtocolError, UnicodeDecodeError):
            pass  # the general parse below says what is wrong
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("not UTF-8") from None
    fields = text.strip().split()
    if not fields:
        raise ProtocolError("empty line")
    thread = 0
    if fields[0][:1] == "t" and fields[0][1:].isdigit():  # version 8: `t<i> busy|beat|done ...`
        thread = int(fields[0][1:])
        if not 0 < thread < MAX_THREADS or len(fields) < 2 or fields[1] not in THREADED_VERBS:
            raise ProtocolError(f"bad thread tag {fields[0][:20]!r}")
        fields = fields[1:]
    msg = _parse_fields(fields)
    return msg if thread == 0 else replace(msg, thread=thread)


THREADED_VERBS = ("busy", "beat", "done")  # what a thread says; ready, idle and stop are the process's


def _ready(args: list[str]) -> Message:
    # ready <pid> <ts> [<protocol-version>]
    if len(args) not in (2, 3):
        raise ProtocolError("wrong number of fields for 'ready'")
    if not args[0].isdigit():
        raise ProtocolError(f"bad pid {args[0][:40]!r}")
    if len(args) == 3 and args[2] not in SUPPORTED_VERSIONS:
        raise ProtocolError(f"unsupported protocol version {args[2][:20]!r}")
    return Message("ready", _ts(args[1]))


def _busy(args: list[str]) -> Message:
    # busy <job-id> <ts> [<timeout-seconds|none> [<queue> <function>]]
    if len(args) not in (2, 3, 5):
        raise ProtocolError("wrong number of fields for 'busy'")
    timeout = None
    if len(args) >= 3 and args[2] != "none":
        timeout = _ts(args[2]) if args[2] != "-1" else -1.0
    queue, func = (_field(args[3]), _field(args[4])) if len(args) == 5 else (None, None)
    return Message("busy", _ts(args[1]), job_id=_job_id(args[0]), timeout=timeout, queue=queue, func=func)


def _beat(args: list[str]) -> Message:
    # beat <job-id> <ts> [<stuck-seconds>]: the process is alive while a job runs
    if len(args) not in (2, 3):
        raise ProtocolError("wrong number of fields for 'beat'")
    stuck = _ts(args[2]) if len(args) == 3 else 0.0
    return Message("beat", _ts(args[1]), job_id=_job_id(args[0]), stuck=stuck)


def _done(args: list[str]) -> Message:
    # done <job-id> <ts> ok|failed|ended [<cpu-seconds> [<runq-seconds>]]
    if len(args) not in (3, 4, 5):
        raise ProtocolError("wrong number of fields for 'done'")
    if args[2] not in OUTCOMES:
        raise ProtocolError(f"bad outcome {args[2][:20]!r}")
    ok = None if args[2] == "ended" else args[2] == "ok"
    cpu = _ts(args[3]) if len(args) >= 4 else None
    runq = _ts(args[4]) if len(args) == 5 else None
    return Message("done", _ts(args[1]), job_id=_job_id(args[0]), ok=ok, cpu=cpu, runq=runq)


def _idle(args: list[str]) -> Message:
    # idle <ts> [suspended|paused|retiring]
    if len(args) == 1:
        return Message("idle", _ts(args[0]))
    if len(args) != 2:
        raise ProtocolError("wrong number of fields for 'idle'")
    if args[1] not in PAUSE_REASONS:
        raise ProtocolError(f"bad pause reason {args[1][:20]!r}")
    return Message("idle", _ts(args[0]), paused=args[1])


def _stop(args: list[str]) -> Message:
    if len(args) != 1:
        raise ProtocolError("wrong number of fields for 'stop'")
    return Message("stop", _ts(args[0]))


def _wait(args: list[str]) -> Message:
    # wait <ts> <seconds> <what...>: the rest of the line, words joined by one space
    if len(args) < 3:
        raise ProtocolError("wrong number of fields for 'wait'")
    what = " ".join(args[2:])
    if len(what) > MAX_WAIT_TEXT or not what.isprintable():
        raise ProtocolError("bad text in 'wait'")
    return Message("wait", _ts(args[0]), waited=_ts(args[1]), what=what)


# One parser per verb: a dict lookup, not a match tried case by case (the master reads a line
# per worker per second at idle, and several per job).
_PARSERS = {
    "ready": _ready, "busy": _busy, "beat": _beat, "done": _done, "idle": _idle, "stop": _stop, "wait": _wait,
}  # fmt: skip
assert tuple(_PARSERS) == VERBS


def _parse_fields(fields: list[str]) -> Message:
    parse = _PARSERS.get(fields[0])
    if parse is None:
        raise ProtocolError(f"unknown verb {fields[0][:40]!r}")
    return parse(fields[1:])


def _field(text: str) -> str:
    """A name from a `busy` line, percent-decoded (version 7; older workers never send a `%`)."""
    name = unquote(text, errors="replace")
    if len(text) > MAX_FIELD or not name.isprintable():
        raise ProtocolError("bad queue or function name")
    return name


def end_request(job_id: str) -> bytes:
    """Master side: ask an idle worker to end a job herder gave up on."""
    return f"{END} {_job_id(job_id)}\n".encode()


def jobs_limit(environ: Mapping[str, str]) -> int | None:
    """Worker side: its jobs limit from its environment (ENV_JOBS_LIMIT), None for none (or one
    it cannot read: a worker never stops for a limit it misread)."""
    text = environ.get(ENV_JOBS_LIMIT, "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def master_request(line: bytes) -> tuple[str, str | None] | None:
    """Worker side: ("stop" | "pause" | "resume" | "retire", None) or ("end", job id) for a
    line from the master's stdin; None for anything else (ignored)."""
    fields = line.decode("utf-8", "replace").split()
    if len(fields) == 1 and fields[0] in ("stop", "pause", "resume", "retire"):
        return fields[0], None
    if len(fields) == 2 and fields[0] == END:
        try:
            return END, _job_id(fields[1])
        except ProtocolError:
            return None
    return None
