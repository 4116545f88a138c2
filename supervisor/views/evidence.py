"""What the advice rests on (views/advice.py), kept by the loop: per pool, its jobs' busy and CPU
seconds as they finish, each worker's RSS after its jobs, and the pool's figures once a second,
over the last WINDOW seconds. Bounded: a pool keeps at most MAX_JOBS jobs and MAX_RSS readings.

The loop hands each finished job over as it folds it (`jobs`) and calls `observe` each pass: a
pass costs nothing between two samplings, O(workers) at one (once a second), and an RSS read
of the workers that finished most jobs since their last reading (RSS_BATCH of them, once every
RSS_EVERY). A pool whose settings change (a reload, `herder scale`) starts its evidence
afresh: advice rests only on what was seen under the settings in force."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.observations import FinishedJob
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
        self.read_jobs: dict[int, int] = {}  # pid -> its jobs at its last RSS reading

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

    def jobs(self, pool: str, done: Iterable[FinishedJob], now: float) -> None:
        ring = self._of(pool).jobs
        ring.extend(JobSample(now, j.seconds, j.cpu, j.runq or 0.0) for j in done)

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
                self._read_rss(ev, list(pool.workers.values()), now)
            ev.trim(now)

    def _read_rss(self, ev: _PoolEvidence, workers: list[Worker], now: float) -> None:
        """Each worker that finished a job since its last reading (an idle one's RSS says nothing
        new about its jobs)."""
        counts = {}
        for w in workers:
            o = w.proc.snapshot()
            done = o.jobs_ok + o.jobs_failed
            if done and ev.read_jobs.get(w.pid) != done:
                counts[w.pid] = done
        alive = {w.pid for w in workers}
        ev.read_jobs = {pid: n for pid, n in ev.read_jobs.items() if pid in alive}
        if not counts:
            return
        since = {pid: n - ev.read_jobs.get(pid, 0) for pid, n in counts.items()}
        batch = sorted(since, key=since.__getitem__, reverse=True)[:RSS_BATCH]
        for pid, rss in self.usage.rss(batch).items():
            if rss is not None:
                ev.rss.append(RssSample(now, pid, counts[pid], rss))
                ev.read_jobs[pid] = counts[pid]

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
        n = len(w.proc.snapshot().jobs)
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
