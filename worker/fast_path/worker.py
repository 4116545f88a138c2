"""herder's fast job lifecycle: RQ's own writes for each job, in one round trip instead of about eleven.

RQ's SimpleWorker spends a no-op job's time mostly waiting on Redis: a heartbeat, the state,
the dequeue, the job's hash, an execution transaction, a start transaction, the job's heartbeat,
a WATCH and a read of the dependents, the finish transaction and the state again, each its
own round trip. This mixin sends the same commands, built by RQ's own code, in one script call:

1. **finish**: the finish transaction RQ's handle_job_success builds is recorded, not sent
   (`RecordingPipeline`), together with the state and heartbeat writes after it; from the
   second successful job of a shape on, it is filled in from a template instead
   (finish_template.py), made from RQ's own finish and checked against it. RQ WATCHes
   the job's dependents set around its transaction; the script checks it is empty instead,
   atomically, and when it is not nothing is written and RQ's own path finishes the job
   (dependents are enqueued by RQ's code).
2. **take**: then the script takes the next job exactly as RQ's dequeue does (LMOVE into the
   intermediate list for one queue, LPOP in order for several; a vanished job is skipped)
   and returns its hash.
3. **start**: and writes that job's start, RQ's two transactions (prepare_execution and
   prepare_job_execution), from a template RQ's code recorded for a stand-in job
   (start_template.py). A job the template is not for (another timeout), and the
   first job, start in a script call of their own.

`done` goes to the master only once the finish is in Redis, so a job the master counts done
is done in Redis too. Everything else stays RQ's code path: a failed job, a Retry, a job with
a rate limit, webhooks or repeats, a user's worker, queue class or dequeue strategy, and
every idle moment (the blocking dequeue is RQ's). docs/design.md ("Fast path") has the why;
tests/test_fast_path.py compares the Redis state key by key with RQ's SimpleWorker.

This package, one job a module: `worker.py` (this mixin), `recording.py` (RQ's writes recorded,
not sent), `script.py` (the Lua script and its connection), `wire.py` (the call framed as RESP),
`start_template.py` (the next job's start), `finish_template.py` (a job's finish, filled in),
`restore.py` (a taken job made from its hash), `loglines.py` (RQ's INFO lines, written
directly), `shortcuts.py` (RQ's pure helpers, cheaper).
Every name of RQ's it relies on beyond RQ's documented API is checked at start by
herder.common.rq_seam; an rq without them runs herder's worker on RQ's own path.
"""

from __future__ import annotations

import _signal
import functools
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from redis.client import Pipeline
from redis.exceptions import ResponseError
from rq.executions import Execution
from rq.job import Job, JobStatus, Retry
from rq.logutils import blue, green
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.suspension import WORKERS_SUSPENDED
from rq.timeouts import UnixSignalDeathPenalty
from rq.utils import get_version, now
from rq.worker import SimpleWorker, WorkerStatus

from herder.common import rq_seam
from herder.common.rq_names import call_record_key
from herder.worker.fast_path import finish_template, loglines, restore, shortcuts, start_template
from herder.worker.fast_path.finish_template import FinishTemplate, flat_mapping, stand_in_values
from herder.worker.fast_path.loglines import InfoLines
from herder.worker.fast_path.recording import Discard, NotRecordable, Recorder, RecordingPipeline
from herder.worker.fast_path.restore import FastRestore
from herder.worker.fast_path.script import ScriptConnection
from herder.worker.fast_path.start_template import (
    FrozenClock,
    NotTemplatable,
    StartTemplate,
    timeout_key,
    whole_seconds,
)
from herder.worker.fast_path.wire import Framed, make_encoder, resp_request, text, unpack_hash
from herder.worker.fence import Fence, StartRefused
from herder.worker.rq_worker import HerderMixin, held_log_lines


@dataclass
class PendingFinish:
    """A finished job whose writes wait for the next round trip."""

    job: Job
    queue: Queue
    execution: Execution
    beat: tuple[Any, int]  # the job heartbeat RQ writes as the job ends: (timestamp, ttl)
    started_key: str  # the StartedJobRegistry the job is in (RQ's, handed to its finish)
    guards: list[str]
    finish: list[Any]  # RQ's finish transaction: recorded commands, or a template's (Framed)
    after: RecordingPipeline  # state and heartbeat writes RQ makes after it
    done: tuple[str, bool] | None = None  # the `done` line, sent once the finish is in Redis
    moved: int | str = ""  # the job's moves when it was taken (herder.worker.fence), '' if not known


MAX_TEMPLATES = 16  # start templates a worker keeps (one per job timeout it has seen)


class FastPathMixin(HerderMixin):
    """herder's protocol with the fast lifecycle; on RQ's SimpleWorker only (HerderFastWorker)."""

    _pending: PendingFinish | None = None
    _deferring: Job | None = None  # the job whose success is being recorded
    _job_beat: tuple[Any, int] | None = None
    _prepared: str | None = None  # the job whose start went out with its execution
    # What RQ's start of that job raised after its writes (its data unreadable): raised in its place
    _start_error: tuple[str, Exception] | None = None
    _script: ScriptConnection | None = None
    _calls = 0  # the number of this worker's last script call
    _lost = 0  # tries of the current call whose reply was lost
    _clock: FrozenClock | None = None
    _template: StartTemplate | None = None  # the next start, written by the take (see below)
    _templates: dict[str, StartTemplate] | None = None  # by the job `timeout` field each is for
    _no_template: str | None = None  # why starts keep a round trip of their own
    _started: tuple[str, datetime, str, str] | None = None  # (job, time, execution, error): written
    _own_start: str | None = None  # why starts take RQ's own path (its start could not be recorded)
    _take: tuple[tuple[Queue, ...], list[Any]] | None = None  # the take's arguments, by the queues' order
    _direct_start: bool | None = None  # RQ's start objects built directly (None: not checked yet)
    _finishes: dict[tuple[Any, ...], FinishTemplate | None] | None = None  # by shape; None: RQ's
    _restorer: FastRestore | None = None  # a taken job made from its hash (restore.py)
    _no_restorer: str | None = None  # why RQ's restore makes each job

    # ---- start: one transaction, or none of its own -------------------------------

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's prepare_execution and prepare_job_execution: the same writes, in one script
        call, or already written by the script that took the job (from the start template)."""
        started, self._started = self._started, None
        if started is not None and started[0] == job.id:
            _, t, execution_id, error = started
            if self._direct_start and not self.log.isEnabledFor(logging.DEBUG):  # RQ's debug lines
                execution = self._build_start(job, t, execution_id)  # Redis has it: RQ's objects only
            else:
                execution, _ = self._record_start(job, t, execution_id, keep=False)
            if error:  # as EXEC: the others ran, the error is raised
                raise ResponseError(error)
            self._prepared = job.id
            return execution
        if self._own_start:
            return super().prepare_execution(job)
        self.channel.in_job = False  # the start's call is the loop's: the master's progress bound
        try:
            return self._start_in_one_call(job)
        finally:
            self.channel.in_job = True
            self.channel.progress()

    def _start_in_one_call(self, job: Job) -> Execution:
        fence = self._fence if self._fence is not None and self._fence.job_id == job.id else None
        t, execution_id = now(), uuid.uuid4().hex
        try:
            execution, commands = self._record_start(job, t, execution_id)
        except NotRecordable as exc:  # RQ's start talks to Redis outside its pipelines
            self._own_start = f"RQ's start cannot be recorded ({exc})"
            self._drop_template(self._own_start)
            return super().prepare_execution(job)
        lease = RecordingPipeline(self.connection)
        self.renew_lease(lease)  # herder's lease, when due, rides along
        # One reply; written only while the job is where its take put it (herder.worker.fence).
        fenced = None if fence is None else (job.id, "" if fence.moves is None else fence.moves, fence.claim)
        reply = self._run_script([], [*commands, *lease.take_recorded()], None, [""], fence=fenced)
        code = int(reply[0])
        if code == 7:
            self.executions.pop(execution_id, None)  # RQ's objects for a start Redis never had
            raise StartRefused(job.id)
        if code == 3:
            raise ResponseError(text(reply[1]))
        if fence is not None and len(reply) > 1:  # its moves as it started (none after a lost reply)
            fence.moves, fence.claim = int(reply[1]), ""
        self._prepared = job.id
        if self._start_error is None:  # a start that raised is no model for the next ones
            self._learn_template(job, t, execution_id, commands)
        return execution

    def _record_start(
        self, job: Job, t: datetime, execution_id: str, keep: bool = True
    ) -> tuple[Execution, list[tuple[Any, ...]]]:
        """RQ's own two start transactions for `job` (prepare_execution, then the horse's
        prepare_job_execution, with the intermediate-list clean-up RQ's perform_job asks for),
        run at time t with this execution id against a connection that records their writes
        (or, not `keep`, builds none: Redis has them already). RQ's objects (the execution,
        the job's and the worker's fields) are left as RQ leaves them."""
        if self._clock is None:
            self._clock = FrozenClock()
        if self._start_error is not None:  # an earlier job's, never raised
            self._start_error = None
        real, job_real = self.connection, job.connection
        stand_in = Recorder(real, strict=True) if keep else Discard(real)
        self.connection = job.connection = stand_in  # type: ignore[assignment]
        self.lease_quiet = True  # herder's lease is not RQ's start: it rides apart, when due
        try:
            with self._clock(t, execution_id):
                execution = super().prepare_execution(job)
                try:
                    super().prepare_job_execution(job, remove_from_intermediate_queue=len(self.queues) == 1)
                except NotRecordable:
                    raise
                except Exception as exc:  # after its writes: a job whose data cannot be read (func_name)
                    self._start_error = (job.id, exc)  # raised by prepare_job_execution, as RQ's is
        finally:
            self.connection, job.connection = real, job_real
            self.lease_quiet = False
        execution.connection = job_real  # RQ made it with the job's connection, the stand-in then
        return execution, stand_in.recorded() if keep else []

    def _build_start(self, job: Job, t: datetime, execution_id: str) -> Execution:
        """The objects RQ's two start transactions leave (the execution, the job's and the
        worker's fields), built here: replaying RQ's start for them cost a tenth of a no-op job.
        Used only once `_direct_start_matches` found them RQ's own for a stand-in job."""
        execution = Execution(
            id=execution_id, job_id=job.id, connection=job.connection, worker_name=self.name
        )
        execution.created_at = execution.last_heartbeat = t
        execution._job = job
        self.executions[execution_id] = execution
        rq_seam.restore_worker_state(self, WorkerStatus.BUSY)
        self.channel.progress()  # as herder's heartbeat in RQ's start
        self.last_heartbeat = t
        job.worker_name = self.name
        job.last_heartbeat = job.started_at = t
        job._status = JobStatus.STARTED
        job.func_name  # noqa: B018 - RQ's start names it (its procline): the job's data is read here too
        return execution

    def _direct_start_matches(self, timeout: Any) -> bool:
        """Whether `_build_start` leaves what RQ's own start (replayed) leaves, for two like
        stand-in jobs at one time: every field of the worker, the job and the execution."""
        t, execution_id = start_template.STAND_IN_TIME, start_template.STAND_IN_EXECUTION
        jobs = [
            start_template.stand_in_job(self.job_class, self.connection, self.serializer, timeout)
            for _ in "12"
        ]
        jobs[1].created_at = jobs[0].created_at  # made a moment apart: otherwise alike
        effects = []
        for job, replay in zip(jobs, (True, False), strict=True):
            before = dict(vars(self))
            try:
                if replay:
                    execution = self._record_start(job, t, execution_id, keep=False)[0]
                else:
                    execution = self._build_start(job, t, execution_id)
                effects.append((
                    {k: v for k, v in vars(self).items() if k not in _REPLAY_FIELDS},
                    {k: v for k, v in vars(job).items() if k != "connection"},
                    {k: "<the job>" if v is job else v for k, v in vars(execution).items()},
                    job.connection is self.connection and self.executions.get(execution_id) is execution,
                ))  # fmt: skip
            finally:
                self.executions.pop(execution_id, None)
                for name in set(vars(self)) - set(before):
                    delattr(self, name)
                for name, value in before.items():
                    setattr(self, name, value)
        return effects[0] == effects[1]

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
        encode = self._encode
        stand_in = start_template.stand_in_job(self.job_class, self.connection, self.serializer, job.timeout)
        state, beat = rq_seam.worker_state(self), self.last_heartbeat
        try:
            _, recorded = self._record_start(
                stand_in, start_template.STAND_IN_TIME, start_template.STAND_IN_EXECUTION
            )
            failed, self._start_error = self._start_error, None
            if failed is not None:  # kept for a real job's perform_job; a stand-in's is no model
                raise failed[1]
            template = StartTemplate.from_recording(key, recorded, encode)
        except NotTemplatable as exc:
            self._drop_template(str(exc))
            return
        except Exception as exc:  # RQ's start needs more of a job than a stand-in has
            self._drop_template(f"RQ's start failed for a stand-in job: {exc!r}")
            return
        finally:
            self.executions.pop(start_template.STAND_IN_EXECUTION, None)
            rq_seam.restore_worker_state(self, state)
            self.last_heartbeat = beat
        real = [[encode(a) for a in c] for c in commands]
        if template.fill(job.id, job.origin, execution_id, t, encode) != real:
            self._drop_template("the template did not give RQ's own start for a real job")
            return
        self._template = self._templates[key] = template
        if self._direct_start is None:
            try:
                self._direct_start = self._direct_start_matches(job.timeout)
            except Exception:  # an RQ whose start objects are not the ones built here
                self._direct_start = False
            if not self._direct_start:
                logging.getLogger("herder").info("fast path: RQ's start is replayed for its objects")

    def _drop_template(self, why: str) -> None:
        self._template, self._no_template = None, why
        logging.getLogger("herder").info("fast path: each start keeps its own round trip (%s)", why)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        if self._prepared == job.id:  # recorded with its execution, and written
            self._prepared = None
            error, self._start_error = self._start_error, None
            if error is not None and error[0] == job.id:
                raise error[1]  # where RQ raises it: in perform_job, which fails the job
            return
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    # ---- finish: recorded, sent with the next take --------------------------------

    def _finalize_success(self, job: Job, queue: Queue, execution: Execution, return_value: Any) -> None:
        if not self._can_defer(job, return_value):
            return super()._finalize_success(job, queue, execution, return_value)
        self._deferring = job
        log, self.log = self.log, InfoLines(self.log)  # type: ignore[assignment]  # RQ's "Job OK" line
        try:
            super()._finalize_success(job, queue, execution, return_value)
        finally:
            self.log = log
            self._deferring = None
            self._job_beat = None
            lines = held_log_lines()
            if lines is not None:
                lines.unhold()  # RQ's two lines of the success, held since its finish began

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
        lines = held_log_lines()  # from here to "Job OK" RQ runs none of the user's code
        if lines is not None:
            lines.hold()  # its two log lines go in one write (unheld in _finalize_success)
        shape = self._finish_shape(job, queue, execution)
        template = None if shape is None else (self._finishes or {}).get(shape, False)
        if template:
            t = now()
            try:
                commands = self._template_finish(template, job, execution, t)
            except Exception:  # a return value RQ's serializer cannot dump: RQ's own finish says so
                commands = None
            if commands is not None:
                guards = [job.dependents_key]
                return self._defer_finish(job, queue, started_job_registry, execution, guards, [commands])
        real, recorder = self.connection, Recorder(self.connection)
        self.connection = recorder  # type: ignore[assignment]
        learn = shape is not None and template is False  # this shape's first finish: recorded at one time
        t = now()
        try:
            if learn:
                with self._frozen_clock()(t, execution.id):
                    super().handle_job_success(job, queue, started_job_registry, execution)
            else:
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
        guards, commands = recorded[0].guards, recorded[0].take_recorded()
        if learn:
            assert shape is not None
            self._learn_finish(shape, job, execution, t, guards, commands)
        self._defer_finish(job, queue, started_job_registry, execution, guards, commands)

    def _defer_finish(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: StartedJobRegistry | None,
        execution: Execution,
        guards: list[str],
        commands: list[Any],
    ) -> None:
        assert self._job_beat is not None
        fence = self._fence
        self._pending = PendingFinish(
            job=job,
            queue=queue,
            execution=execution,
            beat=self._job_beat,
            started_key=(  # `is None`: a registry's truth is its length, two Redis calls
                queue.started_job_registry if started_job_registry is None else started_job_registry
            ).key,
            guards=guards,
            finish=commands,
            after=RecordingPipeline(self.connection),
            moved="" if fence is None or fence.job_id != job.id or fence.moves is None else fence.moves,
        )

    # ---- the finish template (finish_template.py) -----------------------------------

    def _frozen_clock(self) -> FrozenClock:
        if self._clock is None:
            self._clock = FrozenClock()
        return self._clock

    def _finish_shape(self, job: Job, queue: Queue, execution: Execution) -> tuple[Any, ...] | None:
        """What RQ's finish of this job depends on beyond the template's markers, or None: a job
        the template is not for (RQ's own finish, recorded). Callbacks, DEBUG lines (RQ's finish
        logs at DEBUG), a job whose origin is not its queue, an execution not this worker's."""
        if (
            job.origin != queue.name
            or job.created_at is None
            or job.started_at is None
            or job.ended_at is None
            or execution.job_id != job.id
            or execution.worker_name != self.name
            or execution.created_at is None
            or job._success_callback_name
            or job._failure_callback_name
            or job._stopped_callback_name
            or self.log.isEnabledFor(logging.DEBUG)
            or job.log.isEnabledFor(logging.DEBUG)
            or _RQ_WORKER_LOG.isEnabledFor(logging.DEBUG)
        ):
            return None
        ttl = job.get_result_ttl(self.default_result_ttl)
        if type(ttl) is not int:
            return None
        shape = (ttl, job._result is None, type(job), type(queue), job.serializer, self.log_job_description)
        try:
            hash(shape)
        except TypeError:
            return None
        return shape

    def _template_finish(
        self, template: FinishTemplate, job: Job, execution: Execution, t: datetime
    ) -> Framed:
        """RQ's finish of `job` from the template, at time t: its commands, and what RQ's finish
        leaves on the objects (the job's status, the worker's executions) and says (its line)."""
        values = stand_in_values(
            job.id, job.origin, execution.id, job._result, job.started_at, job.ended_at,  # type: ignore[arg-type]
            execution.created_at, job.serializer, self._encode,
        )  # fmt: skip
        job._status = JobStatus.FINISHED  # RQ's set_status, before its to_dict
        fields = job.to_dict(include_meta=False, include_result=False)
        commands = template.fill(values, fields, t, self._encode)
        self.executions.pop(execution.id, None)
        time_taken = job.ended_at - job.started_at  # type: ignore[operator]
        if self.log_job_description:  # RQ's line, word for word
            loglines.info(
                self.log,
                "Successfully completed %s job in %ss on worker %s",
                job.description,
                time_taken,
                self.name,
            )
        else:
            loglines.info(
                self.log, "Successfully completed job %s in %ss on worker %s", job.id, time_taken, self.name
            )
        return commands

    def _learn_finish(
        self,
        shape: tuple[Any, ...],
        job: Job,
        execution: Execution,
        t: datetime,
        guards: list[str],
        commands: list[tuple[Any, ...]],
    ) -> None:
        """After the first finish of a shape, recorded by RQ's code at time t: the template for
        the shape, from RQ's code run for a stand-in job, kept only if it gives RQ's own finish
        for a second stand-in (and the same objects) and for this real job, byte for byte."""
        if self._finishes is None:
            self._finishes = {}
        if shape in self._finishes or len(self._finishes) >= MAX_TEMPLATES:
            return
        self._finishes[shape] = None  # until it has proved itself
        log = logging.getLogger("herder")
        try:
            template = self._make_finish_template(shape)
        except Exception as exc:  # NotTemplatable, NotRecordable (the finish reads Redis), or more
            log.info("fast path: RQ's finish runs for each job of this kind (%s)", _why(exc))
            return
        if [job.dependents_key] != guards or self._encoded(
            self._template_finish_quietly(template, job, execution, t)
        ) != self._encoded(commands):
            log.info(
                "fast path: RQ's finish runs for each job of this kind (the template did not give RQ's own)"
            )
            return
        self._finishes[shape] = template

    def _template_finish_quietly(
        self, template: FinishTemplate, job: Job, execution: Execution, t: datetime
    ) -> Framed:
        """The template's commands for `job`, with no effect on it or the worker (a check)."""
        status, popped = job._status, self.executions.get(execution.id)
        log, self.log = self.log, _QUIET
        try:
            return self._template_finish(template, job, execution, t)
        finally:
            self.log, job._status = log, status
            if popped is not None:
                self.executions[execution.id] = popped

    def _encoded(self, commands: list[Any] | Framed) -> list[list[bytes]]:
        """Commands as the bytes they go as: recorded ones encoded, framed ones read back."""
        if isinstance(commands, Framed):
            return commands.parsed()
        return [[self._encode(a) for a in c] for c in commands]

    def _make_finish_template(self, shape: tuple[Any, ...]) -> FinishTemplate:
        """The template from RQ's finish recorded for a stand-in job, then checked on another
        stand-in, of other values: its commands and the objects it leaves must be RQ's."""
        ttl, no_result = shape[0], shape[1]
        encode = self._encode
        result = None if no_result else finish_template.STAND_IN_RESULT
        job, queue, execution, recorder = self._finish_stand_in(
            ttl, finish_template.STAND_IN_JOB, finish_template.STAND_IN_QUEUE,
            finish_template.STAND_IN_EXECUTION, finish_template.STAND_IN_TIME, result,
        )  # fmt: skip
        t = finish_template.STAND_IN_CLOCK
        guards, recorded = self._run_rq_finish(job, queue, execution, recorder, t)
        if guards != [job.dependents_key]:
            raise NotTemplatable(f"RQ's finish watched {guards}")
        values = stand_in_values(
            job.id, job.origin, execution.id, result, job.started_at, job.ended_at,  # type: ignore[arg-type]
            execution.created_at, job.serializer, encode,
        )  # fmt: skip
        mapping = flat_mapping(job.to_dict(include_meta=False, include_result=False))
        template = FinishTemplate.from_recording(shape, recorded, mapping, values, whole_seconds(t), encode)
        # The check: two like stand-ins of other values, one by RQ's finish, one by the template.
        shift, result = finish_template.CHECK_SHIFT, None if no_result else finish_template.CHECK_RESULT
        effects = []
        for by_rq in (True, False):
            job, queue, execution, recorder = self._finish_stand_in(
                ttl, finish_template.CHECK_JOB, finish_template.CHECK_QUEUE, finish_template.CHECK_EXECUTION,
                finish_template.STAND_IN_TIME + shift, result,
            )  # fmt: skip
            if by_rq:
                _, commands = self._run_rq_finish(job, queue, execution, recorder, t + shift)
            else:
                commands = self._run_template_finish(template, job, execution, t + shift)
            effects.append((
                self._encoded(commands),
                {k: v for k, v in vars(job).items() if k != "connection"},
                {k: v for k, v in vars(execution).items() if k not in ("connection", "_job")},
            ))  # fmt: skip
        if effects[0] != effects[1]:
            raise NotTemplatable("the template did not give RQ's own finish for a stand-in job")
        return template

    def _finish_stand_in(
        self, ttl: int, job_id: str, queue_name: str, execution_id: str, started: datetime, result: Any
    ) -> tuple[Job, Queue, Execution, Recorder]:
        """A job that ran here (never saved), its queue and execution, on a strict recorder."""
        recorder = Recorder(self.connection, strict=True)
        job = start_template.stand_in_job(self.job_class, recorder, self.serializer, None)
        job.id, job.origin, job.result_ttl = job_id, queue_name, ttl
        job.started_at = job.last_heartbeat = started
        job.created_at, job.enqueued_at = started - timedelta(seconds=9), started - timedelta(seconds=8)
        job.ended_at = started + (finish_template.STAND_IN_ENDED - finish_template.STAND_IN_TIME)
        job.worker_name, job._status, job._result = self.name, JobStatus.FINISHED, result
        job.log = _QUIET  # type: ignore[assignment]
        queue = self.queue_class(
            queue_name, connection=recorder, job_class=self.job_class, serializer=self.serializer
        )
        execution = Execution(id=execution_id, job_id=job_id, connection=recorder, worker_name=self.name)  # type: ignore[arg-type]
        execution.created_at = execution.last_heartbeat = started - (
            finish_template.STAND_IN_TIME - finish_template.STAND_IN_EXECUTION_START
        )
        execution._job = job
        return job, queue, execution, recorder

    def _run_rq_finish(
        self, job: Job, queue: Queue, execution: Execution, recorder: Recorder, t: datetime
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """RQ's own finish for a stand-in job at time t, recorded; the worker left as it was."""
        before = dict(vars(self))
        self.executions[execution.id] = execution
        real = self.connection
        self.connection, self.log = recorder, _QUIET  # type: ignore[assignment]
        try:
            with self._frozen_clock()(t, execution.id):
                super().handle_job_success(job, queue, queue.started_job_registry, execution)
        finally:
            self.connection = real
            changed = self._restore_worker(before, execution.id)
        if changed:
            raise NotTemplatable(f"RQ's finish left the worker's {changed} changed")
        if len(recorder.pipelines) != 1:
            raise NotTemplatable(f"RQ's finish made {len(recorder.pipelines)} transactions")
        pipeline = recorder.pipelines[0]
        return pipeline.guards, pipeline.take_recorded()

    def _run_template_finish(
        self, template: FinishTemplate, job: Job, execution: Execution, t: datetime
    ) -> Framed:
        before = dict(vars(self))
        self.executions[execution.id] = execution
        self.log = _QUIET  # type: ignore[assignment]
        try:
            commands = self._template_finish(template, job, execution, t)
        finally:
            changed = self._restore_worker(before, execution.id)
        if changed:
            raise NotTemplatable(f"the template left the worker's {changed} changed")
        return commands

    def _restore_worker(self, before: dict[str, Any], execution_id: str) -> list[str]:
        """The worker's fields put back as they were before a stand-in's finish; returned, what
        the finish changed: the stand-in's execution must be gone (RQ's finish drops it), and
        nothing else changed but the fields the run itself swaps."""
        now_vars = vars(self)
        changed = sorted(
            k
            for k in set(now_vars) | set(before)
            if now_vars.get(k, _GONE) is not before.get(k, _GONE) and k not in ("connection", "log", "_clock")
        )
        if self.executions.pop(execution_id, None) is not None:
            changed.append("executions")
        for name in set(now_vars) - set(before):
            delattr(self, name)
        for name, value in before.items():
            setattr(self, name, value)
        return changed

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
        owner = (pending.started_key, pending.execution.composite_key, pending.moved)
        take_args = self._take_args() if take else [""]
        reply = self._run_script(pending.guards, commands, start, take_args, owner)
        code = int(reply[0])
        if code == 0:  # the job has dependents: RQ's own finish (WATCH, dependents, MULTI)
            self._finish_by_rq(pending, after)
        if code == 6:  # recovered from this worker while it could not reach Redis: not ours to end
            self.log.warning(
                "Worker %s: job %s ran here, but its finish was not written: the job was recovered "
                "from this worker while it could not reach Redis (its lease ran out), so it runs or "
                "has run elsewhere, whose outcome stands",
                self.name, pending.job.id,
            )  # fmt: skip
        if pending.done is not None:  # held when a job was taken: its `busy` follows at once
            job_id, ok = pending.done
            self.channel.done(job_id, None if code == 6 else ok, hold=code in (2, 4))  # none of ours
        if code == 3:
            raise ResponseError(text(reply[1]))
        if code in (2, 4):
            job_id = text(reply[2])
            # Its moves, read by the take itself; a start of its own takes it out of the list.
            self._fence = Fence(
                self.job_class.key_for(job_id), job_id, int(reply[6]), self.claim_key(), self.held()
            )
            if code == 4:  # its start is written: prepare_execution makes RQ's objects only
                self._started = (job_id, t, execution_id, text(reply[5]))
            return self._took_from_script(text(reply[1]), job_id, unpack_hash(reply[3], reply[4]))
        return None

    def _run_script(
        self,
        guards: list[str],
        commands: list[tuple[Any, ...]],
        start: tuple[StartTemplate, list[Any]] | None,
        take: list[Any],
        owner: tuple[str, str, int | str] | None = None,
        fence: tuple[str, int | str, str] | None = None,
    ) -> list[Any]:
        """One numbered call of this worker (script.py): sent again until Redis answers it, and
        never run twice. With `owner`, a finish is written only while it is this worker's (RQ
        still has the job started under its execution; or its own code deleted it); with `fence`,
        a start only while the job was not moved since it was taken (herder.worker.fence)."""
        if self._script is None:
            self._script = ScriptConnection(self.connection.connection_pool, self._reply_lost)
            self._calls = time.time_ns() // 1000  # rising, also past an earlier process of this name
        self._calls += 1
        self._lost = 0
        call = [
            call_record_key(self.name),
            self._calls,
            self.job_class.redis_job_namespace_prefix,
            self.lease,
            self.lease_ttl,
        ]
        request = resp_request(call, guards, commands, start, take, self._encode, owner, fence)
        reply = self._script.call(request)
        if self._lost:
            self.log.warning("Worker %s: Redis answered the call after %d tries", self.name, self._lost + 1)
        if int(reply[0]) == 5:  # only if this name's record is from the future (the clock went back)
            raise RuntimeError(f"Redis holds a later call of worker {self.name} than this one")
        return reply

    def _reply_lost(self, exc: Exception, tries: int) -> None:
        """Between tries of a call whose reply was lost: said once, then a growing pause. The
        worker is waiting for Redis, not stuck, so its progress goes on (the master's bound)."""
        if tries == 1:
            self.log.warning(
                "Worker %s: no reply to a call (%s: %s); asking Redis again until it answers",
                self.name, exc.__class__.__name__, exc,
            )  # fmt: skip
        self._lost = tries
        self.channel.progress()
        time.sleep(min(1.0, 0.05 * 2 ** (tries - 1)))

    @functools.cached_property
    def _encode(self) -> Any:
        """redis-py's argument encoding for this worker's connection (made once)."""
        return make_encoder(self.connection.connection_pool.get_encoder())

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
        """How RQ's dequeue would take the next job (Queue.dequeue_any, without blocking): made
        again only when the queues' order changes (RQ keeps the server's version per connection)."""
        ordered = tuple(rq_seam.ordered_queues(self))
        if self._take is not None and self._take[0] == ordered:  # the same queues: an identity check each
            return self._take[1]
        keys = [q.key for q in ordered]
        head = ["", WORKERS_SUSPENDED]
        if len(keys) == 1 and get_version(self.connection) >= (6, 2, 0):
            head[0] = "move"
            args = [*head, keys[0], self.queues[0].intermediate_queue_key]
        else:
            head[0] = "pop"
            args = [*head, len(keys), *keys]
        self._take = (ordered, args)
        return args

    def _took_from_script(self, queue_key: str, job_id: str, data: dict[bytes, bytes]) -> tuple[Job, Queue]:
        queue = next((q for q in self.queues if q.key == queue_key), None) or self.queue_class.from_queue_key(
            queue_key, connection=self.connection, job_class=self.job_class, serializer=self.serializer
        )
        job = self._fast_restore(job_id, data)
        if job is None:  # RQ's own restore
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
            loglines.info(self.log, "Worker %s: %s: %s (%s)", self.name, green(queue.name), what, job.id)
        else:
            loglines.info(self.log, "Worker %s: %s: %s", self.name, green(queue.name), job.id)
        return job, queue

    def _fast_restore(self, job_id: str, data: dict[bytes, bytes]) -> Job | None:
        """The job as RQ's restore makes it (restore.py), or None: RQ's restore is to make it.
        Checked against RQ's restore at this worker's first job (and again if its job class,
        serializer or connection change)."""
        fast = self._restorer
        if fast is not None and (
            fast.job_class is self.job_class
            and fast.connection is self.connection
            and fast.serializer is self.serializer
        ):
            return fast.restore(job_id, data)
        if fast is None and self._no_restorer:
            return None
        self._restorer, why = restore.checked(self.job_class, self.connection, self.serializer, job_id, data)
        if self._restorer is None:
            self._no_restorer = why
            logging.getLogger("herder").info("fast path: RQ's restore makes each job (%s)", why)
            return None
        return self._restorer.restore(job_id, data)

    # ---- every other moment: the finish goes out first ----------------------------

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        if self._pending is not None:
            channel = self.channel
            # At its jobs limit (or told to retire) the last job's finish takes nothing.
            take = not (channel.stop_reason or channel.endings or channel.paused) and channel.limit.reserve()
            result = None
            try:
                result = self.flush(take=take)
                if result is not None:
                    return self._took(result)  # its `busy` takes the held `done` along
            finally:
                if take:
                    channel.limit.settle(result is not None)
                channel.send_held()  # if no `busy` went out (none taken, or it raised)
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
            if timeout is None and not self.rq_beat_due():
                return
            pipeline = self._pending.after
        super().heartbeat(timeout, pipeline)

    def run_maintenance_tasks(self) -> None:
        self.flush()
        super().run_maintenance_tasks()

    def teardown(self) -> None:
        try:
            self.flush()
        finally:
            if self._script is not None:
                self._script.release()
                self._script = None
            super().teardown()


# The replay's own machinery on the worker (FastPathMixin._record_start), not RQ's start.
_REPLAY_FIELDS = frozenset({"_clock", "lease_quiet"})
_RQ_WORKER_LOG = logging.getLogger("rq.worker")  # RQ's cleanup_execution logs here at DEBUG
# A stand-in's finish says nothing: a logger of no hierarchy (no configuration enables it again).
_QUIET = logging.Logger("herder.fast_path.stand_in", logging.CRITICAL + 1)
_QUIET.disabled = True
_GONE = object()


def _why(exc: Exception) -> str:
    if isinstance(exc, NotRecordable):
        return f"it talks to Redis outside its transaction: {exc}"
    return str(exc) if isinstance(exc, NotTemplatable) else repr(exc)


class SignalDeathPenalty(UnixSignalDeathPenalty):
    """RQ's job timeout (UnixSignalDeathPenalty): the same alarm and handler, set and put back
    through the signal module's C functions. The `signal.signal` wrapper RQ calls turns each
    handler to and from an enum, two thirds of the alarm's cost a job; its return value, the
    only thing it changes, RQ does not read."""

    def setup_death_penalty(self) -> None:
        _signal.signal(_signal.SIGALRM, self.handle_death_penalty)
        _signal.alarm(self._timeout)

    def cancel_death_penalty(self) -> None:
        _signal.alarm(0)
        _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)


class HerderFastWorker(FastPathMixin, SimpleWorker):
    """herder's default worker: RQ's SimpleWorker, herder's protocol, the fast lifecycle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        shortcuts.install()  # RQ's serializer check and timestamps, the same answers, cheaper
        super().__init__(*args, **kwargs)
        if self.death_penalty_class is UnixSignalDeathPenalty:  # RQ's default, not a user's
            self.death_penalty_class = SignalDeathPenalty
