"""The throughput scenario: enqueue N no-op jobs, then start the pool, and time the jobs.

jobs/s is N over the span from the first job's `started_at` to the last job's `ended_at`
(RQ's own job timestamps), so start-up does not count. Also measured: wall time (pool
launch to the last `ended_at`), start-up (pool launch to the first job's `started_at` and
`ended_at`), steady-state jobs/s (10% to 90% of the `ended_at`s), and CPU per job split
between the workers and the supervising processes. Contenders take turns round by round,
with the Redis DB flushed before every run; each round ends with the floor's turn (a bare
Redis queue loop timed the same way, bench_floor.py) unless --skip-floor. Its results are
under the key FLOOR_KEY beside the contenders'.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable

from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from bench_base import BenchError, say, steady_rate
from bench_contenders import JOB_FUNC, QUEUE, Contender, Pool, Scenario
from bench_cpu import CpuMeter
from bench_floor import FLOOR_KEY, FLOOR_LABEL, FloorTest

STAGING_KEY = f"rq:queue:{QUEUE}:staging"


def enqueue(conn: Redis, n: int, staged: bool = False) -> list[str]:
    """Enqueue n no-op jobs on QUEUE. With `staged`, the job ids go to a side list instead of
    the queue (the jobs still name QUEUE as their origin), and `release()` later moves the
    whole list into the queue at once: workers that are already up see all the jobs together."""
    q = Queue(QUEUE, connection=conn)
    if staged:
        q._key = STAGING_KEY  # rq pushes job ids onto `queue.key`
    ids: list[str] = []
    for start in range(0, n, 500):
        datas = [Queue.prepare_data(JOB_FUNC) for _ in range(min(500, n - start))]
        with conn.pipeline() as pipe:
            jobs = q.enqueue_many(datas, pipeline=pipe)
            pipe.execute()
        ids += [j.id for j in jobs]
    held = conn.llen(q.key)
    if held != n:
        raise BenchError(f"enqueued {n} jobs but {q.key} holds {held}")
    return ids


def release(conn: Redis) -> None:
    """Staged jobs into the queue, in one step (RENAME wakes the workers blocked on it)."""
    real = Queue(QUEUE, connection=conn).key
    with conn.pipeline() as pipe:  # MULTI/EXEC
        pipe.rename(STAGING_KEY, real)
        pipe.srem(Queue.redis_queues_keys, STAGING_KEY)
        pipe.sadd(Queue.redis_queues_keys, real)
        pipe.execute()


def wait_done(
    conn: Redis, pool: Pool, n: int, timeout: float, each: Callable[[int], None] | None = None
) -> None:
    """Poll the finished and failed registries until n jobs are done; `each(done)` per poll."""
    finished = FinishedJobRegistry(QUEUE, connection=conn)
    failed = FailedJobRegistry(QUEUE, connection=conn)
    deadline = time.monotonic() + timeout
    while True:
        done = finished.get_job_count(cleanup=False) + failed.get_job_count(cleanup=False)
        if each:
            each(done)
        if done >= n:
            return
        if pool.popen.poll() is not None:
            raise BenchError(
                f"exited ({pool.popen.returncode}) after {done} of {n} jobs; see {pool.log_path}"
            )
        if time.monotonic() > deadline:
            raise BenchError(f"only {done} of {n} jobs done after {timeout:g} s")
        time.sleep(0.01)


def job_times(conn: Redis, ids: list[str], log_path: object) -> tuple[list[float], list[float], Counter]:
    """Every job's `started_at` and `ended_at` (epoch seconds), and jobs per worker name;
    raises unless every job finished."""
    starts, ends, by_worker, bad = [], [], Counter(), Counter()
    for i in range(0, len(ids), 500):
        for job in Job.fetch_many(ids[i : i + 500], connection=conn):
            if job is None or job.get_status(refresh=False) != JobStatus.FINISHED:
                bad[job.get_status(refresh=False) if job else "missing"] += 1
                continue
            starts.append(job.started_at.timestamp())
            ends.append(job.ended_at.timestamp())
            by_worker[job.worker_name] += 1
    if bad:
        raise BenchError(
            f"{sum(bad.values())} of {len(ids)} jobs did not finish: {dict(bad)}; see {log_path}"
        )
    return starts, ends, by_worker


class ThroughputTest(Scenario):
    def run(self) -> dict[str, list[dict]]:
        contenders = self.launcher.contenders
        results: dict[str, list[dict]] = {c.key: [] for c in contenders}
        floor = None if self.args.skip_floor else FloorTest(self)
        if floor:
            results[FLOOR_KEY] = []
        for r in range(1, self.args.rounds + 1):
            for c in contenders:  # taking turns spreads any drift over everyone
                say(f"throughput round {r}/{self.args.rounds}: {c.label}, {self.args.jobs} jobs")
                res = self.attempt(f"throughput, {c.label}, round {r}", lambda c=c, r=r: self.round(c, r))
                if res is None:
                    continue
                results[c.key].append(res)
                say(
                    f"  {res['jobs_per_s']:.0f} jobs/s over {res['span']:.2f} s "
                    f"(steady {res['steady_jobs_per_s']:.0f}); wall {res['wall']:.2f} s; "
                    f"first job done {res['first_done_after'] * 1000:.0f} ms after launch; "
                    f"CPU/job workers {res['cpu_workers'] * 1000:.2f} ms "
                    f"+ supervisor {res['cpu_supervisor'] * 1000:.2f} ms; "
                    f"{res['workers_used']} workers ran jobs; stopped in {res['stop'].seconds:.1f} s; "
                    f"other processes' load {res['other_load']:.2f} cores, steal {res['steal']:.2f}"
                )
            if floor:  # last in the round: the contenders' order stays what it was
                self.floor_round(floor, r, results[FLOOR_KEY])
        return results

    def floor_round(self, floor: FloorTest, r: int, into: list[dict]) -> None:
        say(f"throughput round {r}/{self.args.rounds}: {FLOOR_LABEL}, {self.args.jobs} jobs")
        res = self.attempt(f"throughput, {FLOOR_LABEL}, round {r}", lambda: floor.round(r))
        if res is None:
            return
        into.append(res)
        say(
            f"  {res['jobs_per_s']:.0f} jobs/s over {res['span']:.2f} s "
            f"(steady {res['steady_jobs_per_s']:.0f}); wall {res['wall']:.2f} s; "
            f"first job done {res['first_done_after'] * 1000:.0f} ms after launch; "
            f"CPU/job {res['cpu_workers'] * 1000:.2f} ms; {res['workers_used']} processes ran jobs; "
            f"stopped in {res['stop_seconds']:.2f} s; "
            f"other processes' load {res['other_load']:.2f} cores, steal {res['steal']:.2f}"
        )

    def round(self, c: Contender, round_no: int) -> dict:
        n = self.args.jobs
        self.noise.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        ids = enqueue(self.redis, n)
        pool = self.launcher.launch(c, f"throughput-{c.key}-{round_no}")
        # CPU snapshots at 10% and 90% of the jobs done: steady-state CPU per job, by role.
        marks = [max(1, n // 10), n - n // 10]
        snaps: list[tuple[int, float, float]] = []

        def snap(done: int) -> None:
            if len(snaps) < 2 and done >= marks[len(snaps)] and n >= 20:
                snaps.append((done, *pool.cpu_split()))

        try:
            wait_done(self.redis, pool, n, self.args.round_timeout, snap)
        finally:
            stop = self.launcher.stop(pool)
        starts, ends, by_worker = job_times(self.redis, ids, pool.log_path)
        first, last = min(starts), max(ends)
        ends.sort()
        steady = steady_rate(ends)
        cpu_sup = cpu_work = math.nan
        if len(snaps) == 2 and snaps[1][0] > snaps[0][0]:
            jobs = snaps[1][0] - snaps[0][0]
            cpu_sup = (snaps[1][1] - snaps[0][1]) / jobs
            cpu_work = (snaps[1][2] - snaps[0][2]) / jobs
        other_load = meter.stop()
        self.noise.check(other_load, meter.steal, f"throughput, {c.label}, round {round_no}")
        return {
            "other_load": other_load,
            "steal": meter.steal,
            "jobs_per_s": n / (last - first),
            "steady_jobs_per_s": steady,
            "cpu_supervisor": cpu_sup,
            "cpu_workers": cpu_work,
            "span": last - first,
            "wall": last - pool.launched_at,
            "first_job_after": first - pool.launched_at,
            "first_done_after": ends[0] - pool.launched_at,
            "workers_used": len(by_worker),
            "stop": stop,
        }
