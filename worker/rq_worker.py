"""herder's RQ worker: RQ's SimpleWorker (or a user's --worker-class) that reports to the master.

With SimpleWorker, jobs run in this process, one at a time: the master is the isolation (fork per job
costs about 6x in RQ's own benchmark). Everything about a job's lifecycle (registries,
results, retries, callbacks) stays RQ's: herder only adds protocol lines, turns the
blocking dequeue into one-interval slices so the main loop can heartbeat, and keeps the
worker's lease (herder.common.rq_names) renewed, so any master can tell it is alive.

Every RQ method herder changes is overridden once, in one of HerderMixin's three parts, each a
module: `Presence` (presence.py: what the master and RQ see of the worker at any time),
`Dequeue` (dequeue.py: taking jobs) and `JobPath` (job_path.py: a taken job's start, run and
finish); `HerderBase` (base.py) holds what they share. On herder's default worker
(HerderFastWorker) the fast path is `self.fast`, and the overrides where it changes a step ask
it first; worker/fast_path/worker.py tells the fast path's side of the same story.

One job, in order, from RQ's `work()` loop:

1. **registered** (Presence.bootstrap): RQ's, tried again while Redis is away; then `ready`.
2. **waiting** (Dequeue.dequeue_job_and_maintain_ttl): RQ's blocking dequeue, one slice
   (Dequeue.dequeue_slice) at a time. Before each slice: a stop request, a pause
   (Presence.check_for_suspension), the endings the master asked for (Dequeue.run_endings),
   the jobs limit (Dequeue.wait_retiring). Within it, RQ's heartbeats and state go through
   Presence.heartbeat and set_state (`idle`, said once); a request from the master ends the
   slice at once (Presence.wake_dequeue, then `Woken`), a Redis that fails it leaves for
   herder's own wait (`RedisAway`, Presence.redis_away). On the fast path, while a finish is
   held, the next job comes with it (FastPath.take_next).
3. **taken** (Dequeue.reorder_queues, RQ's hook once its dequeue took a job; Dequeue._took):
   `busy` at once, and the job's fence (herder.worker.fence: Dequeue.claim_key, held).
4. **started** (JobPath.execute_job, then RQ's: JobPath.prepare_execution and
   prepare_job_execution): the fast path's start, or RQ's two start transactions, fenced
   against a recovery of the job (StartRefused: JobPath.start_refused) and tried again on a
   reset.
5. **run** (JobPath.perform_job): the job's own code; RQ's stop-job command stops it here
   (Presence.handle_payload and kill_horse raise `JobStopped` in it).
6. **finished** (JobPath._finalize_success, handle_execution_ended, handle_job_success; or
   _finalize_failure, handle_job_failure, handle_exception): the fast path's finish, held for
   the next round trip, or RQ's, fenced (JobPath.recovered_from_me) and tried again.
7. **done** (the end of JobPath.execute_job): the protocol's line; on the fast path held until
   the finish is in Redis (sent with the next `busy`, or by Presence.check_for_suspension,
   Dequeue.run_maintenance_tasks or Dequeue.teardown).

Between jobs RQ's maintenance (Dequeue.run_maintenance_tasks); at the end Dequeue.teardown and
Presence.unsubscribe. RQ's remote commands and `herder pause` are Presence's (presence.py's
module doc).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT
from rq.worker import BaseWorker, SimpleWorker

from herder.worker.dequeue import Dequeue
from herder.worker.job_path import JobPath
from herder.worker.presence import Presence


class HerderMixin(Dequeue, JobPath, Presence):
    """herder's protocol on top of any RQ worker class: SimpleWorker (herder's default, the
    job in this process) or a user's class (`--worker-class`), forking ones included. Its parts
    override RQ's methods, each in one of them (tests/test_overrides.py); it adds none."""


class ToMaster(logging.StreamHandler):
    """RQ's two handlers in one: records below ERROR to stdout, the rest to stderr (both are
    the master's pipes). One handler, not two filtered ones: half the dispatch per line."""

    # While a thread holds it (hold(): the fast path, for RQ's two lines at a job's success, back
    # to back, nothing run between them) that thread's records below ERROR are kept, then written
    # together: one write for both (the worker's stdout is unbuffered, PYTHONUNBUFFERED, so each
    # record is otherwise a write of its own). Other threads' records are written as always.
    _holder: int | None = None

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self._held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if (
            self._holder is not None
            and record.levelno < logging.ERROR
            and self._holder == threading.get_ident()
        ):
            try:
                self._held.append(self.format(record) + self.terminator)
            except Exception:
                self.handleError(record)
            return
        self.stream = sys.stdout if record.levelno < logging.ERROR else sys.stderr
        super().emit(record)

    def write_line(self, line: str, record: Callable[[], logging.LogRecord]) -> None:
        """A line below ERROR, formatted as format() formats its record (the fast path's INFO
        lines, herder.worker.fast_path.loglines), written as emit() writes it: held, or a write
        and a flush under the handler's lock. `record` makes the record for handleError."""
        if self._holder is not None and self._holder == threading.get_ident():
            self._held.append(line + self.terminator)
            return
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            self.stream = sys.stdout
            try:
                self.stream.write(line + self.terminator)
                self.flush()
            except RecursionError:  # as StreamHandler.emit
                raise
            except Exception:
                self.handleError(record())

    def hold(self) -> None:
        self._holder = threading.get_ident()

    def unhold(self) -> None:
        """The held records out, in one write."""
        if self._holder != threading.get_ident():
            return
        self._holder = None
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            held, self._held = "".join(self._held), []
            if held:
                self.stream = sys.stdout
                try:
                    self.stream.write(held)
                    self.flush()
                except Exception:  # as logging's own emit: a broken stream never fails the worker
                    pass


_to_master: ToMaster | None = None  # the handler log_to_master installed, if it did


def held_log_lines() -> ToMaster | None:
    """herder's own log handler, to hold lines with; None under a user's logging config."""
    return _to_master


def _no_caller(*args: object, **kwargs: object) -> tuple[str, int, str, None]:
    return "(unknown file)", 0, "(unknown function)", None


def log_to_master(log_format: str) -> None:
    """RQ's own log set-up (rq.logutils.setup_loghandlers: info to stdout, errors to stderr,
    not propagated), with a plain handler. RQ's colourising one asks isatty() of its stream for
    every record, a system call per line; a worker's streams are always the master's pipes.
    herder's format names no caller, so RQ's worker logger skips looking for one (a walk up
    the stack per line). As RQ, nothing is added when a handler is already in place (a user's
    logging config), and then nothing else changes either."""
    logger = logging.getLogger("rq.worker")
    node: logging.Logger | None = logger
    while node is not None:
        if node.handlers:
            return
        node = node.parent
    global _to_master
    handler = _to_master = ToMaster()
    handler.setFormatter(logging.Formatter(fmt=log_format, datefmt=DEFAULT_LOGGING_DATE_FORMAT))
    logger.addHandler(handler)
    logger.propagate = False
    if "%(pathname)" not in log_format and "%(filename)" not in log_format and "%(lineno)" not in log_format:
        logger.findCaller = _no_caller  # type: ignore[method-assign]


def herder_worker_class(base: type[BaseWorker] = SimpleWorker) -> type[BaseWorker]:
    """herder's protocol combined with an RQ worker class (a user's `--worker-class`)."""
    if issubclass(base, HerderMixin):
        return base
    return type(f"Herder{base.__name__}", (HerderMixin, base), {})


HerderWorker = herder_worker_class(SimpleWorker)
