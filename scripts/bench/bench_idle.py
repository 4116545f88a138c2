"""The idle-pool scenario: start-up, memory and graceful stop of a pool with nothing to do.

Each run: launch the pool on an empty queue; time until all its workers are live children
of the master and registered in RQ; let it idle (--idle-settle); read every process's memory
(bench_memory.py); SIGTERM the pool's top process and time until it exits. For herder, its
log also gives how long each worker took from the master's `stop` to its exit. Contenders
take turns run by run.
"""

from __future__ import annotations

import time

from bench_base import BenchError, say
from bench_contenders import Contender, Scenario
from bench_cpu import CpuMeter
from bench_herderlog import read_log, stop_times
from bench_memory import pool_memory


class IdleTest(Scenario):
    def run(self) -> dict[str, list[dict]]:
        contenders = self.launcher.contenders
        results: dict[str, list[dict]] = {c.key: [] for c in contenders}
        for r in range(1, self.args.idle_runs + 1):
            for c in contenders:
                say(f"idle pool {r}/{self.args.idle_runs}: {c.label}")
                res = self.attempt(f"idle pool, {c.label}, run {r}", lambda c=c, r=r: self.run_one(c, r))
                if res is None:
                    continue
                results[c.key].append(res)
                mem = res["memory"]
                worker_stop = (
                    f"; each worker's stop (its log) {max(res['worker_stops']) * 1000:.0f} ms at most"
                    if res["worker_stops"]
                    else ""
                )
                say(
                    f"  all {self.args.workers} registered {res['ready'] * 1000:.0f} ms after launch; "
                    f"worker USS {mem['worker_uss']:.1f} MB, RSS {mem['worker_rss']:.1f} MB; "
                    f"supervisor RSS {mem['sup_rss']:.1f} MB; stopped in {res['stop'].seconds * 1000:.0f} ms"
                    f"{worker_stop}"
                )
        return results

    def run_one(self, c: Contender, run_no: int) -> dict:
        self.noise.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        pool = self.launcher.launch(c, f"idle-{c.key}-{run_no}")
        try:
            workers = pool.wait_ready(self.redis, timeout=60, interval=0.01)
            ready = time.monotonic() - pool.launched_mono
            time.sleep(self.args.idle_settle)
            workers = pool.workers(self.redis)
            if len(workers) < pool.size:
                raise BenchError(
                    f"only {len(workers)} of {pool.size} workers left while idle; see {pool.log_path}"
                )
            memory = pool_memory(pool.popen.pid, pool.master(), workers)
        finally:
            stop = self.launcher.stop(pool)
        other_load = meter.stop()
        self.noise.check(other_load, meter.steal, f"idle pool, {c.label}, run {run_no}")
        worker_stops = list(stop_times(read_log(pool.log_path)).values()) if c.is_herder else []
        return {
            "ready": ready,
            "memory": memory,
            "stop": stop,
            "worker_stops": worker_stops,
            "other_load": other_load,
            "steal": meter.steal,
        }
