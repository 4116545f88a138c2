"""Recovery: the one thread that does the master's Redis writes about jobs and workers.

Jobs are herder's responsibility until they finish. This thread:
- requeues the job a reaped worker held (the reconcile loop submits it: the loop never
  waits on Redis, which can hang for a socket timeout at a time);
- sweeps herder's queues every `sweep_interval` seconds, and at once after a worker died
  unexpectedly or Redis came back, for jobs no live worker holds (sweep.py decides);
- vouches for this master's live workers that hold a job (renews their leases) on every
  sweep: a lease is looked at only for the job of a worker named in it, and an idle worker
  renews its own, as it does in the very call that takes a job;
- unregisters dead RQ workers, counts kills for the cluster-wide kill budget, and takes
  tokens from the cluster-wide cull budget (failing closed: no answer from Redis, no cull).

Every move of a job is one Lua script (MOVE): it re-checks, inside Redis, that the job is
still where the sweep saw it and that its holder is still gone, then puts it at the front
of its queue, counted against max_requeues; past the limit it goes to RQ's
FailedJobRegistry instead, with a reason a person can read: for herder's RQ workers by way of an
ending, which a worker runs as RQ ends an abandoned job (callbacks, exception handlers,
Retry, webhooks, rate limits: herder.worker.abandoned); the master only dispatches it. Two
masters racing for one job: one moves it, the other finds it gone. So every job runs at
least once.

A task that fails is retried with backoff, on its own: while Redis is unreachable every
task waits (a requeue is never dropped for want of Redis); a task that fails for any other
reason is given up after MAX_ATTEMPTS, loudly, and never blocks the tasks behind it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.defaults import DEFAULT_FAILURE_TTL
from rq.job import Job
from rq.queue import Queue
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.worker import Worker
from rq.worker_registration import unregister

from herder.common import rq_seam
from herder.common.config import Config, pool_configs
from herder.common.redis_connect import with_script
from herder.common.rq_names import ENDINGS_KEY, MOVED_PREFIX, MOVED_TTL, MOVES_LUA, REQUEUES_FIELD, lease_key
from herder.supervisor.redis_side.budget import CULL_TAKE, cull_keys
from herder.supervisor.redis_side.sweep import Fleet, Popped, Recover, Started, plan

log = logging.getLogger("herder")

MAX_ATTEMPTS = 5
Entry = tuple[str, str, str]  # (source: "wip" or "intermediate", queue, the entry in that list)
RETRY_INITIAL, RETRY_MAX = 0.5, 10.0
SCAN_LIMIT = 1000  # entries read per list per sweep: a huge backlog of orphans takes a few sweeps
COUNT_FIELD = REQUEUES_FIELD  # in the job's hash: requeues so far, counted atomically

# A sweep's first look, in one script: renew the leases of the live workers that hold a job,
# then read each queue's intermediate list and started registry with the entries of jobs this
# master's workers hold left out, inside Redis. Sent as arguments or read back, those are the
# whole of a busy fleet's lists: at 256 busy workers, packing a key per lease and parsing a
# member per worker every second was most of the sweep's CPU (a third of a millisecond here
# for each). The lists come as JSON (one argument each; RQ's job ids are letters, digits, _
# and -); the caller filters what comes back again, so the script only ever saves work.
# KEYS: each queue's intermediate list and started registry, in turn
# ARGV: 1 lease TTL, 2 the leases to renew (JSON), 3 the job ids held (JSON), 4 entries read per list
LOOK = """
for _, key in ipairs(cjson.decode(ARGV[2])) do redis.call('SET', key, '1', 'EX', ARGV[1]) end
local held = {}
for _, id in ipairs(cjson.decode(ARGV[3])) do held[id] = true end
local last = tonumber(ARGV[4]) - 1
local out = {}
for i = 1, #KEYS, 2 do
  local popped, started = {}, {}
  for _, e in ipairs(redis.call('LRANGE', KEYS[i], 0, last)) do
    if not held[e] then popped[#popped + 1] = e end
  end
  for _, m in ipairs(redis.call('ZRANGE', KEYS[i + 1], 0, last)) do
    if not held[string.match(m, '^(.*):') or m] then started[#started + 1] = m end
  end
  out[#out + 1] = popped
  out[#out + 1] = started
end
return out
"""

# KEYS: 1 the StartedJobRegistry, 2 the intermediate list, 3 the queue, 4 the job's hash,
#       5 the holder's lease (any key when there is none), 6 the FailedJobRegistry,
#       7 the endings hash (herder.common.rq_names.ENDINGS_KEY)
# ARGV: 1 "wip" or "intermediate" (where the job was seen), 2 the wip member, 3 job id,
#       4 max requeues, 5 "1" to re-check the holder's lease, 6 failure TTL, 7 count field,
#       8 "1" to leave a job past the limit to a worker's ending (herder's RQ workers), else
#       fail it here (a --worker-command fleet), 9 the ending's record (JSON), 10 the reaped
#       worker's RQ names, comma-separated ('' for any): a started job whose worker_name is
#       another's was recovered from that worker and taken by another since ('elsewhere')
MOVE = (
    MOVES_LUA
    + f"""
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[5]) == 1 then return {{'held', 0}} end
local status = redis.call('HGET', KEYS[4], 'status') or ''
local removed
if ARGV[1] == 'wip' and ARGV[10] ~= '' then
  local holder = redis.call('HGET', KEYS[4], 'worker_name') or ''
  if holder ~= '' and not string.find(',' .. ARGV[10] .. ',', ',' .. holder .. ',', 1, true) then
    return {{'elsewhere', 0}}
  end
end
if ARGV[1] == 'wip' then
  removed = redis.call('ZREM', KEYS[1], ARGV[2])
  if removed == 1 then redis.call('LREM', KEYS[2], 0, ARGV[3]) end
else
  if status == 'started' then return {{'running', 0}} end
  removed = redis.call('LREM', KEYS[2], 1, ARGV[3])
end
if removed == 0 then return {{'gone', 0}} end
if status ~= 'started' and status ~= 'queued' then return {{'litter', 0}} end
-- Counted in the hash and beside it (a hash deleted or made anew since keeps its count): the
-- worker it came from, back after a cut, starts and ends it no more (rq_names.MOVES_LUA).
local n = math.max(tonumber(redis.call('HGET', KEYS[4], ARGV[7]) or '0') or 0, moves(ARGV[3])) + 1
redis.call('HSET', KEYS[4], ARGV[7], n)
redis.call('SET', '{MOVED_PREFIX}' .. ARGV[3], n, 'EX', {MOVED_TTL})
if n > tonumber(ARGV[4]) then
  if ARGV[8] == '1' then
    redis.call('HSET', KEYS[7], ARGV[3], ARGV[9])
    return {{'over', n}}
  end
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[6], tonumber(t[1]) + tonumber(ARGV[6]), ARGV[3])
  redis.call('HSET', KEYS[4], 'status', 'failed')
  return {{'over', n}}
end
redis.call('HSET', KEYS[4], 'status', 'queued')
redis.call('LPUSH', KEYS[3], ARGV[3])
return {{'requeued', n}}
"""
)


@dataclass
class Task:
    """Work for the recovery thread, retried while Redis is away (each kind below says what)."""

    attempts: int = field(default=0, kw_only=True)
    due: float = field(default=0.0, kw_only=True)  # monotonic: not before
    VERB: ClassVar[str] = ""  # how the logs name it: `requeue <job id>`, `forget <worker>`

    def __str__(self) -> str:
        """The verb and the task's own first field (its subject)."""
        subject = next(f.name for f in fields(self) if not f.kw_only)
        return f"{self.VERB} {getattr(self, subject)}"


@dataclass
class Requeue(Task):
    """Put back the job a reaped worker held (or fail it past max_requeues)."""

    job_id: str
    reason: str
    label: str  # the reason's class, for the metrics: "killed" or "died"
    cause: str  # for a given-up job's ending: a kill's kind, or "died"
    workers: tuple[str, ...] = ()  # the reaped worker's RQ names: only its own start is moved
    VERB = "requeue"


@dataclass
class Forget(Task):
    """A dead worker: its RQ registration and its lease go."""

    worker_name: str
    VERB = "forget"


@dataclass
class CountKill(Task):
    """One kill, added to the cluster-wide kill budget's counter (budget.py)."""

    key: str
    window: float
    VERB = "count_kill"


@dataclass
class AskCull(Task):
    """A token of the cluster-wide cull budget, asked once: no answer means no."""

    ticket: int
    wall: float
    VERB = "cull"


@dataclass
class Counts:
    requeued: int = 0  # jobs put back on their queue
    failed: int = 0  # jobs failed by herder past max_requeues
    swept: int = 0  # of those, found by a sweep rather than by reaping their worker
    given_up: int = 0  # tasks dropped after MAX_ATTEMPTS non-Redis failures
    requeued_by: Counter[str] = field(default_factory=Counter)  # killed, died, swept
    # The same by (why, queue), and failed by queue: the metrics' pool label comes from the queue.
    requeued_by_queue: Counter[tuple[str, str]] = field(default_factory=Counter)
    failed_by_queue: Counter[str] = field(default_factory=Counter)


@dataclass
class _State:
    fleet: Fleet = field(default_factory=Fleet)
    dead: dict[str, float] = field(default_factory=dict)  # name -> when (monotonic)
    poked: bool = False


def is_outage(exc: BaseException) -> bool:
    return isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError)


class Recovery(Protocol):
    """What the master and its parts (guard.py, retirement.py, reload.py, the views) need of the
    recovery thread: RecoveryThread is the real one; unit tests use a fake that records. Every
    method but drain returns at once: the loop never waits on Redis."""

    cfg: Config  # the settings in force (a reload's, once configure has them)
    counts: Counts
    on_give_up: Callable[[str, str, str], None] | None  # (job id, queue, why), on the thread

    def start(self) -> None: ...

    def configure(self, cfg: Config) -> None: ...

    def requeue(
        self, job_id: str, reason: str, label: str, cause: str = "", workers: tuple[str, ...] = ()
    ) -> None: ...

    def endings(self) -> dict[str, int]: ...

    def forget(self, worker_name: str) -> None: ...

    def count_kill(self, key: str, window: float) -> None: ...

    def ask_cull(self, ticket: int, wall: float) -> None: ...

    def answers(self) -> dict[int, bool]: ...

    def tell(self, holding: dict[str, str | None]) -> None: ...

    def drain(self, timeout: float) -> int:
        """As the master stops: wait up to `timeout` for the requeues; return how many are left."""
        ...


class RecoveryThread:
    def __init__(self, connection: Redis, cfg: Config, sweeping: bool = True) -> None:
        self.connection = connection
        self.configure(cfg)
        self.sweeping = sweeping  # herder's RQ workers: sweep; a --worker-command fleet: not
        self.counts = Counts()
        # Told of each job given up (job id, queue, why): the event hooks (master.py).
        self.on_give_up: Callable[[str, str, str], None] | None = None
        self._move = connection.register_script(MOVE)
        self._look = connection.register_script(LOOK)
        self._cull_take = connection.register_script(CULL_TAKE)
        self._answers: dict[int, bool] = {}  # cull tickets answered
        self._cond = threading.Condition()
        self._tasks: list[Task] = []
        self._state = _State()
        self._endings: dict[str, int] = {}  # job id -> its give-up's number
        self._give_ups = 0
        self._first_seen: dict[Entry, float] = {}
        self._entries: set[Entry] = set()  # what the last sweep saw
        self._next_sweep = 0.0
        self._trust_leases_at = time.monotonic() + cfg.lease_seconds  # others renew meanwhile
        self._outage_since: float | None = None
        self._busy = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="recovery", daemon=True)

    # ---- called by the reconcile loop (never blocks on Redis) ---------------------------

    def start(self) -> None:
        self._thread.start()

    def configure(self, cfg: Config) -> None:
        """A reload's settings (max_requeues, sweep_interval, the cull budget, the pools'
        queues and limits), from the next task and sweep on."""
        self.cfg = cfg
        pools = pool_configs(cfg).values()
        self.queues = [q for pc in pools for q in pc.queues]  # every pool's
        self.limits = {q: pc.max_requeues for pc in pools for q in pc.queues}  # each queue's pool's

    def limit(self, queue: str) -> int:
        return self.limits.get(queue, self.cfg.max_requeues)

    def requeue(
        self, job_id: str, reason: str, label: str, cause: str = "", workers: tuple[str, ...] = ()
    ) -> None:
        """Put back the job a reaped worker held; `label` classes the reason ("killed", "died"),
        `cause` names it for a given-up job's ending (a kill's kind, or "died"). `workers`, the
        reaped worker's RQ names: the job is moved only while it is still started under one of
        them (a worker that died while Redis was unreachable may have had the job recovered and
        taken by another host meanwhile: its requeue, done once Redis answers, must not move
        that one's run)."""
        self._submit(Requeue(job_id, reason, label, cause or label, workers))

    def endings(self) -> dict[str, int]:
        """Jobs given up on whose ending no worker has finished yet (as of the last sweep, plus
        those given up since), each with the number of its give-up (a job retried by RQ and
        given up again is a new ending): the master asks idle workers to end them."""
        with self._cond:
            return dict(self._endings)

    def forget(self, worker_name: str) -> None:
        """A worker died: unregister it, drop its lease, and sweep for what it held."""
        with self._cond:
            self._state.dead[worker_name] = time.monotonic()
            self._state.poked = True
        self._submit(Forget(worker_name))

    def count_kill(self, key: str, window: float) -> None:
        """Add one kill to the cluster-wide budget counter (see budget.py)."""
        self._submit(CountKill(key, window))

    def ask_cull(self, ticket: int, wall: float) -> None:
        """Ask for a token of the cluster-wide cull budget; the answer comes in `answers()`."""
        self._submit(AskCull(ticket, wall))

    def answers(self) -> dict[int, bool]:
        """Cull tickets answered since the last call: True if a token was taken."""
        with self._cond:
            out, self._answers = self._answers, {}
        return out

    def tell(self, holding: dict[str, str | None]) -> None:
        """This master's live workers (RQ names) and the job each holds (None: none), for the
        next sweep."""
        held = frozenset(job for job in holding.values() if job)
        with self._cond:
            self._state.fleet = Fleet(frozenset(holding), frozenset(self._state.dead), held, dict(holding))

    def pending(self) -> int:
        """Requeues not yet done (a forget does not count: RQ's TTL cleans those anyway)."""
        with self._cond:
            return sum(isinstance(t, Requeue) for t in self._tasks) + self._busy

    def drain(self, timeout: float) -> int:
        """Wait up to `timeout` for the requeues to be done; return how many are left."""
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._cond:
            self._stop = True
            self._cond.notify()
        return self.pending()

    def _submit(self, task: Task) -> None:
        with self._cond:
            self._tasks.append(task)
            self._cond.notify()

    # ---- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._due(time.monotonic()):
                    self._cond.wait(timeout=self._wait(time.monotonic()))
                if self._stop and not self._tasks:
                    return
                now = time.monotonic()
                due = [t for t in self._tasks if t.due <= now]
                self._busy = sum(isinstance(t, Requeue) for t in due)
                sweep = self.sweeping and (self._state.poked or now >= self._next_sweep)
            for task in due:
                self._attempt(task)
            with self._cond:
                self._busy = 0
            if sweep and not self._stop:
                self._sweep_once()

    def _due(self, now: float) -> bool:
        tasks = any(t.due <= now for t in self._tasks)
        return tasks or (self.sweeping and (self._state.poked or now >= self._next_sweep))

    def _wait(self, now: float) -> float:
        dues = [t.due for t in self._tasks]
        if self.sweeping:
            dues.append(self._next_sweep)
        return max(0.01, min(dues, default=now + 1.0) - now)

    def _attempt(self, task: Task) -> None:
        if isinstance(task, AskCull):  # optional by nature: no retries, and no answer means no
            granted = self._take_cull_token(task.wall)
            with self._cond:
                self._answers[task.ticket] = granted
                self._tasks.remove(task)
            return
        try:
            self._do(task)
        except Exception as exc:
            self._failed(task, exc)
            return
        self._answered()
        with self._cond:
            self._tasks.remove(task)

    def _failed(self, task: Task, exc: Exception) -> None:
        now = time.monotonic()
        if is_outage(exc):
            if self._outage_since is None:
                self._outage_since = now
                log.error(
                    "Redis unreachable while handling %s (%s: %s); retrying until it answers",
                    task,
                    exc.__class__.__name__,
                    exc,
                )
            task.due = now + RETRY_INITIAL * 2
            return
        task.attempts += 1
        if task.attempts >= MAX_ATTEMPTS:
            log.error(
                "giving up on %s after %d attempts: %s: %s", task, task.attempts, exc.__class__.__name__, exc,
            )  # fmt: skip
            self.counts.given_up += 1
            with self._cond:
                self._tasks.remove(task)
            return
        task.due = now + min(RETRY_MAX, RETRY_INITIAL * 2**task.attempts)
        log.warning("%s failed (%s: %s); retrying", task, exc.__class__.__name__, exc)

    def _answered(self) -> None:
        if self._outage_since is not None:
            log.warning(
                "Redis answers again after %.1f s; catching up", time.monotonic() - self._outage_since
            )
            self._outage_since = None
            # Leases may have lapsed while nobody could renew them: give every live worker
            # and master time to renew before judging anyone by theirs, then sweep.
            self._trust_leases_at = time.monotonic() + self.cfg.lease_seconds
            with self._cond:
                self._state.poked = True

    # ---- tasks -------------------------------------------------------------------------

    def _do(self, task: Task) -> None:
        match task:
            case Forget():
                self._forget(task.worker_name)
            case CountKill():
                with self.connection.pipeline() as pipe:
                    pipe.incr(task.key)
                    pipe.expire(task.key, int(task.window * 2) + 1)
                    pipe.execute()
            case Requeue():
                self._requeue_held(task.job_id, task.reason, task.label, task.cause, task.workers)
            case _:
                raise TypeError(f"not a recovery task: {task!r}")

    def _take_cull_token(self, wall: float) -> bool:
        current, previous, elapsed = cull_keys(wall, self.cfg.cull_window)
        try:
            args = [self.cfg.cull_budget, self.cfg.cull_window, elapsed]
            return bool(self._cull_take(keys=[current, previous], args=args))
        except Exception as exc:
            log.error("cannot reach Redis for a cull token (%s): not culling", exc.__class__.__name__)
            return False

    def _forget(self, name: str) -> None:
        """Remove a dead worker's RQ registration (so `rq info` shows no ghost) and its lease."""
        worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=self.connection)
        with self.connection.pipeline() as pipe:
            if worker is not None:
                unregister(worker, pipeline=pipe)
                pipe.delete(worker.key)
            pipe.delete(lease_key(name))
            pipe.execute()

    def _requeue_held(
        self, job_id: str, reason: str, label: str, cause: str, workers: tuple[str, ...] = ()
    ) -> None:
        """The job a reaped worker held: wherever RQ has it (started, or only popped), move it;
        started under another worker (`workers` given), it is that one's now: left alone."""
        origin = self.connection.hget(Job.key_for(job_id), "origin")
        if origin is None:
            log.info("job %s: not requeued (the job is gone)", job_id)
            return
        queue = origin.decode()
        wip = StartedJobRegistry(queue, connection=self.connection).key
        members = [m.decode() for m, _ in self.connection.zscan_iter(wip, match=f"{job_id}:*")]
        moves = [Recover("wip", queue, m, job_id, "", reason, label, cause) for m in members]
        outcomes = [self._move_one(r, workers) for r in moves]
        if "elsewhere" in outcomes:
            holder = (self.connection.hget(Job.key_for(job_id), "worker_name") or b"").decode()
            log.warning(
                "job %s: not requeued: recovered from its dead worker and taken by %s since", job_id, holder
            )
            return
        if not members:  # popped, never started
            popped = Recover("intermediate", queue, job_id, job_id, "", reason, label, cause)
            outcomes.append(self._move_one(popped))
        if not any(o in ("requeued", "over") for o in outcomes):
            status = self.connection.hget(Job.key_for(job_id), "status")
            log.info("job %s: not requeued (it is %s)", job_id, (status or b"gone").decode())

    # ---- the sweep ---------------------------------------------------------------------

    def _sweep_once(self) -> None:
        now = time.monotonic()
        with self._cond:
            self._state.poked = False
            horizon = now - max(60.0, 4 * self.cfg.lease_seconds)  # long after any move of theirs
            self._state.dead = {n: t for n, t in self._state.dead.items() if t > horizon}
            known = self._state.fleet
            fleet = Fleet(known.live, frozenset(self._state.dead), known.held, known.holding)
        self._next_sweep = now + self.cfg.sweep_interval
        try:
            holders = frozenset(name for name, job in fleet.holding.items() if job)
            started, popped, sighted = self._read(self.queues, fleet.held, holders)
        except Exception as exc:
            if is_outage(exc):
                if self._outage_since is None:
                    self._outage_since = time.monotonic()
                    log.error(
                        "Redis unreachable for the recovery sweep (%s); retrying", exc.__class__.__name__
                    )
            else:
                log.exception("recovery sweep failed")
            return
        self._answered()
        moves, self._first_seen = plan(
            started,
            popped,
            fleet,
            self._first_seen,
            now,
            grace=self.cfg.sweep_interval,
            trust_leases=now >= self._trust_leases_at,
            unknown_grace=self.cfg.progress_timeout,
        )
        for key in sighted:  # not read yet: its grace runs from its first sighting
            self._first_seen.setdefault(key, now)
        try:
            outcomes: list[str | Exception] = self._move_many(moves)
        except Exception as exc:  # Redis went away: the next sweep finds them again
            outcomes = [exc] * len(moves)
        for move, outcome in zip(moves, outcomes, strict=True):
            if isinstance(outcome, Exception):
                log.warning(
                    "could not recover job %s (%s: %s)", move.job_id, outcome.__class__.__name__, outcome
                )
            elif outcome in ("requeued", "over"):
                self.counts.swept += 1

    def _first_look(self, queues: list[str], holders: frozenset[str], held: frozenset[str]) -> list[Any]:
        """One round trip: renew the leases of this master's live workers that hold a job
        (alive as long as it says so), then read each queue's intermediate list and started
        registry without the entries of the jobs in `held` (LOOK), and the endings."""
        c = self.connection
        keys = [k for q in queues for k in (Queue(q, connection=c).intermediate_queue_key,
                                            StartedJobRegistry(q, connection=c).key)]  # fmt: skip
        leases = json.dumps([lease_key(name) for name in holders])
        args = [max(1, round(self.cfg.lease_seconds)), leases, json.dumps(list(held)), SCAN_LIMIT]

        def look() -> list[Any]:
            with c.pipeline(transaction=False) as pipe:
                # EVALSHA, not the Script: a Script in a pipeline asks SCRIPT EXISTS first
                pipe.evalsha(self._look.sha, len(keys), *keys, *args)
                pipe.hkeys(ENDINGS_KEY)  # given up, ending not done yet (any host's: a master died?)
                lists, endings = pipe.execute()
            return [*lists, endings]

        return with_script(c, LOOK, look)

    def _read(
        self, queues: list[str], held: frozenset[str], holders: frozenset[str]
    ) -> tuple[list[Started], list[Popped], list[Entry]]:
        """Having renewed the leases of `holders` (_first_look), the queues' started and popped
        entries seen at the last sweep too, each with what its job's hash says, and the entries
        seen for the first time (left unread). Those whose job this master's live workers hold
        are left out (`plan` passes them by): a sweep of a busy fleet costs the jobs no worker
        of ours holds, not one read a worker."""
        c = self.connection
        *replies, endings = self._first_look(queues, holders, held)
        with self._cond:  # what Redis says waits; a give-up keeps its number, one found anew gets one
            known = self._endings
            self._endings = {}
            for job_id in (e.decode() for e in endings):
                if job_id not in known:
                    self._give_ups += 1
                self._endings[job_id] = known.get(job_id, self._give_ups)
        # An entry is read only at its second sighting: a job moves only once it looked orphaned
        # at two sweeps anyway (sweep.plan), and most entries of a busy fleet (jobs a worker just
        # took, its master not told yet) are gone by the next sweep. The grace runs from its first
        # sighting, so an orphan moves when it did when every entry was read at once.
        before, self._entries = self._entries, set()
        sighted: list[Entry] = []
        popped_ids: list[tuple[str, list[str]]] = []
        members: list[tuple[str, list[str]]] = []
        for i, q in enumerate(queues):
            popped_ids.append(
                (q, self._second_sightings("intermediate", q, replies[2 * i], held, before, sighted))
            )
            members.append((q, self._second_sightings("wip", q, replies[2 * i + 1], held, before, sighted)))
        with c.pipeline(transaction=False) as pipe:
            for _, ids in popped_ids:
                for job_id in ids:
                    pipe.hget(Job.key_for(job_id), "status")
            for _, ms in members:
                for m in ms:
                    pipe.hget(Job.key_for(m.rsplit(":", 1)[0]), "worker_name")
            answers = iter(pipe.execute())
        popped = [Popped(q, j, (next(answers) or b"").decode()) for q, ids in popped_ids for j in ids]
        started = [
            Started(q, m, m.rsplit(":", 1)[0], (next(answers) or b"").decode())
            for q, ms in members
            for m in ms
        ]
        return started, popped, sighted

    def _second_sightings(
        self,
        source: str,
        queue: str,
        raw: list[bytes],
        held: frozenset[str],
        before: set[Entry],
        first: list[Entry],
    ) -> list[str]:
        """The entries of one list to read: not a job this master's workers hold (`plan` passes
        those by), and seen at the last sweep too; each entry not held is remembered as seen,
        and one seen for the first time goes to `first`."""
        out = []
        for x in raw:
            entry = x.decode()
            if (entry.rsplit(":", 1)[0] if source == "wip" else entry) in held:
                continue
            key = (source, queue, entry)
            self._entries.add(key)
            if key in before:
                out.append(entry)
            else:
                first.append(key)
        return out

    def _move_one(self, r: Recover, workers: tuple[str, ...] = ()) -> str:
        """One atomic move (MOVE); logs and counts what happened. `workers`: a started job is
        moved only while its worker_name is one of them (or none)."""
        outcome = self._move_many([r], workers)[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _move_many(self, moves: list[Recover], workers: tuple[str, ...] = ()) -> list[str | Exception]:
        """Each move atomic on its own (MOVE), all of them in one round trip: a busy fleet's
        sweep may find a few jobs a worker took a moment ago, and each of those, a round trip of
        its own, cost a starved master more than the sweep's look. Each one's outcome (logged and
        counted), or what it raised."""
        if not moves:
            return []
        calls = [self._move_call(r, workers) for r in moves]
        replies = self._run_moves(calls)
        out: list[str | Exception] = []
        for r, reply in zip(moves, replies, strict=True):
            try:
                out.append(reply if isinstance(reply, Exception) else self._moved(r, *reply))
            except Exception as exc:  # a give-up's failure not written: this one's, not the others'
                out.append(exc)
        return out

    def _move_call(self, r: Recover, workers: tuple[str, ...]) -> tuple[list[str], list[Any]]:
        """MOVE's keys and arguments for one move."""
        c = self.connection
        queue = Queue(r.queue, connection=c)
        wip = StartedJobRegistry(r.queue, connection=c).key
        keys = [wip, queue.intermediate_queue_key, queue.key, Job.key_for(r.job_id)]
        keys += [lease_key(r.holder) if r.holder else wip, FailedJobRegistry(r.queue, connection=c).key]
        keys.append(ENDINGS_KEY)
        check = "1" if r.holder else "0"
        limit = self.limit(r.queue)
        args: list[Any] = [r.source, r.member, r.job_id, limit, check, DEFAULT_FAILURE_TTL, COUNT_FIELD]
        ending = {"why": r.why, "cause": r.cause, "limit": limit}
        args += ["1" if self.sweeping else "0", json.dumps(ending), ",".join(workers)]
        return keys, args

    def _run_moves(self, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """The calls' replies (an error reply as its exception), in one pipeline; those a Redis
        that forgot the script refused are sent again once it is loaded (they did nothing)."""

        def run(todo: list[tuple[list[str], list[Any]]]) -> list[Any]:
            with self.connection.pipeline(transaction=False) as pipe:
                for keys, args in todo:  # EVALSHA, not the Script: that asks SCRIPT EXISTS first
                    pipe.evalsha(self._move.sha, len(keys), *keys, *args)
                return pipe.execute(raise_on_error=False)

        replies = run(calls)
        forgot = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if forgot:
            self.connection.script_load(MOVE)
            for i, reply in zip(forgot, run([calls[i] for i in forgot]), strict=True):
                replies[i] = reply
        return replies

    def _moved(self, r: Recover, said: bytes, moves: bytes | int) -> str:
        """What one move did (MOVE's reply: the outcome and the job's moves), logged and counted."""
        c = self.connection
        limit = self.limit(r.queue)
        outcome, count = said.decode(), int(moves)
        if outcome == "requeued":
            self.counts.requeued += 1
            self.counts.requeued_by[r.label] += 1
            self.counts.requeued_by_queue[r.label, r.queue] += 1
            log.warning(
                "job %s: requeued at the front of its queue (requeue %d of %d: %s)",
                r.job_id,
                count,
                limit,
                r.why,
            )
            self._note(r.job_id, count, r.why)
        elif outcome == "over" and self.sweeping:  # herder's RQ workers: a worker ends it
            self.counts.failed += 1
            self.counts.failed_by_queue[r.queue] += 1
            self._given_up(r)
            with self._cond:
                self._give_ups += 1
                self._endings[r.job_id] = self._give_ups
            log.error(
                "job %s: given up: %s; requeued %d times already (limit %d): a worker ends it as RQ "
                "ends an abandoned job (failure callback, exception handlers, Retry, webhooks)",
                r.job_id,
                r.why,
                count - 1,
                limit,
            )
        elif outcome == "over":
            message = f"{r.why}; requeued {count - 1} times already (limit {limit}), so failed"
            job = Job.fetch(r.job_id, connection=c)
            with c.pipeline() as pipe:
                rq_seam.record_failure(job, message, pipe)
                pipe.execute()
            self.counts.failed += 1  # counted once its failure Result is written
            self.counts.failed_by_queue[r.queue] += 1
            self._given_up(r)
            log.error("job %s: moved to the failed job registry: %s", r.job_id, message)
        elif outcome == "litter":
            log.debug("job %s: removed a leftover entry from the %s list", r.job_id, r.source)
        return outcome

    def _given_up(self, r: Recover) -> None:
        if self.on_give_up is not None:
            self.on_give_up(r.job_id, r.queue, r.why)

    def _note(self, job_id: str, count: int, why: str) -> None:
        """The count and the reason in the job's meta, for a person reading it (best effort)."""
        try:
            job = Job.fetch(job_id, connection=self.connection)
            job.meta[COUNT_FIELD] = count
            job.meta["herder_requeued_because"] = why
            job.save_meta()
        except Exception as exc:  # a job whose payload cannot load: the requeue stands
            log.debug("job %s: meta not updated (%s)", job_id, exc)
