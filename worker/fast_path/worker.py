"""herder's fast job lifecycle: RQ's own writes for each job, in one round trip instead of about eleven.

RQ's SimpleWorker spends a no-op job's time mostly waiting on Redis: a heartbeat, the state,
the dequeue, the job's hash, an execution transaction, a start transaction, the job's heartbeat,
a WATCH and a read of the dependents, the finish transaction and the state again, each its
own round trip. The fast path sends the same commands, built by RQ's own code, in one script
call. RQ's worker methods are each overridden once, in one of herder.worker.rq_worker.HerderMixin's
parts (`Dequeue`, `JobPath`, `Presence`: worker/rq_worker.py tells one job's way through
them); those the fast path changes ask the worker's `fast` attribute (a `FastPath`, this
module) first. One job, in order:

1. **take** (Dequeue.dequeue_job_and_maintain_ttl -> `FastPath.flush`): the previous job's
   finish, held, goes out in one script call (call.py; script.py, framed by wire.py) that also takes the
   next job exactly as RQ's dequeue does (LMOVE into the intermediate list for one queue, LPOP
   in order for several; a vanished job is skipped) and returns its hash, made into RQ's Job
   (take.py; restore.py once checked against RQ's restore). The first job, and every job after
   an idle moment, is taken by RQ's own blocking dequeue.
2. **busy** (Dequeue._took): the protocol's line, with the previous job's held `done`.
3. **start** (JobPath.prepare_execution and prepare_job_execution -> start.py): RQ's two
   start transactions were written by that same script from a template RQ's code recorded for
   a stand-in job (start_template.py), and only RQ's objects are made; or, for the first job and
   one the template is not for (another timeout), they are recorded (recording.py) and sent in a
   script call of their own.
4. **perform** (JobPath.perform_job): RQ's, the job's own code.
5. **finish** (JobPath._finalize_success, handle_execution_ended, handle_job_success ->
   finish.py): the finish transaction RQ's handle_job_success builds is recorded, not sent,
   together with the state and heartbeat writes after it (Presence.set_state and heartbeat
   add them to the held finish); from the second successful job of a shape on, it is filled in
   from a template (finish_template.py), made from RQ's own finish and checked against it. RQ
   WATCHes the job's dependents set around its transaction; the script checks it is empty
   instead, atomically, and when it is not nothing is written and RQ's own path finishes the job
   (dependents are enqueued by RQ's code).
6. **done** (JobPath.execute_job -> `Finish.hold_done`): held until the finish is in Redis,
   so a job the master counts done is done in Redis too; it goes with the next `busy` (1, 2), or
   alone when the next call takes no job (a stop, a pause, the jobs limit, an empty queue; also
   Presence.check_for_suspension, Dequeue.run_maintenance_tasks and teardown send the held
   finish).

Each shortcut is a `Learned` (learned.py): LEARNING, READY, or REFUSED with its reason, and
then RQ's own code does that step. Everything else stays RQ's code path: a failed job, a Retry,
a job with a rate limit, webhooks or repeats, a user's worker, queue class or dequeue strategy,
and every idle moment (the blocking dequeue is RQ's). docs/design.md ("Fast path") has the why;
tests/test_fast_path.py compares the Redis state key by key with RQ's SimpleWorker.

This package, one job a module: `worker.py` (this story, `FastPath` and the worker class),
`take.py`, `start.py`, `finish.py` (the three steps and what each learnt), `call.py` (the
worker's numbered script calls), `learned.py` (a shortcut's state), `recording.py` (RQ's writes
recorded, not sent), `script.py` (the Lua script and its connection), `wire.py` (the call
framed as RESP), `start_template.py` (the next job's start), `finish_template.py` (a job's
finish, filled in), `restore.py` (a taken job made from its hash), `loglines.py` (RQ's INFO
lines, written directly), `shortcuts.py` (RQ's pure helpers, cheaper). Every name of RQ's it
relies on beyond RQ's documented API is checked at
start by herder.common.rq_seam; an rq without them runs herder's worker on RQ's own path.
"""

from __future__ import annotations

import _signal
from typing import Any

from redis.exceptions import ResponseError
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import UnixSignalDeathPenalty
from rq.worker import SimpleWorker

from herder.worker.fast_path import shortcuts
from herder.worker.fast_path.call import Calls
from herder.worker.fast_path.finish import Finish
from herder.worker.fast_path.recording import RecordingPipeline
from herder.worker.fast_path.start import Start, Written
from herder.worker.fast_path.take import Take
from herder.worker.fast_path.wire import text, unpack_hash
from herder.worker.fence import Fence
from herder.worker.rq_worker import HerderMixin


class FastPath:
    """One worker's fast path: its three steps (take, start, finish) and the script call that
    carries them, one numbered call of this worker at a time."""

    def __init__(self, worker: HerderMixin) -> None:
        self.worker = worker
        self.calls = Calls(worker)
        self.take = Take(worker)
        self.start = Start(self.calls)
        self.finish = Finish(self.calls)

    # ---- 1. take (and 6. done): the held finish out, the next job in -----------------------

    def take_next(self, timeout: int | None) -> tuple[Job, Queue] | None:
        """While a finish is held, at RQ's dequeue: the finish goes out and the next job comes
        back (with its start written) in one round trip, unless the master said stop, pause or
        an ending, or the jobs limit is reached: then the finish goes alone. None: no job taken
        here, RQ's own dequeue is next."""
        w = self.worker
        channel = w.channel
        # At its jobs limit (or told to retire) the last job's finish takes nothing.
        take = not (channel.stop_reason or channel.endings or channel.paused) and channel.limit.reserve()
        result = None
        try:
            result = self.flush(take=take)
            if result is not None:
                return w._took(result)  # its `busy` takes the held `done` along
        finally:
            if take:
                channel.limit.settle(result is not None)
            channel.send_held()  # if no `busy` went out (none taken, or it raised)
        w.check_for_suspension(burst=timeout is None)  # the script took none: maybe suspended
        return None

    def flush(self, take: bool = False) -> tuple[Job, Queue] | None:
        """Send the waiting finish (and take the next job if `take`, and write its start when
        the template fits it): one round trip."""
        w, finish = self.worker, self.finish
        pending, finish.pending = finish.pending, None
        if pending is None:
            return None
        beat = RecordingPipeline(w.connection)
        finish.write_job_beat(pending.job, pending.beat, beat)
        before, after = beat.take_recorded(), pending.after.take_recorded()
        commands = [*before, *pending.finish, *after]
        start = self.start.next_values() if take else None
        owner = (pending.started_key, pending.execution.composite_key, pending.moved)
        take_args = self.take.args() if take else [""]
        reply = self.calls.run(
            pending.guards, commands, None if start is None else start[:2], take_args, owner
        )
        code = int(reply[0])
        if code == 0:  # the job has dependents: RQ's own finish (WATCH, dependents, MULTI)
            finish.by_rq(pending, after)
        if code == 6:  # recovered from this worker while it could not reach Redis: not ours to end
            w.log.warning(
                "Worker %s: job %s ran here, but its finish was not written: the job was recovered "
                "from this worker while it could not reach Redis (its lease ran out), so it runs or "
                "has run elsewhere, whose outcome stands",
                w.name, pending.job.id,
            )  # fmt: skip
        if pending.done is not None:  # held when a job was taken: its `busy` follows at once
            job_id, ok = pending.done
            w.channel.done(job_id, None if code == 6 else ok, hold=code in (2, 4))  # none of ours
        if code == 3:
            raise ResponseError(text(reply[1]))
        if code in (2, 4):
            job_id = text(reply[2])
            # Its moves, read by the take itself; a start of its own takes it out of the list.
            w._fence = Fence(w.job_class.key_for(job_id), job_id, int(reply[6]), w.claim_key(), w.held())
            if code == 4:  # its start is written: prepare_execution makes RQ's objects only
                assert start is not None
                self.start.current = Written(job_id, start[2], start[3], text(reply[5]))
            return self.take.took(text(reply[1]), job_id, unpack_hash(reply[3], reply[4]))
        return None

    def close(self) -> None:
        """At teardown: the held finish out, the script's connection back to the pool."""
        try:
            self.flush()
        finally:
            self.calls.release()


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


class HerderFastWorker(HerderMixin, SimpleWorker):
    """herder's default worker: RQ's SimpleWorker, herder's protocol, the fast lifecycle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        shortcuts.install()  # RQ's serializer check and timestamps, the same answers, cheaper
        super().__init__(*args, **kwargs)
        self.fast = FastPath(self)
        if self.death_penalty_class is UnixSignalDeathPenalty:  # RQ's default, not a user's
            self.death_penalty_class = SignalDeathPenalty
