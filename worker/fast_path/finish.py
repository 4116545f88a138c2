"""A successful job's finish on the fast path: RQ's finish recorded (or filled in from a
template), held, and sent with the next take (worker.py: FastPath.flush).

`Finish` holds, for the job at hand, the finish being recorded (`deferring`, and the job's
last heartbeat RQ writes as it ends) and the one waiting for the next round trip (`pending`,
with its `done` line); and what the worker learnt about RQ's finish, one `Learned`
(learned.py) per shape of job (`templates`): a shape not seen yet is learnt at its first
finish, RQ's own recorded; READY, its jobs' finishes are filled in from the template
(finish_template.py); REFUSED, RQ's own finish is recorded for each of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from redis.client import Pipeline
from rq.executions import Execution
from rq.job import Job, JobStatus, Retry
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.utils import now

from herder.worker.fast_path import finish_template, loglines, start_template
from herder.worker.fast_path.call import Calls
from herder.worker.fast_path.finish_template import FinishTemplate, flat_mapping, stand_in_values
from herder.worker.fast_path.learned import Learned
from herder.worker.fast_path.loglines import InfoLines
from herder.worker.fast_path.recording import NotRecordable, Recorder, RecordingPipeline
from herder.worker.fast_path.start import MAX_TEMPLATES
from herder.worker.fast_path.start_template import NotTemplatable, whole_seconds
from herder.worker.fast_path.wire import Framed
from herder.worker.rq_worker import held_log_lines

if TYPE_CHECKING:
    from collections.abc import Callable


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


Shape = tuple[Any, ...]  # what RQ's finish of a job depends on beyond the template's markers


class Finish:
    """RQ's finish of a successful job for one worker, on the fast path."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.worker = calls.worker
        self.templates: dict[Shape, Learned[FinishTemplate]] = {}  # a shape not here: not seen yet
        self.deferring: Job | None = None  # the job whose success is being recorded
        self.job_beat: tuple[Any, int] | None = None  # its heartbeat as it ended, written with the finish
        self.pending: PendingFinish | None = None  # recorded, sent with the next round trip

    # ---- _finalize_success, handle_execution_ended, handle_job_success ---------------------

    @staticmethod
    def can_defer(job: Job, return_value: Any) -> bool:
        """The finishes whose every write is one transaction RQ builds and nothing after it."""
        return not (isinstance(return_value, Retry) or job.has_rate_limit or job.webhooks or job.repeats_left)

    def finalize_success(
        self,
        job: Job,
        queue: Queue,
        execution: Execution,
        return_value: Any,
        rq_finalize: Callable[..., None],
    ) -> None:
        """RQ's _finalize_success (`rq_finalize`) with this job's finish recorded, not sent."""
        w = self.worker
        self.deferring = job
        log, w.log = w.log, InfoLines(w.log)  # type: ignore[assignment]  # RQ's "Job OK" line
        try:
            rq_finalize(job, queue, execution, return_value)
        finally:
            w.log = log
            self.deferring = None
            self.job_beat = None
            lines = held_log_lines()
            if lines is not None:
                lines.unhold()  # RQ's two lines of the success, held since its finish began

    def ended(self, job: Job, heartbeat_ttl: int) -> bool:
        """RQ's handle_execution_ended for a job whose finish is recorded: its last heartbeat
        goes with the finish. False: not that job, RQ's own."""
        if self.deferring is not job:
            return False
        job.ended_at = now()
        self.job_beat = (now(), heartbeat_ttl)  # written with the finish
        return True

    def handle_job_success(
        self, job: Job, queue: Queue, started_job_registry: StartedJobRegistry, execution: Execution
    ) -> bool:
        """RQ's finish of the job, recorded (or filled in) and held for the next round trip;
        False when RQ's own finish is to write it now (handle_job_success, herder's retries)."""
        w = self.worker
        if self.deferring is not job or self.job_beat is None:
            return False
        lines = held_log_lines()  # from here to "Job OK" RQ runs none of the user's code
        if lines is not None:
            lines.hold()  # its two log lines go in one write (unheld in finalize_success)
        shape = self.shape(job, queue, execution)
        learned = None if shape is None else self.templates.get(shape)
        if learned is not None and learned.ready:
            t = now()
            try:
                commands = self.template_finish(learned.value, job, execution, t)
            except Exception:  # a return value RQ's serializer cannot dump: RQ's own finish says so
                commands = None
            if commands is not None:
                self._defer(job, queue, started_job_registry, execution, [job.dependents_key], [commands])
                return True
        real, recorder = w.connection, Recorder(w.connection)
        w.connection = recorder  # type: ignore[assignment]
        learn = shape is not None and learned is None  # this shape's first finish: recorded at one time
        t = now()
        try:
            if learn:
                with self.calls.clock(t, execution.id):
                    w.rq_handle_job_success(job, queue, started_job_registry, execution)
            else:
                w.rq_handle_job_success(job, queue, started_job_registry, execution)
        except NotRecordable:
            recorded = None
        else:
            recorded = recorder.pipelines
        finally:
            w.connection = real
        if recorded is None or len(recorded) != 1:  # not the one transaction it is built for
            self.write_job_beat(job, self.job_beat)
            return False
        guards, commands = recorded[0].guards, recorded[0].take_recorded()
        if learn:
            assert shape is not None
            self._learn(shape, job, execution, t, guards, commands)
        self._defer(job, queue, started_job_registry, execution, guards, commands)
        return True

    def _defer(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: StartedJobRegistry | None,
        execution: Execution,
        guards: list[str],
        commands: list[Any],
    ) -> None:
        assert self.job_beat is not None
        fence = self.worker._fence
        self.pending = PendingFinish(
            job=job,
            queue=queue,
            execution=execution,
            beat=self.job_beat,
            started_key=(  # `is None`: a registry's truth is its length, two Redis calls
                queue.started_job_registry if started_job_registry is None else started_job_registry
            ).key,
            guards=guards,
            finish=commands,
            after=RecordingPipeline(self.worker.connection),
            moved="" if fence is None or fence.job_id != job.id or fence.moves is None else fence.moves,
        )

    def hold_done(self, job_id: str, ok: bool) -> bool:
        """The protocol's `done`, held back while the job's finish is not in Redis yet."""
        if self.pending is not None and self.pending.job.id == job_id:
            self.pending.done = (job_id, ok)
            return True
        return False

    def write_job_beat(self, job: Job, beat: tuple[Any, int], pipeline: Pipeline | None = None) -> None:
        job.heartbeat(beat[0], beat[1], pipeline=pipeline)

    def by_rq(self, pending: PendingFinish, after: list[tuple[Any, ...]]) -> None:
        """A held finish the script did not write (the job has dependents): RQ's own, now."""
        w = self.worker
        self.write_job_beat(pending.job, pending.beat)
        job, queue = pending.job, pending.queue
        w.rq_handle_job_success(job, queue, queue.started_job_registry, pending.execution)
        if after:
            with w.connection.pipeline() as pipeline:
                for command in after:
                    pipeline.execute_command(*command)
                pipeline.execute()

    # ---- the finish template (finish_template.py) -----------------------------------------

    def shape(self, job: Job, queue: Queue, execution: Execution) -> Shape | None:
        """What RQ's finish of this job depends on beyond the template's markers, or None: a job
        the template is not for (RQ's own finish, recorded). Callbacks, DEBUG lines (RQ's finish
        logs at DEBUG), a job whose origin is not its queue, an execution not this worker's."""
        w = self.worker
        if (
            job.origin != queue.name
            or job.created_at is None
            or job.started_at is None
            or job.ended_at is None
            or execution.job_id != job.id
            or execution.worker_name != w.name
            or execution.created_at is None
            or job._success_callback_name
            or job._failure_callback_name
            or job._stopped_callback_name
            or w.log.isEnabledFor(logging.DEBUG)
            or job.log.isEnabledFor(logging.DEBUG)
            or _RQ_WORKER_LOG.isEnabledFor(logging.DEBUG)
        ):
            return None
        ttl = job.get_result_ttl(w.default_result_ttl)
        if type(ttl) is not int:
            return None
        shape = (ttl, job._result is None, type(job), type(queue), job.serializer, w.log_job_description)
        try:
            hash(shape)
        except TypeError:
            return None
        return shape

    def template_finish(
        self, template: FinishTemplate, job: Job, execution: Execution, t: datetime
    ) -> Framed:
        """RQ's finish of `job` from the template, at time t: its commands, and what RQ's finish
        leaves on the objects (the job's status, the worker's executions) and says (its line)."""
        w = self.worker
        values = stand_in_values(
            job.id, job.origin, execution.id, job._result, job.started_at, job.ended_at,  # type: ignore[arg-type]
            execution.created_at, job.serializer, self.calls.encode,
        )  # fmt: skip
        job._status = JobStatus.FINISHED  # RQ's set_status, before its to_dict
        fields = job.to_dict(include_meta=False, include_result=False)
        commands = template.fill(values, fields, t, self.calls.encode)
        w.executions.pop(execution.id, None)
        time_taken = job.ended_at - job.started_at  # type: ignore[operator]
        if w.log_job_description:  # RQ's line, word for word
            loglines.info(
                w.log,
                "Successfully completed %s job in %ss on worker %s",
                job.description,
                time_taken,
                w.name,
            )
        else:
            loglines.info(
                w.log, "Successfully completed job %s in %ss on worker %s", job.id, time_taken, w.name
            )
        return commands

    def _learn(
        self,
        shape: Shape,
        job: Job,
        execution: Execution,
        t: datetime,
        guards: list[str],
        commands: list[tuple[Any, ...]],
    ) -> None:
        """After the first finish of a shape, recorded by RQ's code at time t: the template for
        the shape, from RQ's code run for a stand-in job, kept only if it gives RQ's own finish
        for a second stand-in (and the same objects) and for this real job, byte for byte."""
        if shape in self.templates or len(self.templates) >= MAX_TEMPLATES:
            return
        learned = self.templates[shape] = Learned()  # until it has proved itself: RQ's finish
        try:
            template = self.make_template(shape)
        except Exception as exc:  # NotTemplatable, NotRecordable (the finish reads Redis), or more
            learned.refuse(_why(exc))
        else:
            if [job.dependents_key] == guards and self.encoded(
                self.template_finish_quietly(template, job, execution, t)
            ) == self.encoded(commands):
                learned.become_ready(template)
                return
            learned.refuse("the template did not give RQ's own")
        _LOG.info("fast path: RQ's finish runs for each job of this kind (%s)", learned.reason)

    def template_finish_quietly(
        self, template: FinishTemplate, job: Job, execution: Execution, t: datetime
    ) -> Framed:
        """The template's commands for `job`, with no effect on it or the worker (a check)."""
        w = self.worker
        status, popped = job._status, w.executions.get(execution.id)
        log, w.log = w.log, _QUIET
        try:
            return self.template_finish(template, job, execution, t)
        finally:
            w.log, job._status = log, status
            if popped is not None:
                w.executions[execution.id] = popped

    def encoded(self, commands: list[Any] | Framed) -> list[list[bytes]]:
        """Commands as the bytes they go as: recorded ones encoded, framed ones read back."""
        if isinstance(commands, Framed):
            return commands.parsed()
        return [[self.calls.encode(a) for a in c] for c in commands]

    def make_template(self, shape: Shape) -> FinishTemplate:
        """The template from RQ's finish recorded for a stand-in job, then checked on another
        stand-in, of other values: its commands and the objects it leaves must be RQ's."""
        ttl, no_result = shape[0], shape[1]
        encode = self.calls.encode
        result = None if no_result else finish_template.STAND_IN_RESULT
        job, queue, execution, recorder = self._stand_in(
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
            job, queue, execution, recorder = self._stand_in(
                ttl, finish_template.CHECK_JOB, finish_template.CHECK_QUEUE, finish_template.CHECK_EXECUTION,
                finish_template.STAND_IN_TIME + shift, result,
            )  # fmt: skip
            if by_rq:
                _, commands = self._run_rq_finish(job, queue, execution, recorder, t + shift)
            else:
                commands = self._run_template_finish(template, job, execution, t + shift)
            effects.append((
                self.encoded(commands),
                {k: v for k, v in vars(job).items() if k != "connection"},
                {k: v for k, v in vars(execution).items() if k not in ("connection", "_job")},
            ))  # fmt: skip
        if effects[0] != effects[1]:
            raise NotTemplatable("the template did not give RQ's own finish for a stand-in job")
        return template

    def _stand_in(
        self, ttl: int, job_id: str, queue_name: str, execution_id: str, started: datetime, result: Any
    ) -> tuple[Job, Queue, Execution, Recorder]:
        """A job that ran here (never saved), its queue and execution, on a strict recorder."""
        w = self.worker
        recorder = Recorder(w.connection, strict=True)
        job = start_template.stand_in_job(w.job_class, recorder, w.serializer, None)
        job.id, job.origin, job.result_ttl = job_id, queue_name, ttl
        job.started_at = job.last_heartbeat = started
        job.created_at, job.enqueued_at = started - timedelta(seconds=9), started - timedelta(seconds=8)
        job.ended_at = started + (finish_template.STAND_IN_ENDED - finish_template.STAND_IN_TIME)
        job.worker_name, job._status, job._result = w.name, JobStatus.FINISHED, result
        job.log = _QUIET  # type: ignore[assignment]
        queue = w.queue_class(queue_name, connection=recorder, job_class=w.job_class, serializer=w.serializer)
        execution = Execution(id=execution_id, job_id=job_id, connection=recorder, worker_name=w.name)  # type: ignore[arg-type]
        execution.created_at = execution.last_heartbeat = started - (
            finish_template.STAND_IN_TIME - finish_template.STAND_IN_EXECUTION_START
        )
        execution._job = job
        return job, queue, execution, recorder

    def _run_rq_finish(
        self, job: Job, queue: Queue, execution: Execution, recorder: Recorder, t: datetime
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """RQ's own finish for a stand-in job at time t, recorded; the worker left as it was."""
        w = self.worker
        before = dict(vars(w))
        w.executions[execution.id] = execution
        real = w.connection
        w.connection, w.log = recorder, _QUIET  # type: ignore[assignment]
        try:
            with self.calls.clock(t, execution.id):
                w.rq_handle_job_success(job, queue, queue.started_job_registry, execution)
        finally:
            w.connection = real
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
        w = self.worker
        before = dict(vars(w))
        w.executions[execution.id] = execution
        w.log = _QUIET  # type: ignore[assignment]
        try:
            commands = self.template_finish(template, job, execution, t)
        finally:
            changed = self._restore_worker(before, execution.id)
        if changed:
            raise NotTemplatable(f"the template left the worker's {changed} changed")
        return commands

    def _restore_worker(self, before: dict[str, Any], execution_id: str) -> list[str]:
        """The worker's fields put back as they were before a stand-in's finish; returned, what
        the finish changed: the stand-in's execution must be gone (RQ's finish drops it), and
        nothing else changed but the fields the run itself swaps."""
        w = self.worker
        now_vars = vars(w)
        changed = sorted(
            k
            for k in set(now_vars) | set(before)
            if now_vars.get(k, _GONE) is not before.get(k, _GONE) and k not in ("connection", "log")
        )
        if w.executions.pop(execution_id, None) is not None:
            changed.append("executions")
        for name in set(now_vars) - set(before):
            delattr(w, name)
        for name, value in before.items():
            setattr(w, name, value)
        return changed


_LOG = logging.getLogger("herder")
_RQ_WORKER_LOG = logging.getLogger("rq.worker")  # RQ's cleanup_execution logs here at DEBUG
# A stand-in's finish says nothing: a logger of no hierarchy (no configuration enables it again).
_QUIET = logging.Logger("herder.fast_path.stand_in", logging.CRITICAL + 1)
_QUIET.disabled = True
_GONE = object()


def _why(exc: Exception) -> str:
    if isinstance(exc, NotRecordable):
        return f"it talks to Redis outside its transaction: {exc}"
    return str(exc) if isinstance(exc, NotTemplatable) else repr(exc)
