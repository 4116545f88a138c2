"""The one seam between herder and RQ's internals, for every rq herder supports (rq_support).

herder subclasses RQ's worker and scheduler and ends jobs the way RQ ends them, so it touches
names RQ does not document, and a few that moved between rq 2 and rq 3 (rq 3 split the job's
callbacks, failure recording and rate limits out of the Job class). Every such name is used
through this module, and `missing()` checks them all once at start: a process that finds one
missing or changed says so with the rq version and takes RQ's public path instead (the worker
its plain RQ lifecycle, not the fast path), never a crash at run time.

Imported by the master and the worker processes (never the watchdog): it may import rq and redis.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import redis
import rq
from rq.job import Job, JobStatus
from rq.worker import BaseWorker

from herder.common.rq_support import parse_version

RQ_VERSION = parse_version(rq.__version__)
REDIS_PY_VERSION = parse_version(redis.__version__)
RQ3 = RQ_VERSION >= (3, 0)

if RQ3:
    from rq.callbacks import execute_failure_callback as _failure_callback
    from rq.callbacks import execute_stopped_callback as _stopped_callback
    from rq.job_lifecycle import call_exception_handlers as _call_handlers
    from rq.job_lifecycle import record_job_failure as _record_failure
    from rq.rate_limit import release_slot as _release_slot


def describe() -> str:
    return f"rq {rq.__version__}, redis-py {redis.__version__}"


# ---- a job's ending, as this rq ends one -------------------------------------------------


def failure_callback(job: Job, death_penalty_class: type, *exc_info: Any) -> None:
    """The job's on_failure, under RQ's callback timeout; raises what the callback raised."""
    if RQ3:
        _failure_callback(job, death_penalty_class, *exc_info)
    else:
        job.execute_failure_callback(death_penalty_class, *exc_info)


def stopped_callback(job: Job, death_penalty_class: type) -> None:
    """The job's on_stopped, under RQ's callback timeout."""
    if RQ3:
        _stopped_callback(job, death_penalty_class)
    else:
        job.execute_stopped_callback(death_penalty_class)


def stopped_instead_of_failed(job: Job) -> None:
    """A job stopped by RQ's send_stop_job_command, in a worker that runs it in process: rq 2
    sends it down its failure path (rq 3's goes through _finalize_failure, which herder's worker
    ends as stopped). There its failure callback is its stopped one, as rq 2's forking worker
    runs for a stopped horse; RQ still marks it stopped, never failed or retried."""
    if not RQ3:
        job.execute_failure_callback = lambda death_penalty_class, *exc_info: stopped_callback(  # type: ignore[method-assign]
            job, death_penalty_class
        )


def exception_handlers(worker: BaseWorker) -> list[Callable[..., Any]]:
    """The worker's exception handlers (`--exception-handler`, RQ's default ones)."""
    return list(worker._exc_handlers)


def call_exception_handlers(handlers: Iterable[Callable[..., Any]], job: Job, *exc_info: Any) -> None:
    """Each handler in turn until one returns an explicit falsy value (RQ's rule, both rqs)."""
    if RQ3:
        _call_handlers(handlers, job, *exc_info)
        return
    for handler in handlers:
        go_on = handler(job, *exc_info)
        if go_on is not None and not go_on:
            break


def record_failure(job: Job, exc_string: str, pipeline: Any) -> None:
    """A failure with no worker behind it (an abandoned job): FAILED, the FailedJobRegistry and
    a failure Result with an empty worker name, as RQ's registry clean-up writes it."""
    if RQ3:
        _record_failure(job, exc_string, pipeline)
    else:
        job.set_status(JobStatus.FAILED, pipeline=pipeline)
        job._handle_failure(exc_string, pipeline, worker_name="")


def release_slot(job: Job) -> None:
    """Free the job's rate-limit slot (rq 3's RateLimit; before it there are none)."""
    if RQ3:
        _release_slot(job)


def abandoned_sends_webhooks() -> bool:
    """rq 3's clean-up of an abandoned job sends its FAILED webhooks; rq 2's does not."""
    return RQ3


# ---- the worker --------------------------------------------------------------------------


def has_finalize_hooks() -> bool:
    """rq 3 ends a job through `_finalize_success` / `_finalize_failure`; rq 2 inline in perform_job."""
    return hasattr(BaseWorker, "_finalize_failure")


def stopped_job_id(worker: BaseWorker) -> str | None:
    """The job RQ's send_stop_job_command asked this worker to stop."""
    return worker._stopped_job_id


def worker_state(worker: BaseWorker) -> Any:
    return worker._state


def restore_worker_state(worker: BaseWorker, state: Any) -> None:
    worker._state = state


def ordered_queues(worker: BaseWorker) -> list[Any]:
    """The worker's queues in the order its dequeue strategy gives them now."""
    return list(worker._ordered_queues)


def pool_connection(pool: Any) -> Any:
    """A connection of the pool's own: redis-py before 5.3 wants a command name, later ones none."""
    if REDIS_PY_VERSION < (5, 3):
        return pool.get_connection("EVALSHA")
    return pool.get_connection()


# ---- the scheduler -----------------------------------------------------------------------


def scheduler_queue_names(scheduler: Any) -> set[str]:
    return set(scheduler._queue_names)


def scheduler_locks(scheduler: Any) -> set[str]:
    return set(scheduler._acquired_locks)


def set_scheduler_locks(scheduler: Any, held: set[str]) -> None:
    """The queues whose locks it holds now; RQ rebuilds its registries for them on its next pass."""
    scheduler._acquired_locks = set(held)
    scheduler._scheduled_job_registries = []


# ---- the check at start ------------------------------------------------------------------

# What the fast path (herder.worker.fast_path) overrides or calls on RQ's worker, with the
# parameters it passes: RQ's own lifecycle is recorded through these, so each must be there.
FAST_PATH_METHODS: dict[str, tuple[str, ...]] = {
    "_finalize_success": ("job", "queue", "execution", "return_value"),
    "_finalize_failure": ("job", "queue", "execution", "exc_info"),
    "handle_execution_ended": ("job", "queue", "heartbeat_ttl"),
    "handle_job_success": ("job", "queue", "started_job_registry", "execution"),
    "prepare_execution": ("job",),
    "prepare_job_execution": ("job", "remove_from_intermediate_queue"),
    "set_state": ("state", "pipeline"),
    "heartbeat": ("timeout", "pipeline"),
    "get_heartbeat_ttl": ("job",),
    "dequeue_job_and_maintain_ttl": ("timeout", "max_idle_time"),
    "reorder_queues": ("reference_queue",),
}
# Module functions the fast path pins (the start template's clock) or answers cheaper.
FAST_PATH_FUNCTIONS = (
    ("rq.utils", "now"),
    ("rq.utils", "current_timestamp"),
    ("rq.utils", "utcformat"),
    ("rq.utils", "utcparse"),
    ("rq.executions", "uuid4"),
    ("rq.serializers", "resolve_serializer"),
)
# redis-py's pipeline and connection internals the recording and the script call rest on.
REDIS_PY_NAMES = (
    ("redis.client", "Pipeline", "immediate_execute_command"),
    ("redis.client", "Pipeline", "command_stack"),
    ("redis.connection", "Connection", "send_packed_command"),
    ("redis.connection", "Connection", "read_response"),
)


def fast_path_missing() -> str | None:
    """Why the fast path cannot run on this rq and redis-py, or None when every name it uses is
    there with the parameters it passes and redis-py's pipeline records as it expects."""
    if not RQ3:
        return f"rq {rq.__version__} ends a job without the hooks the fast path records (rq >= 3.0 has them)"
    from rq.worker import SimpleWorker

    for name, params in FAST_PATH_METHODS.items():
        method = getattr(SimpleWorker, name, None)
        if method is None:
            return f"RQ's worker has no {name}()"
        have = list(inspect.signature(method).parameters)[1:]
        if list(params) != have[: len(params)]:
            return f"RQ's {name}() takes ({', '.join(have)}), not ({', '.join(params)})"
    import importlib

    for module_name, attr in FAST_PATH_FUNCTIONS:
        if not callable(getattr(importlib.import_module(module_name), attr, None)):
            return f"{module_name} has no {attr}()"
    for module_name, cls, attr in REDIS_PY_NAMES:
        owner = getattr(importlib.import_module(module_name), cls)
        if attr == "command_stack":
            continue  # an instance attribute: checked by recording below
        if not callable(getattr(owner, attr, None)):
            return f"redis-py's {cls} has no {attr}()"
    return _recording_works()


WORKER_ATTRIBUTES = ("_stopped_job_id", "_exc_handlers")  # every herder worker reads these
FAST_PATH_ATTRIBUTES = ("_ordered_queues", "_state", "executions")  # and the fast path these


def worker_missing(worker: BaseWorker, fast: bool = False) -> str | None:
    """A name the seam reads on a built worker that it does not keep, or None."""
    for attr in WORKER_ATTRIBUTES + (FAST_PATH_ATTRIBUTES if fast else ()):
        if not hasattr(worker, attr):
            return f"RQ's worker keeps no {attr}"
    return None


def names_missing() -> list[str]:
    """Every other name of RQ's the seam uses (the job's ending, the stop request, the scheduler's
    locks), checked on objects built here without a round trip: one line each that is missing.
    The master says them at start, with the versions, so an rq that moved one is named there and
    not found by a job at run time."""
    from rq.scheduler import RQScheduler

    client = redis.Redis()  # nothing is sent
    problems = []
    if not RQ3:
        for name in ("execute_failure_callback", "execute_stopped_callback", "_handle_failure"):
            if not callable(getattr(Job, name, None)):
                problems.append(f"RQ's Job has no {name}()")
    scheduler = RQScheduler([], connection=client)
    for name in ("_queue_names", "_acquired_locks", "_scheduled_job_registries"):
        if not hasattr(scheduler, name):
            problems.append(f"RQ's scheduler keeps no {name}")
    return problems  # a worker's own names: worker_missing(), on the worker herder builds


def _recording_works() -> str | None:
    """A pipeline records the commands given it as (name, args...) tuples, unsent."""
    from redis.client import Pipeline

    client = redis.Redis()  # no connection is made: nothing is sent
    pipe = Pipeline(client.connection_pool, client.response_callbacks, True, None)
    pipe.hset("herder:probe", "f", "v")
    stack = getattr(pipe, "command_stack", None)
    if not isinstance(stack, list) or not stack or tuple(stack[0][0]) != ("HSET", "herder:probe", "f", "v"):
        return f"redis-py {redis.__version__}'s pipeline keeps its commands in another form"
    pipe.reset()
    return None
