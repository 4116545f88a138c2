"""What the advice rests on (views/advice.py), kept by the loop: per pool, its jobs' busy and CPU
seconds as they finish, each worker's RSS after its jobs, and the pool's figures once a second,
over the last WINDOW seconds. Bounded: a pool keeps at most MAX_JOBS jobs and MAX_RSS readings.

The loop hands each finished job over as it folds it (`jobs`) and calls `observe` each pass: a
pass costs nothing between two samplings, a count of its live workers at one (once a second,
no copy of what a worker of one thread said), and an RSS read of the workers that finished
most jobs since their last reading (RSS_BATCH of them, once every RSS_EVERY), known as their
jobs are folded, not by a walk of the fleet. A pool whose settings change (a reload, `herder
scale`) starts its evidence afresh: advice rests only on what was seen under the settings in
force."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.observations import FinishedJob
from herder.supervisor.children.states import WorkerState
from herder.supervisor.policy.pool import Pool
from herder.supervisor.views.advice import (
    Advice,
    Evidence,
    JobSample,
    PoolSample,
    RssSample,
    Settings,
    advise,
)
from herder.supervisor.views.usage import Usage

WINDOW = 15 * 60.0  # seconds of evidence kept, as the dashboard's history
SAMPLE_EVERY = 1.0
RSS_EVERY = 2.0
# Workers whose RSS one reading takes, those with the most jobs since their last first: a
# reading costs ~50 us a worker, so a busy fleet of 256 costs a few ms every RSS_EVERY, not 13.
RSS_BATCH = 32
ADVISE_EVERY = 5.0  # seconds an answer is reused (the snapshot asks every 0.5 s)
MAX_JOBS = 2000  # enough for any advice; what the loop reads every 5 s stays a few ms
MAX_RSS = 2000


class _PoolEvidence:
    def __init__(self, under: Settings | None = None) -> None:
        self.under = under  # the settings it was gathered under
        self.jobs: deque[JobSample] = deque(maxlen=MAX_JOBS)
        self.rss: deque[RssSample] = deque(maxlen=MAX_RSS)
        self.samples: deque[PoolSample] = deque(maxlen=int(WINDOW / SAMPLE_EVERY) + 1)
        self.unread: dict[int, int] = {}  # pid -> jobs it finished since its last RSS reading

    def trim(self, now: float) -> None:
        since = now - WINDOW
        for ring in (self.jobs, self.rss, self.samples):
            while ring and ring[0].at < since:
                ring.popleft()


class EvidenceKeeper:
    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self._pools: dict[str, _PoolEvidence] = {}
        self._sampled_at = self._rss_at = float("-inf")
        self._advice: tuple[Advice, ...] = ()
        self._advised_at = float("-inf")

    def _of(self, pool: str) -> _PoolEvidence:
        ev = self._pools.get(pool)  # not setdefault: that builds a new one (three rings) each call
        if ev is None:
            ev = self._pools[pool] = _PoolEvidence()
        return ev

    def jobs(self, w: Worker, done: list[FinishedJob], now: float) -> None:
        """A worker's finished jobs, as the loop folds them: samples for the advice, and the
        worker due an RSS reading (so a reading never walks the fleet for who worked)."""
        ev = self._of(w.pool)
        ev.jobs.extend(JobSample(now, j.seconds, j.cpu, j.runq or 0.0) for j in done)
        ev.unread[w.pid] = ev.unread.get(w.pid, 0) + len(done)

    def observe(self, pools: Iterable[Pool], now: float) -> None:
        """The pools' figures, once a second; their workers' RSS, every RSS_EVERY."""
        if now - self._sampled_at < SAMPLE_EVERY:
            return
        self._sampled_at = now
        read_rss = now - self._rss_at >= RSS_EVERY
        if read_rss:
            self._rss_at = now
        pools = list(pools)
        for gone in set(self._pools) - {p.name for p in pools}:
            del self._pools[gone]
        for pool in pools:
            ev = self._of(pool.name)
            under = settings(pool, None)
            if ev.under is None:
                ev.under = under
            elif ev.under != under:  # new threads, bounds, limits: what was seen says nothing of them
                ev = self._pools[pool.name] = _PoolEvidence(under)
            ev.samples.append(_sample(pool, now))
            if read_rss:
                self._read_rss(ev, pool.by_pid, now)
            ev.trim(now)

    def _read_rss(self, ev: _PoolEvidence, alive: dict[int, Worker], now: float) -> None:
        """The workers that finished most jobs since their last reading (an idle one's RSS says
        nothing new about its jobs); the others wait their turn. Costs the workers that worked."""
        if any(pid not in alive for pid in ev.unread):  # gone before its reading
            ev.unread = {pid: n for pid, n in ev.unread.items() if pid in alive}
        if not ev.unread:
            return
        batch = sorted(ev.unread, key=ev.unread.__getitem__, reverse=True)[:RSS_BATCH]
        for pid, rss in self.usage.rss(batch).items():
            del ev.unread[pid]
            if rss is not None:
                o = alive[pid].proc.snapshot()
                ev.rss.append(RssSample(now, pid, o.jobs_ok + o.jobs_failed, rss))

    def evidence(self, pool: Pool, cap: int | None) -> Evidence:
        ev = self._of(pool.name)
        return Evidence(pool.name, settings(pool, cap), tuple(ev.jobs), tuple(ev.rss), tuple(ev.samples))

    def advice(
        self, pools: Iterable[Pool], limit: int, now: float, fresh: bool = False
    ) -> tuple[Advice, ...]:
        """Every pool's advice, worked out at most every ADVISE_EVERY unless `fresh`."""
        if fresh or now - self._advised_at >= ADVISE_EVERY:
            self._advised_at = now
            self._advice = tuple(a for p in pools for a in advise(self.evidence(p, _cap(p, limit))))
        return self._advice


def _cap(pool: Pool, limit: int) -> int:
    cluster = pool.cfg.cluster_max_workers
    return limit if cluster is None else min(limit, cluster)


def settings(pool: Pool, cap: int | None) -> Settings:
    cfg = pool.cfg
    return Settings(
        threads=cfg.threads,
        floor=cfg.floor,
        ceiling=cfg.ceiling,
        autoscale=cfg.autoscale,
        max_wait=cfg.max_wait,
        scale_down_delay=cfg.scale_down_delay,
        max_jobs=cfg.max_jobs,
        max_memory=cfg.max_memory,
        cap=cap,
    )


def _sample(pool: Pool, now: float) -> PoolSample:
    alive = pool.live()
    busy = running = 0
    for w in alive:
        # A worker of one thread runs a job while BUSY (the loop's reading of its lines);
        # only a threaded one's count needs its lines' record (a copy, for an idle worker that
        # spoke since: its `idle` lines change it once a second).
        n = len(w.proc.snapshot().jobs) if w.threads > 1 else int(w.life.state == WorkerState.BUSY)
        busy += n > 0
        running += n
    read = [pool.scaler.queues.get(q) for q in pool.cfg.queues]
    known = all(q is not None for q in read)
    return PoolSample(
        at=now,
        running=len(alive),
        busy=busy,
        jobs_running=running,
        target=pool.target,
        oldest_age=max((q.oldest_age or 0.0 for q in read if q), default=0.0) if known else None,
        backlog=sum(q.backlog or 0 for q in read if q) if known else None,
        demand=pool.scaler.demand,
    )
