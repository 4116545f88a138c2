"""A job's start on the fast path: RQ's two start transactions in one script call, or none.

`Start` holds what the worker learnt about RQ's start, each a `Learned` (learned.py):
- `recording`: RQ's start can be recorded (its writes all in its pipelines); REFUSED, every
  start is RQ's own, two round trips;
- `templates`: the start templates by job timeout (start_template.py), with which the script
  that takes the next job writes its start too; REFUSED, each start keeps a call of its own;
- `direct`: RQ's start objects (the execution, the job's and the worker's fields) are built
  directly (`build`); REFUSED, RQ's start is replayed against a discarding connection for them.
And, for the job at hand (`current`), where its start is: `Written` by the take's script (RQ's
objects still to make, in prepare_execution), then `Prepared` (in Redis with its execution:
prepare_job_execution has nothing to write, and raises what RQ's start raised after its writes).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.exceptions import ResponseError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.utils import now
from rq.worker import WorkerStatus

from herder.common import rq_seam
from herder.worker.fast_path import start_template
from herder.worker.fast_path.call import Calls
from herder.worker.fast_path.learned import Learned
from herder.worker.fast_path.recording import Discard, NotRecordable, Recorder, RecordingPipeline
from herder.worker.fast_path.start_template import NotTemplatable, StartTemplate, timeout_key
from herder.worker.fast_path.wire import text
from herder.worker.fence import StartRefused

MAX_TEMPLATES = 16  # start templates a worker keeps (one per job timeout it has seen)
_LOG = logging.getLogger("herder")
# The replay's own machinery on the worker (Start.record), not RQ's start.
_REPLAY_FIELDS = frozenset({"lease_quiet"})


@dataclass
class Written:
    """A start the take's script wrote from a template: RQ's objects are still to be made."""

    job_id: str
    t: datetime
    execution_id: str
    error: str  # what EXEC would have raised ('' for none)


@dataclass
class Prepared:
    """A start in Redis with its execution: RQ's second start transaction is not to run."""

    job_id: str
    error: Exception | None  # what RQ's start raised after its writes (its data unreadable)


class Start:
    """RQ's prepare_execution and prepare_job_execution for one worker, on the fast path."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.worker = calls.worker
        self.recording: Learned[None] = Learned()
        self.templates: Learned[dict[str, StartTemplate]] = Learned()
        self.direct: Learned[None] = Learned()
        self.next: StartTemplate | None = None  # the template the next take starts its job with
        self.current: Written | Prepared | None = None  # the start of the job at hand

    # ---- prepare_execution: the start's first half -------------------------------------

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's prepare_execution and prepare_job_execution: the same writes, in one script
        call, or already written by the script that took the job (from the start template)."""
        w = self.worker
        written, self.current = self.current, None
        if isinstance(written, Written) and written.job_id == job.id:
            error = None
            if self.direct.ready and not w.log.isEnabledFor(logging.DEBUG):  # RQ's debug lines
                execution = self.build(job, written.t, written.execution_id)  # Redis has it: objects only
            else:
                execution, _, error = self.record(job, written.t, written.execution_id, keep=False)
            if written.error:  # as EXEC: the others ran, the error is raised
                raise ResponseError(written.error)
            self.current = Prepared(job.id, error)  # Written -> Prepared
            return execution
        if self.recording.refused:
            return w.rq_prepare_execution(job)
        w.channel.in_job = False  # the start's call is the loop's: the master's progress bound
        try:
            return self._in_one_call(job)
        finally:
            w.channel.in_job = True
            w.channel.progress()

    def _in_one_call(self, job: Job) -> Execution:
        w = self.worker
        fence = w._fence if w._fence is not None and w._fence.job_id == job.id else None
        t, execution_id = now(), uuid.uuid4().hex
        try:
            execution, commands, error = self.record(job, t, execution_id)
        except NotRecordable as exc:  # RQ's start talks to Redis outside its pipelines
            self.recording.refuse(f"RQ's start cannot be recorded ({exc})")
            self._drop_templates(self.recording.reason)
            return w.rq_prepare_execution(job)
        lease = RecordingPipeline(w.connection)
        w.renew_lease(lease)  # herder's lease, when due, rides along
        # One reply; written only while the job is where its take put it (herder.worker.fence).
        fenced = None if fence is None else (job.id, "" if fence.moves is None else fence.moves, fence.claim)
        reply = self.calls.run([], [*commands, *lease.take_recorded()], None, [""], fence=fenced)
        code = int(reply[0])
        if code == 7:
            w.executions.pop(execution_id, None)  # RQ's objects for a start Redis never had
            raise StartRefused(job.id)
        if code == 3:
            raise ResponseError(text(reply[1]))
        if fence is not None and len(reply) > 1:  # its moves as it started (none after a lost reply)
            fence.moves, fence.claim = int(reply[1]), ""
        self.current = Prepared(job.id, error)
        if error is None:  # a start that raised is no model for the next ones
            self.learn_template(job, t, execution_id, commands)
        return execution

    # ---- prepare_job_execution: the start's second half --------------------------------

    def prepare_job_execution(self, job: Job) -> bool:
        """True when the job's start is written already (with its execution): RQ's second
        transaction is not to run. Raises what RQ's start raised, where RQ raises it: in
        perform_job, which fails the job."""
        prepared = self.current
        if not isinstance(prepared, Prepared) or prepared.job_id != job.id:
            return False
        self.current = None  # Prepared -> none: the job runs
        if prepared.error is not None:
            raise prepared.error
        return True

    # ---- RQ's start, recorded, replayed or built --------------------------------------

    def record(
        self, job: Job, t: datetime, execution_id: str, keep: bool = True
    ) -> tuple[Execution, list[tuple[Any, ...]], Exception | None]:
        """RQ's own two start transactions for `job` (prepare_execution, then the horse's
        prepare_job_execution, with the intermediate-list clean-up RQ's perform_job asks for),
        run at time t with this execution id against a connection that records their writes
        (or, not `keep`, builds none: Redis has them already). RQ's objects (the execution,
        the job's and the worker's fields) are left as RQ leaves them. Returned with them, what
        RQ's start raised after its writes, for prepare_job_execution to raise where RQ does."""
        w = self.worker
        clock = self.calls.clock
        error = None
        real, job_real = w.connection, job.connection
        stand_in = Recorder(real, strict=True) if keep else Discard(real)
        w.connection = job.connection = stand_in  # type: ignore[assignment]
        w.lease_quiet = True  # herder's lease is not RQ's start: it rides apart, when due
        try:
            with clock(t, execution_id):
                execution = w.rq_prepare_execution(job)
                try:
                    w.rq_prepare_job_execution(job, remove_from_intermediate_queue=len(w.queues) == 1)
                except NotRecordable:
                    raise
                except Exception as exc:  # after its writes: a job whose data cannot be read (func_name)
                    error = exc  # raised by prepare_job_execution, as RQ's is
        finally:
            w.connection, job.connection = real, job_real
            w.lease_quiet = False
        execution.connection = job_real  # RQ made it with the job's connection, the stand-in then
        return execution, stand_in.recorded() if keep else [], error

    def build(self, job: Job, t: datetime, execution_id: str) -> Execution:
        """The objects RQ's two start transactions leave (the execution, the job's and the
        worker's fields), built here: replaying RQ's start for them cost a tenth of a no-op job.
        Used only once `_direct_matches` found them RQ's own for a stand-in job."""
        w = self.worker
        execution = Execution(id=execution_id, job_id=job.id, connection=job.connection, worker_name=w.name)
        execution.created_at = execution.last_heartbeat = t
        execution._job = job
        w.executions[execution_id] = execution
        rq_seam.restore_worker_state(w, WorkerStatus.BUSY)
        w.channel.progress()  # as herder's heartbeat in RQ's start
        w.last_heartbeat = t
        job.worker_name = w.name
        job.last_heartbeat = job.started_at = t
        job._status = JobStatus.STARTED
        job.func_name  # noqa: B018 - RQ's start names it (its procline): the job's data is read here too
        return execution

    def _direct_matches(self, timeout: Any) -> bool:
        """Whether `build` leaves what RQ's own start (replayed) leaves, for two like stand-in
        jobs at one time: every field of the worker, the job and the execution."""
        w = self.worker
        t, execution_id = start_template.STAND_IN_TIME, start_template.STAND_IN_EXECUTION
        jobs = [start_template.stand_in_job(w.job_class, w.connection, w.serializer, timeout) for _ in "12"]
        jobs[1].created_at = jobs[0].created_at  # made a moment apart: otherwise alike
        effects = []
        for job, replay in zip(jobs, (True, False), strict=True):
            before = dict(vars(w))
            try:
                if replay:
                    execution = self.record(job, t, execution_id, keep=False)[0]
                else:
                    execution = self.build(job, t, execution_id)
                effects.append((
                    {k: v for k, v in vars(w).items() if k not in _REPLAY_FIELDS},
                    {k: v for k, v in vars(job).items() if k != "connection"},
                    {k: "<the job>" if v is job else v for k, v in vars(execution).items()},
                    job.connection is w.connection and w.executions.get(execution_id) is execution,
                ))  # fmt: skip
            finally:
                w.executions.pop(execution_id, None)
                for name in set(vars(w)) - set(before):
                    delattr(w, name)
                for name, value in before.items():
                    setattr(w, name, value)
        return effects[0] == effects[1]

    # ---- the start template (start_template.py) ------------------------------------------

    def next_values(self) -> tuple[StartTemplate, list[Any], datetime, str] | None:
        """The next take's start: the template, its values, and the time and execution id it
        writes; None while there is no template to write it with."""
        if self.next is None:
            return None
        t, execution_id = now(), uuid.uuid4().hex
        return self.next, self.next.script_values(t, execution_id, self.calls.encode), t, execution_id

    def learn_template(
        self, job: Job, t: datetime, execution_id: str, commands: list[tuple[Any, ...]]
    ) -> None:
        """After a start of its own: the template for jobs with this one's timeout (the next
        job likely has the same), from RQ's code run for a stand-in, kept only if it gives this
        real start byte for byte. Each timeout's template is made once."""
        w = self.worker
        key = timeout_key(job.timeout)
        if self.templates.refused:
            return
        made = self.templates.value if self.templates.ready else {}
        if key in made:
            self.next = made[key]
            return
        if len(made) >= MAX_TEMPLATES:
            return  # a worker whose jobs have many timeouts: the rest keep two round trips
        encode = self.calls.encode
        stand_in = start_template.stand_in_job(w.job_class, w.connection, w.serializer, job.timeout)
        state, beat = rq_seam.worker_state(w), w.last_heartbeat
        try:
            _, recorded, failed = self.record(
                stand_in, start_template.STAND_IN_TIME, start_template.STAND_IN_EXECUTION
            )
            if failed is not None:  # a stand-in's start that raised is no model
                raise failed
            template = StartTemplate.from_recording(key, recorded, encode)
        except NotTemplatable as exc:
            self._drop_templates(str(exc))
            return
        except Exception as exc:  # RQ's start needs more of a job than a stand-in has
            self._drop_templates(f"RQ's start failed for a stand-in job: {exc!r}")
            return
        finally:
            w.executions.pop(start_template.STAND_IN_EXECUTION, None)
            rq_seam.restore_worker_state(w, state)
            w.last_heartbeat = beat
        real = [[encode(a) for a in c] for c in commands]
        if template.fill(job.id, job.origin, execution_id, t, encode) != real:
            self._drop_templates("the template did not give RQ's own start for a real job")
            return
        made[key] = self.next = template
        self.templates.become_ready(made)
        if self.direct.learning:
            try:
                direct = self._direct_matches(job.timeout)
            except Exception:  # an RQ whose start objects are not the ones built here
                direct = False
            if direct:
                self.direct.become_ready(None)
            else:
                self.direct.refuse("RQ's start is replayed for its objects")
                _LOG.info("fast path: %s", self.direct.reason)

    def _drop_templates(self, why: str) -> None:
        self.next = None
        self.templates.refuse(why)
        _LOG.info("fast path: each start keeps its own round trip (%s)", why)
