"""Endings: jobs herder gave up on (past max_requeues) are ended by a worker, as RQ ends an
abandoned job (herder.worker.abandoned); this part of the loop only decides who.

The recovery thread knows which endings wait (its sweep reads them from Redis, so an ending
left by a master that died, or by another host, is found too). Each pass the loop offers
each waiting ending, once, to an idle worker of the current generation that is not paused,
culled or retiring (`end <job-id>` on its stdin); the worker frames the work as busy ... done,
so the usual deadlines watch it. An offer ends when its worker says done (the same give-up
is not offered again: the recovery thread's view lags by up to a sweep), when its worker is
gone, or after OFFER_TTL (another host's worker may hold the claim; the job is offered
again, and a worker finding a live claim does nothing). With no idle worker, endings wait
for one: user code never runs in the master.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.states import WorkerState

log = logging.getLogger("herder")

OFFER_TTL = 30.0  # seconds before an ending still waiting is offered again


@dataclass(frozen=True)
class Offer:
    pid: int  # the worker asked
    give_up: int  # which give-up of the job (recovery numbers them): a new one is a new ending
    at: float  # monotonic
    endings_before: int  # the worker's count of finished endings when asked


class Endings:
    def __init__(self) -> None:
        self.offered: dict[str, Offer] = {}  # job id -> the offer in flight
        self.finished: dict[str, tuple[int, float]] = {}  # job id -> (give-up, when) its worker said done

    def dispatch(
        self,
        waiting: dict[str, int],
        workers: Iterable[Worker],
        current: Callable[[Worker], bool],
        now: float,
    ) -> None:
        """Offer each waiting ending (job id -> its give-up number) to an idle worker that has
        none; never the same give-up twice within OFFER_TTL."""
        if not waiting and not self.offered and not self.finished:
            return  # the usual pass: nothing given up
        workers = list(workers)
        by_pid = {w.pid: w for w in workers}
        for job, offer in list(self.offered.items()):
            w = by_pid.get(offer.pid)
            if w is not None and w.proc.snapshot().endings > offer.endings_before:
                self.finished[job] = (offer.give_up, now)  # done (or found nothing to do)
            elif job in waiting and w is not None and now - offer.at < OFFER_TTL:
                continue
            del self.offered[job]
        self.finished = {
            job: (n, at) for job, (n, at) in self.finished.items() if job in waiting and now - at < OFFER_TTL
        }
        taken = {o.pid for o in self.offered.values()}
        free = [w for w in workers if self.can_end(w, current) and w.pid not in taken]
        for job_id, give_up in sorted(waiting.items()):
            if job_id in self.offered or self.finished.get(job_id, (None,))[0] == give_up:
                continue
            if not free:
                return
            w = free.pop(0)
            w.proc.send_end(job_id)
            self.offered[job_id] = Offer(w.pid, give_up, now, w.proc.snapshot().endings)
            log.info("slot %d pid %d: asked to end job %s (given up by herder)", w.slot, w.pid, job_id)

    @staticmethod
    def can_end(w: Worker, current: Callable[[Worker], bool]) -> bool:
        """Idle, of its pool's current generation, not paused, culled or retiring."""
        return (
            w.life.state == WorkerState.IDLE
            and current(w)
            and not w.retiring
            and not w.culled
            and not w.proc.snapshot().paused
        )
