"""herder's fast job lifecycle: RQ's own writes for each job, in one round trip instead of about eleven.

RQ's SimpleWorker spends a no-op job's time mostly waiting on Redis: a heartbeat, the state,
the dequeue, the job's hash, an execution transaction, a start transaction, the job's heartbeat,
a WATCH and a read of the dependents, the finish transaction and the state again, each its
own round trip. This mixin sends the same commands, built by RQ's own code, in one script call:

1. **finish**: the finish transaction RQ's handle_job_success builds is recorded, not sent
   (`RecordingPipeline`), together with the state and heartbeat writes after it. RQ WATCHes
   the job's dependents set around its transaction; the script checks it is empty instead,
   atomically, and when it is not nothing is written and RQ's own path finishes the job
   (dependents are enqueued by RQ's code).
2. **take**: then the script takes the next job exactly as RQ's dequeue does (LMOVE into the
   intermediate list for one queue, LPOP in order for several; a vanished job is skipped)
   and returns its hash.
3. **start**: and writes that job's start, RQ's two transactions (prepare_execution and
   prepare_job_execution), from a template RQ's code recorded for a stand-in job
   (herder.worker.start_template). A job the template is not for (another timeout), and the
   first job, start in a script call of their own.

`done` goes to the master only once the finish is in Redis, so a job the master counts done
is done in Redis too. Everything else stays RQ's code path: a failed job, a Retry, a job with
a rate limit, webhooks or repeats, a user's worker, queue class or dequeue strategy, and
every idle moment (the blocking dequeue is RQ's). docs/design.md ("Fast path") has the why;
tests/test_fast_path.py compares the Redis state key by key with RQ's SimpleWorker.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.executions import Execution
from rq.job import Job, Retry
from rq.logutils import blue, green
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.suspension import WORKERS_SUSPENDED
from rq.utils import get_version, now
from rq.worker import SimpleWorker, WorkerStatus

from herder.worker import rq_shortcuts, start_template
from herder.worker.rq_worker import HerderMixin
from herder.worker.start_template import FrozenClock, NotTemplatable, StartTemplate, timeout_key

# The finish RQ built, then the next job and its start. ARGV: the guards (their number, then
# the sets that must be empty), the recorded commands (their number, then each one's argument
# count and its arguments), the start template (herder.worker.start_template: its number of
# commands, 0 for none; then the job `timeout` field it is for, the execution id, the time as
# RQ's ISO string and as a float, the number of scores and the scores, then its commands as
# the recorded ones), then the take: '' for none, or the suspension key, the job key prefix and
# 'move' src dst | 'pop' n queue-keys...
# Returns {0} (a guard set is not empty: nothing written), {1} (written, no job taken),
# {2, queue_key, job_id, field sizes, fields joined} (taken), {3, error} (a recorded command
# failed; as with EXEC, the others ran) or {4, queue_key, job_id, field sizes, fields joined,
# error or ''} (taken and started from the template).
FINISH_AND_TAKE = """
local i = 1
local function arg() local v = ARGV[i]; i = i + 1; return v end
for _ = 1, tonumber(arg()) do
  if redis.call('SCARD', arg()) > 0 then return {0} end
end
local err = nil
for _ = 1, tonumber(arg()) do
  local n = tonumber(ARGV[i])
  local r = redis.pcall(unpack(ARGV, i + 1, i + n))
  i = i + 1 + n
  if type(r) == 'table' and r.err and not err then err = r.err end
end
if err then return {3, err} end
local starts, expected, marks, first = tonumber(arg()), nil, nil, nil
if starts > 0 then
  expected = arg()
  marks = {E = arg(), I = arg(), F = arg()}
  for k = 1, tonumber(arg()) do marks[string.char(96 + k)] = arg() end
  first = i
  for _ = 1, starts do i = i + 1 + tonumber(ARGV[i]) end
end
local function start(h, id)  -- the template filled in for this job, or nil if it is not for it
  local timeout, origin = '', nil
  for k = 1, #h, 2 do
    if h[k] == 'timeout' then timeout = h[k + 1] elseif h[k] == 'origin' then origin = h[k + 1] end
  end
  if not origin or timeout ~= expected then return nil end
  marks.J, marks.Q = id, origin
  local failed, at = '', first
  for _ = 1, starts do
    local n, args = tonumber(ARGV[at]), {}
    for k = 1, n do
      local a = ARGV[at + k]
      if string.find(a, '\\0', 1, true) then a = (string.gsub(a, '%z(.)', marks)) end
      args[k] = a
    end
    local r = redis.pcall(unpack(args))
    if type(r) == 'table' and r.err and failed == '' then failed = r.err end
    at = at + 1 + n
  end
  return failed
end
local mode = arg()
if mode == '' then return {1} end
if redis.call('EXISTS', arg()) == 1 then return {1} end
local prefix = arg()
local function taken(queue, id)  -- the hash as two strings: parsing one reply of fifty is the cost
  local h = redis.call('HGETALL', prefix .. id)
  if #h == 0 then return nil end
  local sizes = {}
  for k = 1, #h do sizes[k] = #h[k] end
  local failed = starts > 0 and start(h, id)
  if failed then return {4, queue, id, table.concat(sizes, ','), table.concat(h), failed} end
  return {2, queue, id, table.concat(sizes, ','), table.concat(h)}
end
if mode == 'move' then
  local src, dst = arg(), arg()
  while true do
    local id = redis.call('LMOVE', src, dst, 'LEFT', 'RIGHT')
    if not id then return {1} end
    local job = taken(src, id)
    if job then return job end
  end
end
local n = tonumber(arg())
while true do  -- as RQ: after a vanished job, pop again from the first queue
  local popped = false
  for q = i, i + n - 1 do
    local id = redis.call('LPOP', ARGV[q])
    if id then
      local job = taken(ARGV[q], id)
      if job then return job end
      popped = true
      break
    end
  end
  if not popped then return {1} end
end
"""
SCRIPT_SHA = hashlib.sha1(FINISH_AND_TAKE.encode()).hexdigest()


class NotRecordable(Exception):
    """RQ's finish asked Redis something the recording cannot answer: RQ's path finishes it."""


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
        self.command_stack = []
        self.watching = False
        self.explicit_transaction = False
        return [None] * n

    def reset(self) -> None:
        self.command_stack = []
        self.watching = False
        self.explicit_transaction = False

    def take_recorded(self) -> list[tuple[Any, ...]]:
        self.execute()
        recorded, self.recorded = self.recorded, []
        return recorded


class _Discard:
    """Takes any pipeline command and keeps nothing: RQ's start run for the objects it leaves
    (its writes are already in Redis), without building the commands."""

    def __getattr__(self, name: str) -> Any:
        return _ignore


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


class _Recorder:
    """Stands in for the worker's connection while RQ builds its finish: its pipelines record."""

    def __init__(self, real: Redis) -> None:
        self._real = real
        self.pipelines: list[RecordingPipeline] = []

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> RecordingPipeline:
        p = RecordingPipeline(self._real)
        self.pipelines.append(p)
        return p

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@dataclass
class PendingFinish:
    """A finished job whose writes wait for the next round trip."""

    job: Job
    queue: Queue
    execution: Execution
    beat: tuple[Any, int]  # the job heartbeat RQ writes as the job ends: (timestamp, ttl)
    guards: list[str]
    finish: list[tuple[Any, ...]]  # RQ's finish transaction
    after: RecordingPipeline  # state and heartbeat writes RQ makes after it
    done: tuple[str, bool] | None = None  # the `done` line, sent once the finish is in Redis


MAX_TEMPLATES = 16  # start templates a worker keeps (one per job timeout it has seen)


class FastPathMixin(HerderMixin):
    """herder's protocol with the fast lifecycle; on RQ's SimpleWorker only (HerderFastWorker)."""

    _pending: PendingFinish | None = None
    _deferring: Job | None = None  # the job whose success is being recorded
    _job_beat: tuple[Any, int] | None = None
    _prepared: str | None = None  # the job whose start went out with its execution
    _script_conn: Connection | None = None
    _clock: FrozenClock | None = None
    _template: StartTemplate | None = None  # the next start, written by the take (see below)
    _templates: dict[str, StartTemplate] | None = None  # by the job `timeout` field each is for
    _no_template: str | None = None  # why starts keep a round trip of their own
    _started: tuple[str, datetime, str, str] | None = None  # (job, time, execution, error): written

    # ---- start: one transaction, or none of its own -------------------------------

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's prepare_execution and prepare_job_execution: the same writes, in one script
        call, or already written by the script that took the job (from the start template)."""
        started, self._started = self._started, None
        if started is not None and started[0] == job.id:
            _, t, execution_id, error = started
            execution, _ = self._record_start(job, t, execution_id, keep=False)  # Redis has it
            if error:  # as EXEC: the others ran, the error is raised
                raise ResponseError(error)
            self._prepared = job.id
            return execution
        t, execution_id = now(), uuid.uuid4().hex
        execution, commands = self._record_start(job, t, execution_id)
        lease = RecordingPipeline(self.connection)
        self.renew_lease(lease)  # herder's lease, when due, rides along
        reply = self._run_script([], [*commands, *lease.take_recorded()], None, [""])  # one reply
        if int(reply[0]) == 3:
            raise ResponseError(_text(reply[1]))
        self._prepared = job.id
        self._learn_template(job, t, execution_id, commands)
        return execution

    def _record_start(
        self, job: Job, t: datetime, execution_id: str, keep: bool = True
    ) -> tuple[Execution, list[tuple[Any, ...]]]:
        """What RQ's two start transactions write for `job`, recorded (unless not `keep`), at
        time t with this execution id; RQ's objects (the execution, the job's and the worker's
        fields) as RQ leaves them."""
        if self._clock is None:
            self._clock = FrozenClock()
        pipeline: Any = RecordingPipeline(self.connection) if keep else _Discard()
        with self._clock(t, execution_id):
            ttl = self.get_heartbeat_ttl(job)
            execution = Execution.create(job, ttl, pipeline=pipeline, worker_name=self.name)
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipeline)
            # From here on RQ's prepare_job_execution (the horse's half, in this process).
            super(HerderMixin, self).heartbeat(ttl, pipeline=pipeline)  # RQ's; herder's lease apart
            job.heartbeat(t, ttl, pipeline=pipeline)
            job.prepare_for_execution(self.name, pipeline=pipeline)
        pipeline.persist(job.key)
        if len(self.queues) == 1:  # as RQ: only one queue's dequeue moves into the intermediate list
            pipeline.lrem(self.queues[0].intermediate_queue_key, 1, job.id)
        return execution, pipeline.take_recorded() if keep else []

    def _learn_template(
        self, job: Job, t: datetime, execution_id: str, commands: list[tuple[Any, ...]]
    ) -> None:
        """After a start of its own: the template for jobs with this one's timeout (the next
        job likely has the same), from RQ's code run for a stand-in, kept only if it gives this
        real start byte for byte. Each timeout's template is made once."""
        key = timeout_key(job.timeout)
        if self._no_template:
            return
        if self._templates is None:
            self._templates = {}
        if key in self._templates:
            self._template = self._templates[key]
            return
        if len(self._templates) >= MAX_TEMPLATES:
            return  # a worker whose jobs have many timeouts: the rest keep two round trips
        if not start_template.rq_version_ok():
            self._drop_template(f"RQ {start_template.rq.__version__} is not one whose start herder has read")
            return
        encode = self._encode
        stand_in = self.job_class(
            start_template.STAND_IN_JOB, connection=self.connection, serializer=self.serializer
        )
        stand_in.origin, stand_in.timeout = start_template.STAND_IN_QUEUE, job.timeout
        state, beat = self._state, self.last_heartbeat
        try:
            _, recorded = self._record_start(
                stand_in, start_template.STAND_IN_TIME, start_template.STAND_IN_EXECUTION
            )
            template = StartTemplate.from_recording(key, recorded, encode)
        except NotTemplatable as exc:
            self._drop_template(str(exc))
            return
        except Exception as exc:  # RQ's start needs more of a job than a stand-in has
            self._drop_template(f"RQ's start failed for a stand-in job: {exc!r}")
            return
        finally:
            self.executions.pop(start_template.STAND_IN_EXECUTION, None)
            self._state, self.last_heartbeat = state, beat
        real = [[encode(a) for a in c] for c in commands]
        if template.fill(job.id, job.origin, execution_id, t, encode) != real:
            self._drop_template("the template did not give RQ's own start for a real job")
            return
        self._template = self._templates[key] = template

    def _drop_template(self, why: str) -> None:
        self._template, self._no_template = None, why
        logging.getLogger("herder").info("fast path: each start keeps its own round trip (%s)", why)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        if self._prepared == job.id:
            self._prepared = None
            self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")
            return
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    # ---- finish: recorded, sent with the next take --------------------------------

    def _finalize_success(self, job: Job, queue: Queue, execution: Execution, return_value: Any) -> None:
        if not self._can_defer(job, return_value):
            return super()._finalize_success(job, queue, execution, return_value)
        self._deferring = job
        try:
            super()._finalize_success(job, queue, execution, return_value)
        finally:
            self._deferring = None
            self._job_beat = None

    @staticmethod
    def _can_defer(job: Job, return_value: Any) -> bool:
        """The finishes whose every write is one transaction RQ builds and nothing after it."""
        return not (isinstance(return_value, Retry) or job.has_rate_limit or job.webhooks or job.repeats_left)

    def _finalize_failure(self, job: Job, queue: Queue, execution: Execution, exc_info: Any) -> None:
        self._job_beat = None  # a success callback raised: RQ's failure writes its own heartbeat
        super()._finalize_failure(job, queue, execution, exc_info)

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        if self._deferring is not job:
            return super().handle_execution_ended(job, queue, heartbeat_ttl)
        job.ended_at = now()
        self._job_beat = (now(), heartbeat_ttl)  # written with the finish

    def handle_job_success(
        self, job: Job, queue: Queue, started_job_registry: StartedJobRegistry, execution: Execution
    ) -> None:
        if self._deferring is not job or self._job_beat is None:
            return super().handle_job_success(job, queue, started_job_registry, execution)
        real, recorder = self.connection, _Recorder(self.connection)
        self.connection = recorder  # type: ignore[assignment]
        try:
            super().handle_job_success(job, queue, started_job_registry, execution)
        except NotRecordable:
            recorded = None
        else:
            recorded = recorder.pipelines
        finally:
            self.connection = real
        if recorded is None or len(recorded) != 1:  # not the one transaction it is built for
            self._write_job_beat(job, self._job_beat)
            return super().handle_job_success(job, queue, started_job_registry, execution)
        self._pending = PendingFinish(
            job=job,
            queue=queue,
            execution=execution,
            beat=self._job_beat,
            guards=recorded[0].guards,
            finish=recorded[0].take_recorded(),
            after=RecordingPipeline(real),
        )

    def _write_job_beat(self, job: Job, beat: tuple[Any, int], pipeline: Pipeline | None = None) -> None:
        job.heartbeat(beat[0], beat[1], pipeline=pipeline)

    # While a finish waits, the writes RQ makes after it go with it, in order.

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and self._pending is not None:
            pipeline = self._pending.after
        super().set_state(state, pipeline)

    def finished(self, job_id: str, ok: bool) -> bool:
        """The protocol's `done`, held back while the job's finish is not in Redis yet."""
        if self._pending is not None and self._pending.job.id == job_id:
            self._pending.done = (job_id, ok)
            return True
        return False

    def flush(self, take: bool = False) -> tuple[Job, Queue] | None:
        """Send the waiting finish (and take the next job if `take`, and write its start when
        the template fits it): one round trip."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        beat = RecordingPipeline(self.connection)
        self._write_job_beat(pending.job, pending.beat, beat)
        before, after = beat.take_recorded(), pending.after.take_recorded()
        commands = [*before, *pending.finish, *after]
        start = None
        if take and self._template is not None:
            t, execution_id = now(), uuid.uuid4().hex
            start = (self._template, self._template.script_values(t, execution_id, self._encode))
        reply = self._run_script(pending.guards, commands, start, self._take_args() if take else [""])
        code = int(reply[0])
        if code == 0:  # the job has dependents: RQ's own finish (WATCH, dependents, MULTI)
            self._finish_by_rq(pending, after)
        if pending.done is not None:
            self.channel.done(*pending.done)
        if code == 3:
            raise ResponseError(_text(reply[1]))
        if code in (2, 4):
            job_id = _text(reply[2])
            if code == 4:  # its start is written: prepare_execution makes RQ's objects only
                self._started = (job_id, t, execution_id, _text(reply[5]))
            return self._took_from_script(_text(reply[1]), job_id, unpack_hash(reply[3], reply[4]))
        return None

    def _run_script(
        self,
        guards: list[str],
        commands: list[tuple[Any, ...]],
        start: tuple[StartTemplate, list[Any]] | None,
        take: list[Any],
    ) -> list[Any]:
        return self._evalsha(resp_request(guards, commands, start, take, self._encode))

    @functools.cached_property
    def _encode(self) -> Any:
        """redis-py's argument encoding for this worker's connection (made once)."""
        return _encoder(self.connection.connection_pool.get_encoder())

    def _evalsha(self, request: bytes) -> Any:
        """The script on a connection of its own, without redis-py's per-call machinery (pool,
        retries, events: five times the cost of the call itself). A lost connection is not
        retried: a script sent twice would write twice. The error goes up, as RQ's own would."""
        conn = self._script_conn
        if conn is None:
            conn = self._script_conn = self.connection.connection_pool.get_connection()
        try:
            try:
                conn.send_packed_command([request])
                return conn.read_response()
            except NoScriptError:  # a restarted or flushed Redis: load it, then the same call
                conn.send_command("SCRIPT", "LOAD", FINISH_AND_TAKE)
                conn.read_response()
                conn.send_packed_command([request])
                return conn.read_response()
        except (RedisConnectionError, RedisTimeoutError):
            conn.disconnect()  # the next call connects again
            raise

    def _finish_by_rq(self, pending: PendingFinish, after: list[tuple[Any, ...]]) -> None:
        self._write_job_beat(pending.job, pending.beat)
        job, queue = pending.job, pending.queue
        super().handle_job_success(job, queue, queue.started_job_registry, pending.execution)
        if after:
            with self.connection.pipeline() as pipeline:
                for command in after:
                    pipeline.execute_command(*command)
                pipeline.execute()

    def _take_args(self) -> list[Any]:
        """How RQ's dequeue would take the next job (Queue.dequeue_any, without blocking)."""
        keys = [q.key for q in self._ordered_queues]
        head = ["", WORKERS_SUSPENDED, self.job_class.redis_job_namespace_prefix]
        if len(keys) == 1 and get_version(self.connection) >= (6, 2, 0):
            head[0] = "move"
            return [*head, keys[0], self.queues[0].intermediate_queue_key]
        head[0] = "pop"
        return [*head, len(keys), *keys]

    def _took_from_script(self, queue_key: str, job_id: str, data: dict[bytes, bytes]) -> tuple[Job, Queue]:
        queue = next((q for q in self.queues if q.key == queue_key), None) or self.queue_class.from_queue_key(
            queue_key, connection=self.connection, job_class=self.job_class, serializer=self.serializer
        )
        job = self.job_class(job_id, connection=self.connection, serializer=self.serializer)
        try:
            job.restore(data)
        except Exception as e:  # as RQ's dequeue: the job and queue ride on the error
            e.job_id = job_id  # type: ignore[attr-defined]
            e.queue = queue  # type: ignore[attr-defined]
            raise
        job.redis_server_version = self.get_redis_server_version()
        self.reorder_queues(reference_queue=queue)
        if self.log_job_description:  # RQ's dequeue line, word for word
            what = blue(job.description)
            self.log.info("Worker %s: %s: %s (%s)", self.name, green(queue.name), what, job.id)
        else:
            self.log.info("Worker %s: %s: %s", self.name, green(queue.name), job.id)
        return job, queue

    # ---- every other moment: the finish goes out first ----------------------------

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        if self._pending is not None:
            channel = self.channel
            result = self.flush(take=not (channel.stop_reason or channel.endings or channel.paused))
            if result is not None:
                return self._took(result)
            self.check_for_suspension(burst=timeout is None)  # the script took none: maybe suspended
        return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)

    def check_for_suspension(self, burst: bool) -> None:
        if self._pending is not None:
            if not self.channel.paused:
                return  # the take checks RQ's suspension in the same round trip
            self.flush()
        super().check_for_suspension(burst)

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:  # type: ignore[override]
        if pipeline is None and self._pending is not None:  # rides with the finish; `idle` after `done`
            if timeout is None:
                at = time.monotonic()
                if at - self._rq_beat_at < self.channel.heartbeat_interval / 2:
                    return
                self._rq_beat_at = at
            pipeline = self._pending.after
        super().heartbeat(timeout, pipeline)

    def run_maintenance_tasks(self) -> None:
        self.flush()
        super().run_maintenance_tasks()

    def teardown(self) -> None:
        try:
            self.flush()
        finally:
            if self._script_conn is not None:
                self.connection.connection_pool.release(self._script_conn)
                self._script_conn = None
            super().teardown()


class HerderFastWorker(FastPathMixin, SimpleWorker):
    """herder's default worker: RQ's SimpleWorker, herder's protocol, the fast lifecycle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        rq_shortcuts.install()  # RQ's serializer check and timestamps, the same answers, cheaper
        super().__init__(*args, **kwargs)


def _encoder(encoder: Any) -> Any:
    """redis-py's encoding of an argument, with its common cases inlined (the same bytes)."""
    if (encoder.encoding, encoder.encoding_errors) != ("utf-8", "strict"):
        return encoder.encode

    def encode(a: Any) -> bytes:
        kind = type(a)
        if kind is bytes:
            return a
        if kind is str:
            return a.encode()
        return b"%d" % a if kind is int else encoder.encode(a)

    return encode


def resp_request(
    guards: list[str],
    commands: list[tuple[Any, ...]],
    start: tuple[StartTemplate, list[Any]] | None,
    take: list[Any],
    encode: Any,
) -> bytes:
    """The EVALSHA call as the bytes Redis reads (RESP), framed here in one pass: redis-py's
    per-argument packing was a third of the worker's CPU per job. Each command goes as its own
    arguments, so the script splits nothing (splitting one joined argument in Lua cost Redis
    about 16 us a call); each argument's bytes are what redis-py's encoder makes of it. A start
    template's commands are framed once, when it is made."""
    args: list[Any] = ["EVALSHA", SCRIPT_SHA, 0, len(guards), *guards, len(commands)]
    for command in commands:
        args.append(len(command))
        args.extend(command)
    framed, framed_size = b"", 0
    if start is None:
        args.append(0)
    else:
        template, values = start
        args.extend(values)
        framed, framed_size = template.framed, template.size
    head = [encode(a) for a in args]
    tail = [encode(a) for a in take]
    return b"*%d\r\n%b%b%b" % (
        len(head) + framed_size + len(tail),
        b"".join([b"$%d\r\n%b\r\n" % (len(v), v) for v in head]),
        framed,
        b"".join([b"$%d\r\n%b\r\n" % (len(v), v) for v in tail]),
    )


def unpack_hash(sizes: bytes, joined: bytes) -> dict[bytes, bytes]:
    """A hash the script sent as its fields' sizes and the fields joined (HGETALL's order)."""
    fields, at = [], 0
    for size in map(int, sizes.split(b",")):
        fields.append(joined[at : at + size])
        at += size
    return dict(zip(fields[::2], fields[1::2], strict=True))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
