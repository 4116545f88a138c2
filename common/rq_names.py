"""How herder names its things in RQ's Redis: its workers, and the leases that say a worker
process is alive. The worker writes its lease, its master vouches for it too while it holds
a job, and any master's recovery sweep reads it (herder.supervisor.redis_side.recovery). Stdlib only.
"""

from __future__ import annotations

import os

WORKER_PREFIX = "herder."
LEASE_PREFIX = "herder:alive:"


def rq_worker_name(host: str, slot: int | str, pid: int, thread: int = 0) -> str:
    """The name herder's RQ worker registers under: unique per process (and per thread of a
    threaded worker: `.t<i>` after the first), and marked as herder's, so a sweep knows whose
    job it may judge."""
    return f"{WORKER_PREFIX}{host}.{slot}.{pid}" + (f".t{thread}" if thread else "")


def client_name() -> str:
    """The name each Redis connection of a herder worker process gives itself (CLIENT
    SETNAME), so the process can find its own blocked dequeue to wake (worker/presence.py)."""
    return f"herder-worker-{os.getpid()}"


def is_herder_worker(name: str) -> bool:
    return name.startswith(WORKER_PREFIX)


def lease_key(worker_name: str) -> str:
    """Exists while the worker process is alive (its TTL is Config.lease_seconds)."""
    return LEASE_PREFIX + worker_name


# herder's scheduler process (herder.worker.scheduler) takes RQ's scheduler locks under a name
# its master chose and passes in the environment, so the master can release exactly the locks
# of a scheduler process it reaped.
SCHEDULER_PREFIX = "herder-scheduler:"
ENV_SCHEDULER_NAME = "HERDER_SCHEDULER_NAME"


def rq_scheduler_name(host_id: str, token: str) -> str:
    """Unique per process (the token), and names its host for `herder status`."""
    return f"{SCHEDULER_PREFIX}{host_id}:{token}"


# RQ's cron scheduler has no lock of its own ("make sure it runs in one place"): herder's
# scheduler processes take this one, with RQ's owner-checked lock scripts, under the same name
# as their queue locks; only the holder enqueues cron jobs.
CRON_LOCK_KEY = "herder:cron-lock"


# Jobs herder gave up on (past max_requeues) wait here for their ending, which a worker runs
# as RQ ends an abandoned job (herder.worker.abandoned): job id -> JSON {why, cause, limit}.
# A worker claims one (ENDING_CLAIM_PREFIX + job id, its RQ name) while it runs the ending;
# a claim whose worker's lease is gone may be taken over.
ENDINGS_KEY = "herder:endings"
ENDING_CLAIM_PREFIX = "herder:ending:"


def ending_claim_key(job_id: str) -> str:
    return ENDING_CLAIM_PREFIX + job_id


# herder's fast-path worker numbers its script calls and the script keeps the last one's outcome
# here, so a call sent again after its reply was lost is answered, not run twice
# (herder.worker.fast_path.script). It outlives its worker by an hour at most.
CALL_RECORD_PREFIX = "herder:call:"


def call_record_key(worker_name: str) -> str:
    return CALL_RECORD_PREFIX + worker_name


# How many times herder's recovery has moved a job from a worker (requeued it, or given it up):
# counted in the job's hash (REQUEUES_FIELD: the requeue limit's count) and, the same number,
# under MOVED_PREFIX + job id, which outlives a hash deleted since (a job that deletes itself, a
# result TTL of 0). Both are written by the one move (herder.supervisor.redis_side.recovery's
# MOVE), in its script. A worker notes the latter when it takes or starts a job; its start and
# its finish are fenced on it (herder.worker.fence, and the fast path's script): a worker whose
# job was recovered from it while it could not reach Redis neither starts nor ends that job.
REQUEUES_FIELD = "herder_requeues"
MOVED_PREFIX = "herder:moved:"
MOVED_TTL = 7 * 24 * 3600  # a host cut off longer than this could end a job moved from it

# Lua: the job's moves so far, by its id (one GET: the fast path's script reads it at every take).
MOVES_LUA = f"""
local function moves(job_id)
  return tonumber(redis.call('GET', '{MOVED_PREFIX}' .. job_id) or '0') or 0
end
"""
