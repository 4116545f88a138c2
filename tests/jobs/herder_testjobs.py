"""Jobs the tests enqueue. Each records its start and its finish in Redis lists
(started:<tag>, finished:<tag>), so a test can tell done-once from done-twice from lost."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from rq import get_current_job


def _mark(kind: str, tag: str) -> None:
    job = get_current_job()
    assert job is not None
    job.connection.rpush(f"{kind}:{tag}", job.id)


def record(tag: str, seconds: float = 0.0) -> str:
    _mark("started", tag)
    time.sleep(seconds)
    _mark("finished", tag)
    return tag


def record_through_outage(tag: str, seconds: float = 0.0) -> str:
    """record(), written as a job that must survive a Redis restart is: its own calls wait
    for Redis (up to 30 s) instead of failing the job on the first refusal."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    def mark(kind: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                return _mark(kind, tag)
            except (RedisConnectionError, RedisTimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    mark("started")
    time.sleep(seconds)
    mark("finished")
    return tag


def chatty(tag: str) -> str:
    """Prints to stdout, including lines that look like protocol lines."""
    _mark("started", tag)
    print("hello from a job")
    print("done not-a-job 1.0 ok")
    print("stop 1.0", flush=True)
    sys.stdout.write("x" * 10000 + "\n")
    os.write(1, b"ready 1 1.0\n")  # straight to fd 1, as a C extension would
    _mark("finished", tag)
    return tag


def hang(tag: str) -> None:
    """Never returns, and RQ's in-process timeout (SIGALRM) cannot stop it."""
    _mark("started", tag)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        time.sleep(1)


def exit_hard(tag: str) -> None:
    _mark("started", tag)
    os._exit(3)


def segfault(tag: str) -> None:
    _mark("started", tag)
    ctypes.string_at(0)


def flaky_connection(tag: str) -> str:
    """Fails while this worker's "connection" is broken (`broken:<pid>`) or the "database" is
    down (`db_down`): what a connection gone bad or a widespread fault looks like to a job."""
    job = get_current_job()
    assert job is not None
    conn = job.connection
    # A job of some length, as real ones are, and as long on every worker: healthy workers that
    # finish no-op jobs in one round trip each could otherwise drain the queue before the broken
    # one fails a few, and a broken one failing at once could spend every retry of a job.
    time.sleep(0.02)
    if conn.exists(f"broken:{os.getpid()}") or conn.exists("db_down"):
        conn.rpush(f"failed-on:{tag}", os.getpid())
        raise ConnectionError("the database connection is gone")
    _mark("finished", tag)
    return tag


def poison(tag: str) -> None:
    """Fails on any worker: its input is bad."""
    _mark("started", tag)
    raise ValueError("bad input")


_leaked: list[bytearray] = []


def leak(tag: str, megabytes: int, seconds: float = 0.0) -> str:
    """Keeps `megabytes` MB alive in this worker process after it returns (and takes `seconds`)."""
    time.sleep(seconds)
    block = bytearray(megabytes * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: it counts in RSS
    _leaked.append(block)
    _mark("finished", tag)
    return tag


def stamp(tag: str) -> float:
    """Records the wall-clock time it ran (in stamped:<tag>), for tests of scheduled jobs."""
    job = get_current_job()
    assert job is not None
    now = time.time()
    job.connection.rpush(f"stamped:{tag}", f"{job.id} {now:.3f}")
    return now


def fail_times(tag: str, n: int) -> str:
    """Fails its first `n` runs, then succeeds; each run is stamped (see `stamp`)."""
    job = get_current_job()
    assert job is not None
    stamp(tag)
    if job.connection.llen(f"stamped:{tag}") <= n:
        raise RuntimeError(f"failing on purpose ({tag})")
    return tag


def orphan_a_child(tag: str, seconds: float) -> str:
    """Leaves a grandchild behind, as a job that daemonises something does (`cmd &`)."""
    import subprocess

    _mark("started", tag)
    subprocess.run(["sh", "-c", f"sleep {seconds} &"], check=True)
    _mark("finished", tag)
    return tag


def spin(tag: str, seconds: float) -> str:
    """Runs Python for `seconds` (short sleeps): an async exception, as RQ's TimerDeathPenalty
    raises in a threaded worker's job, lands within one of them."""
    _mark("started", tag)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    _mark("finished", tag)
    return tag


def what_job_code_sees(tag: str) -> dict:
    """What a job (or an error reporter in it) can read of its process: its environment, as
    Python and /proc show it, and where each of its descriptors leads."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    with open("/proc/self/environ", "rb") as f:
        proc_environ = f.read().decode(errors="replace")
    _mark("finished", tag)
    return {"environ": dict(os.environ), "proc_environ": proc_environ, "fds": fds}


def burn(cpu_seconds: float) -> float:
    """Keeps its thread on the CPU for `cpu_seconds` of its own CPU time (a CPU-bound job: in a
    threaded worker it waits for the GIL too, and takes longer by the clock)."""
    end = time.thread_time() + cpu_seconds
    n = 0
    while time.thread_time() < end:
        n += sum(range(1000))
    return cpu_seconds
