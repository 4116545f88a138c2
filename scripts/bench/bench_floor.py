"""The floor: the least a reliable Redis queue must do per job, timed like the throughput scenario.

`--workers` processes (this file run as a script by the bench's own Python, no shell), each
looping: LMOVE a job id from the head of the queue to the tail of its own processing list
(BLMOVE, blocking up to BLOCK s, when the queue is empty), call a no-op, then in one
MULTI/EXEC: SET the job's result key with an expiry (RESULT_TTL, RQ's default result_ttl)
and LREM the id from its processing list. That is all: no job hashes, registries,
heartbeats, logs or supervisor. Less would not be reliable (a job taken by a process that
dies stays in its processing list, so it is never lost) or would not keep a result.

Each round: flush the DB; RPUSH `--jobs` plain ids (uuid4 hex, as RQ's job ids) onto the
queue; start the processes; poll the lists (jobs done = jobs - queued - in processing lists)
until every job is done; SIGTERM the processes, which finish the job in hand and, on their
way out, write into one Redis hash when they took their first job and when they finished
each of their jobs (kept in memory until then). jobs/s = jobs / (last job done - first job
taken), as bench_throughput.py does with RQ's `started_at` and `ended_at`, so start-up does
not count. Also as there: wall (launch to the last job done), launch -> first job done,
steady jobs/s (10% to 90% done), and CPU per job (the processes', psutil, between 10% and
90% done). At the end every job must have its result key, and the processes' job counts
must add up. It runs in every throughput round after the contenders, unless --skip-floor.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from array import array
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from redis import Redis

from bench_base import REPO, BenchError, steady_rate
from bench_cpu import CpuMeter
from bench_procs import child_env

if TYPE_CHECKING:
    from bench_contenders import Scenario

FLOOR_KEY = "floor"  # its key in the throughput results, beside the contenders' keys
FLOOR_LABEL = "the floor: a bare Redis queue loop (bench_floor.py)"
QUEUE_KEY = b"floor:queue"
TIMES_KEY = b"floor:times"
RESULT_PREFIX = b"floor:result:"
RESULT_TTL = 500  # seconds: RQ's default result_ttl
RESULT = b"\x80\x05N."  # pickle.dumps(None): the no-op's result, as RQ would store it
BLOCK = 0.1  # seconds a BLMOVE on the empty queue blocks, so a SIGTERM is seen soon
SCRIPT = Path(__file__).resolve()


def processing_key(index: int) -> bytes:
    return b"floor:processing:%d" % index


def noop() -> None:
    return None


def work(url: str, index: int) -> int:
    """One floor process: take, run, finish, until SIGTERM; then record its times and exit."""
    stopping = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True  # no exception: a blocking read resumes, and the job in hand is finished

    signal.signal(signal.SIGTERM, on_term)
    conn = Redis.from_url(url)
    mine = processing_key(index)
    finish = conn.pipeline(transaction=True)  # MULTI/EXEC, reused: execute() resets it
    first_take = math.nan
    ends = array("d")
    while not stopping:
        job = conn.lmove(QUEUE_KEY, mine, "LEFT", "RIGHT")
        if job is None:
            job = conn.blmove(QUEUE_KEY, mine, BLOCK, "LEFT", "RIGHT")
            if job is None:
                continue
        if not ends:
            first_take = time.time()
        noop()
        finish.set(RESULT_PREFIX + job, RESULT, ex=RESULT_TTL)
        finish.lrem(mine, 1, job)
        finish.execute()
        ends.append(time.time())
    if ends:
        conn.hset(TIMES_KEY, mapping={f"{index}:first": repr(first_take), f"{index}:ends": ends.tobytes()})
    return 0


def argv(url: str, index: int) -> list[str]:
    return [sys.executable, str(SCRIPT), "work", url, str(index)]


def command(url: str) -> str:
    """The floor's command line, for the report: I is the process's index (paths inside the
    repository made relative)."""
    return shlex.join(argv(url, 0)[:-1]).replace(url, "URL").replace(str(REPO) + "/", "") + " I"


class FloorTest:
    """The floor's turn in a throughput round."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario

    def round(self, round_no: int) -> dict:
        args, conn, launcher = self.s.args, self.s.redis, self.s.launcher
        n, workers = args.jobs, args.workers
        self.s.noise.wait_quiet()
        meter = CpuMeter()
        conn.flushdb()
        ids = [uuid.uuid4().hex.encode() for _ in range(n)]
        for i in range(0, n, 1000):
            conn.rpush(QUEUE_KEY, *ids[i : i + 1000])
        log_path = launcher.tmp / f"throughput-{FLOOR_KEY}-{round_no}.log"
        with open(log_path, "ab") as f:
            f.write(f"$ {shlex.join(argv(launcher.server.url, 0))} (and so on, {workers} in all)\n".encode())
        launched_at = time.time()
        popens = [
            launcher.procs.start(argv(launcher.server.url, i), log_path, child_env()) for i in range(workers)
        ]
        procs: list[psutil.Process] = []
        for p in popens:
            with contextlib.suppress(psutil.Error):  # one that is gone already: wait_done says so
                procs.append(psutil.Process(p.pid))
        try:
            snaps = self.wait_done(conn, n, workers, popens, procs, log_path)
        finally:
            t0 = time.monotonic()
            for p in popens:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            codes = []
            for p in popens:
                try:
                    codes.append(p.wait(timeout=args.stop_timeout))
                except subprocess.TimeoutExpired:
                    codes.append(None)
            t_stop = time.monotonic() - t0
            launcher.procs.kill_all(spare={launcher.server.pid})  # anything left, as Launcher.stop does
        # -SIGTERM: a process still starting (its handler not yet set), so it never took a job.
        if any(code not in (0, -signal.SIGTERM) for code in codes):
            raise BenchError(f"exit codes on SIGTERM {codes} (None: still running, killed); see {log_path}")
        firsts, ends = self.times(conn, workers)
        if len(ends) != n:
            raise BenchError(f"the processes recorded {len(ends)} jobs done of {n}; see {log_path}")
        with_result = sum(
            conn.exists(*[RESULT_PREFIX + j for j in ids[i : i + 1000]]) for i in range(0, n, 1000)
        )
        if with_result != n:
            raise BenchError(f"{n - with_result} of {n} jobs have no result key; see {log_path}")
        first, last = min(firsts), max(ends)
        cpu_work = math.nan
        if len(snaps) == 2 and snaps[1][0] > snaps[0][0]:
            cpu_work = (snaps[1][1] - snaps[0][1]) / (snaps[1][0] - snaps[0][0])
        other_load = meter.stop()
        self.s.noise.check(other_load, meter.steal, f"throughput, {FLOOR_LABEL}, round {round_no}")
        return {
            "other_load": other_load,
            "steal": meter.steal,
            "jobs_per_s": n / (last - first),
            "steady_jobs_per_s": steady_rate(ends),
            "cpu_supervisor": math.nan,  # there is none
            "cpu_workers": cpu_work,
            "span": last - first,
            "wall": last - launched_at,
            "first_job_after": first - launched_at,
            "first_done_after": ends[0] - launched_at,
            "workers_used": len(firsts),
            "stop_seconds": t_stop,
        }

    def wait_done(
        self,
        conn: Redis,
        n: int,
        workers: int,
        popens: list[subprocess.Popen[bytes]],
        procs: list[psutil.Process],
        log_path: Path,
    ) -> list[tuple[int, float]]:
        """Poll the queue and the processing lists until every job is done; the processes'
        CPU seconds at 10% and 90% of the jobs done, as (done, seconds)."""
        marks = [max(1, n // 10), n - n // 10]
        snaps: list[tuple[int, float]] = []
        deadline = time.monotonic() + self.s.args.round_timeout
        keys = [QUEUE_KEY, *(processing_key(i) for i in range(workers))]
        while True:
            with conn.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.llen(k)
                done = n - sum(pipe.execute())
            if len(snaps) < 2 and done >= marks[len(snaps)] and n >= 20:
                snaps.append((done, cpu_seconds(procs)))
            if done >= n:
                return snaps
            for p in popens:
                if p.poll() is not None:
                    raise BenchError(
                        f"a floor process exited ({p.returncode}) after {done} of {n} jobs; see {log_path}"
                    )
            if time.monotonic() > deadline:
                raise BenchError(f"only {done} of {n} jobs done after {self.s.args.round_timeout:g} s")
            time.sleep(0.01)

    @staticmethod
    def times(conn: Redis, workers: int) -> tuple[list[float], list[float]]:
        """Each process's first take, and every job's end (sorted), from the hash they wrote."""
        raw = conn.hgetall(TIMES_KEY)
        firsts, ends = [], array("d")
        for i in range(workers):
            if f"{i}:ends".encode() in raw:
                firsts.append(float(raw[f"{i}:first".encode()]))
                ends.frombytes(raw[f"{i}:ends".encode()])
        return firsts, sorted(ends)


def cpu_seconds(procs: list[psutil.Process]) -> float:
    used = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            used += t.user + t.system
    return used


if __name__ == "__main__":  # bench_floor.py work URL INDEX: one floor process
    if sys.argv[1:2] != ["work"] or len(sys.argv) != 4:
        sys.exit(
            f"usage: {os.path.basename(sys.argv[0])} work REDIS_URL INDEX (started by scripts/bench/run)"
        )
    sys.exit(work(sys.argv[2], int(sys.argv[3])))
