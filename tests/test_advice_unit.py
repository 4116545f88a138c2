"""The advisor (herder.supervisor.views.advice) on synthetic histories: pure and fast. Each
workload gets its advice, a steady one none, and too little data says nothing."""

from __future__ import annotations

import random

from herder.supervisor.views.advice import (
    MIB,
    Confidence,
    Evidence,
    JobSample,
    PoolSample,
    RssSample,
    Settings,
    actionable,
    advise,
    rss_slope,
)


def jobs(n: int, busy: float, cpu: float | None, every: float = 1.0) -> list[JobSample]:
    return [JobSample(i * every, busy, cpu) for i in range(n)]


def rss(
    workers: int, per_worker: int, base: int, per_job: float, noise: int = 0, seed: int = 1
) -> list[RssSample]:
    """Each worker's RSS after each of its jobs: `base`, growing `per_job` bytes a job, with
    allocator noise of up to `noise` bytes either way."""
    rnd = random.Random(seed)
    out = []
    for j in range(1, per_worker + 1):
        for w in range(workers):
            size = base + w * MIB + per_job * j + rnd.randint(-noise, noise)
            out.append(RssSample(float(j), 1000 + w, j, int(size)))
    return out


def samples(n: int, running: int, busy: int, target: int | None = None, **kw) -> list[PoolSample]:
    fields = dict(oldest_age=0.0, backlog=0, demand=running) | kw
    return [
        PoolSample(float(i), running, busy, busy, running if target is None else target, **fields)
        for i in range(n)
    ]


def steady(**kw) -> Evidence:
    """Four workers busy half the time on jobs half on the CPU, no growth, nobody waiting."""
    s = Settings(threads=1, floor=4, ceiling=4, autoscale=False)
    return Evidence(
        "steady",
        s,
        jobs=jobs(200, 0.2, 0.1, every=0.5),
        rss=rss(4, 50, 40 * MIB, 0, noise=200_000),
        samples=samples(100, 4, 2),
        **kw,
    )


def reasons(ev: Evidence) -> list[str]:
    return [a.reason for a in actionable(advise(ev))]


def test_a_steady_pool_needs_nothing() -> None:
    found = advise(steady())
    assert not actionable(found), found
    # But it says what it did look at: no leak over the jobs it saw.
    (leak,) = [a for a in found if a.kind == "recycling"]
    assert (
        leak.reason == "no_leak" and leak.confidence.jobs == 192 and "no leak seen over 192 jobs" in leak.text
    )


def test_too_little_data_says_nothing() -> None:
    few = Evidence(
        "io",
        Settings(threads=1, floor=1, ceiling=8),
        jobs=jobs(10, 1.0, 0.001),
        rss=rss(1, 10, 40 * MIB, MIB),
        samples=samples(10, 8, 8, oldest_age=60.0, backlog=500),
    )
    assert advise(few) == ()
    # Enough jobs, but all within a few seconds: still too little time.
    quick = Evidence("io", Settings(threads=1, floor=1, ceiling=8), jobs=jobs(100, 1.0, 0.001, every=0.1))
    assert advise(quick) == ()


def test_jobs_off_the_cpu_get_threads_at_a_share_of_the_memory() -> None:
    ev = Evidence(
        "io",
        Settings(threads=1, floor=2, ceiling=8, autoscale=True),
        jobs=jobs(100, 1.0, 0.01),  # 1% on the CPU
        rss=rss(8, 10, 60 * MIB, 0),
        samples=samples(100, 8, 8),
    )
    (a,) = actionable(advise(ev))
    assert (a.kind, a.reason) == ("threads", "off_cpu")
    # As many threads as its 8 job slots: one process for eight.
    assert a.change == {"threads": 8, "max_workers": 1, "min_workers": 1}
    assert a.figures["memory_pct"] < 30
    assert a.confidence == Confidence(100, 1.6)
    assert "1% of their busy time on the CPU" in a.text and "% of their RSS" in a.text
    # Half on the CPU: processes are right.
    half = Evidence("cpu", ev.settings, jobs=jobs(100, 1.0, 0.5), samples=ev.samples)
    assert reasons(half) == []
    # A fifth on the CPU, but most of the rest waiting for a CPU on a crowded host: CPU-bound.
    crowded = [JobSample(j.at, 1.0, 0.2, runq=0.7) for j in jobs(100, 1.0, 0.2)]
    assert reasons(Evidence("cpu", ev.settings, jobs=crowded, samples=ev.samples)) == []
    # One job slot: nothing for threads to share.
    one = Evidence("io", Settings(threads=1, floor=1, ceiling=1), jobs=ev.jobs, samples=ev.samples)
    assert reasons(one) == []


def test_cpu_bound_jobs_in_threads_get_processes() -> None:
    # Four threads at once, each job on the CPU a quarter of its time: the GIL's one core, full.
    ev = Evidence(
        "cpu",
        Settings(threads=4, floor=1, ceiling=2, autoscale=True),
        jobs=jobs(100, 1.0, 0.24),
        samples=[PoolSample(float(i), 2, 2, 8, 2, 0.0, 0, 2) for i in range(100)],
    )
    (a,) = actionable(advise(ev))
    assert (a.kind, a.reason) == ("threads", "cpu_bound_threads")
    assert a.change == {"threads": 1, "max_workers": 8, "min_workers": 4}
    # The same share of the CPU with one thread at a time is I/O, not the GIL.
    alone = Evidence("cpu", ev.settings, jobs=ev.jobs, samples=samples(100, 2, 2))
    assert "cpu_bound_threads" not in reasons(alone)


def test_a_leak_of_1_mib_a_job_gets_max_jobs() -> None:
    ev = Evidence(
        "leak",
        Settings(threads=1, floor=2, ceiling=2),
        jobs=jobs(100, 0.1, 0.05),
        rss=rss(2, 50, 40 * MIB, MIB, noise=300_000),
    )
    (a,) = [a for a in advise(ev) if a.kind == "recycling"]
    assert a.reason == "rss_growth"
    slope = a.figures["per_job"] / MIB
    assert 0.95 < slope < 1.05
    # 64 MiB of growth allowed over its baseline: about 64 jobs.
    assert 60 <= a.change["max_jobs"] <= 66, a.change
    assert "max_jobs = " in a.text and "MiB a job" in a.text
    # A max_jobs that already keeps it under the bound: nothing to say.
    bounded = Evidence("leak", Settings(max_jobs=50), jobs=ev.jobs, rss=ev.rss)
    assert not [a for a in advise(bounded) if a.kind == "recycling"]
    # A max_memory states the size: max_jobs recycles before it.
    capped = Evidence("leak", Settings(max_memory=80), jobs=ev.jobs, rss=ev.rss)
    (c,) = [a for a in advise(capped) if a.kind == "recycling"]
    assert 35 <= c.change["max_jobs"] <= 42, c.change


def test_noise_is_not_a_leak() -> None:
    # 4 MiB of allocator noise either way, no trend: no leak, whatever the seed.
    for seed in range(20):
        ev = Evidence("n", Settings(), rss=rss(3, 40, 50 * MIB, 0, noise=4 * MIB, seed=seed))
        slope = rss_slope(ev.rss)
        assert slope is not None
        (a,) = advise(ev)
        assert a.reason == "no_leak", (seed, slope)
    # A first job that imports its code is warm-up, not a leak.
    warm = [RssSample(float(j), 1, j, 40 * MIB + (30 * MIB if j >= 1 else 0)) for j in range(0, 60)]
    assert advise(Evidence("w", Settings(), rss=warm))[0].reason == "no_leak"


def test_a_pool_held_at_max_while_jobs_waited_gets_a_higher_max() -> None:
    held = samples(60, 4, 4, oldest_age=20.0, backlog=40, demand=4)
    ev = Evidence(
        "burst",
        Settings(threads=1, floor=1, ceiling=4, autoscale=True, max_wait=5.0, cap=64),
        jobs=jobs(100, 0.5, 0.01, every=0.6),
        samples=samples(60, 1, 0) + [PoolSample(p.at + 60, *list(p.__getattribute__(f) for f in (
            "running", "busy", "jobs_running", "target", "oldest_age", "backlog", "demand"))) for p in held],
    )  # fmt: skip
    a = next(a for a in advise(ev) if a.reason == "held_at_max")
    # 40 waiting jobs of 0.5 s within 5 s: 4 more workers.
    assert a.change == {"max_workers": 8} and a.figures["share"] == 0.5
    assert "held at its max of 4 for 50%" in a.text
    # Within the cluster cap.
    capped = Evidence("burst", Settings(ceiling=4, max_wait=5.0, cap=6), jobs=ev.jobs, samples=ev.samples)
    assert next(a for a in advise(capped) if a.reason == "held_at_max").change == {"max_workers": 6}
    # At the cap already: it says so, and changes nothing of the pool's.
    stuck = Evidence("burst", Settings(ceiling=4, max_wait=5.0, cap=4), jobs=ev.jobs, samples=ev.samples)
    at_cap = next(a for a in advise(stuck) if a.reason == "held_at_max")
    assert at_cap.change == {} and "cap" in at_cap.text
    # Held at max but nobody waited past the target: nothing to raise.
    quiet = Evidence("burst", ev.settings, jobs=ev.jobs, samples=samples(120, 4, 4, oldest_age=1.0))
    assert "held_at_max" not in reasons(quiet)


def test_a_min_that_sat_idle_is_lowered_and_only_after_ten_minutes() -> None:
    s = Settings(threads=1, floor=6, ceiling=10, autoscale=True)
    long = Evidence("idle", s, jobs=jobs(60, 0.1, 0.05, every=11), samples=samples(700, 6, 1))
    (a,) = actionable(advise(long))
    assert (a.reason, a.change) == ("idle_min", {"min_workers": 2})
    short = Evidence("idle", s, jobs=long.jobs, samples=samples(300, 6, 1))
    assert "idle_min" not in reasons(short)


def test_a_scale_down_undone_again_and_again_gets_a_longer_delay() -> None:
    s = Settings(threads=1, floor=1, ceiling=10, autoscale=True, scale_down_delay=30.0)
    targets = []
    for _ in range(6):  # each minute: down to 2 for 20 s, then back to 6
        targets += [6] * 40 + [2] * 20
    # Each time the need comes back, the oldest job has waited 12 s (past the 10 s target
    # a pool without max_wait is judged by) until the workers are back.
    late = {i for i, t in enumerate(targets) if t == 6 and i % 60 < 3}
    flap = [PoolSample(float(i), t, 1, 1, t, 12.0 if i in late else 0.0, 0, t) for i, t in enumerate(targets)]
    (a,) = actionable(advise(Evidence("flap", s, samples=flap)))
    assert a.reason == "flapping" and a.change == {"scale_down_delay": 50}
    assert a.figures["flaps"] == 5 and "waiting past 10 s" in a.text
    # The same ups and downs with no job late for them: a start from the warm template undid
    # each down at no wait, which a short delay is for.
    cheap = [PoolSample(float(i), t, 1, 1, t, 0.5, 0, t) for i, t in enumerate(targets)]
    assert reasons(Evidence("flap", s, samples=cheap)) == []
    # Downs that stay down are a load that went away: nothing to say.
    calm = [
        PoolSample(float(i), 6 if i < 200 else 2, 1, 1, 6 if i < 200 else 2, 0.0, 0, 2) for i in range(400)
    ]
    assert reasons(Evidence("calm", s, samples=calm)) == []


def test_advice_as_json_names_its_confidence() -> None:
    ev = Evidence(
        "io",
        Settings(ceiling=2),
        jobs=jobs(40, 1.0, 0.0),
        rss=rss(2, 20, 40 * MIB, 0),
        samples=samples(40, 2, 2),
    )
    out = advise(ev)[0].to_json()
    assert out["pool"] == "io" and out["kind"] == "threads" and out["reason"] == "off_cpu"
    assert out["confidence"] == {"jobs": 40, "minutes": 0.7}
    assert out["change"] == {"threads": 2, "max_workers": 1, "min_workers": 1}


# ---- the master's side: what its workers say, recorded, advised, shown -------------------


class FixedUsage:
    """Each worker's RSS: 40 MiB and `grows` bytes more per job it finished."""

    def __init__(self, jobs_of: dict[int, int], grows: int = 0) -> None:
        self.jobs_of, self.grows = jobs_of, grows

    def rss(self, pids) -> dict[int, int | None]:  # noqa: ANN001
        return {pid: 40 * MIB + self.grows * self.jobs_of.get(pid, 0) for pid in pids}


def test_the_master_records_its_workers_jobs_and_status_shows_the_advice() -> None:
    """Two workers say `busy` and `done` with their CPU seconds (protocol version 10), as the
    stdout reader records them; after a minute of jobs mostly off the CPU, growing 1 MiB each,
    the snapshot `herder status` renders advises threads and a max_jobs."""
    from collections import deque

    from fakes import FakeClock, all_ready, live, make
    from herder.common.worker_protocol import busy_line, done_line, parse_line
    from herder.supervisor.children.observations import record
    from herder.supervisor.views.status import build_status

    clock = FakeClock()
    m, _, _ = make(clock, workers=2)
    m.step()
    all_ready(m)
    procs = live(m)
    finished: dict[int, deque] = {}
    for proc in procs.values():
        finished[proc.pid] = deque()
        proc.take_finished = lambda q=finished[proc.pid]: [q.popleft() for _ in range(len(q))]
    jobs_of: dict[int, int] = {}
    m.views.snapshots.evidence.usage = FixedUsage(jobs_of, grows=MIB)

    def say(proc, line: bytes) -> None:  # noqa: ANN001
        record(proc.obs, finished[proc.pid], parse_line(line[:-1]), clock.t)

    assert build_status(m.take_snapshot())["advice"] == []
    for n in range(60):  # a job a second each: 0.9 s busy, 0.01 s of it on the CPU
        for proc in procs.values():
            say(proc, busy_line(f"j{proc.pid}-{n}", clock.wall(), 30, "default", "app.fetch"))
        clock.advance(0.9)
        m.step()
        for proc in procs.values():
            say(proc, done_line(f"j{proc.pid}-{n}", clock.wall(), True, 0.01, 0.0))
            jobs_of[proc.pid] = n + 1
        clock.advance(0.1)
        m.step()
    clock.advance(5)  # the advice is worked out anew every 5 s
    advice = build_status(m.take_snapshot())["advice"]
    got = {(a["kind"], a["reason"]): a for a in advice}
    assert set(got) == {("threads", "off_cpu"), ("recycling", "rss_growth")}, advice
    threads = got[("threads", "off_cpu")]
    assert threads["change"] == {"threads": 2, "workers": 1} and threads["figures"]["cpu_share"] == 0.011
    assert threads["confidence"]["jobs"] == 120
    leak = got[("recycling", "rss_growth")]
    assert leak["figures"]["per_job"] == MIB and leak["change"] == {"max_jobs": 64}, leak
    # A change of the pool's settings (here `herder scale`): what was seen before says nothing
    # of the new ones, and the advice starts afresh.
    m.pools["default"].scale({"workers": 3})
    clock.advance(5)
    m.step()
    assert build_status(m.take_snapshot())["advice"] == []


def test_the_evidences_rss_reading_leaves_the_status_samplers_processes_alone() -> None:
    """The advice reads a batch of workers' RSS every 2 s; status samples every worker's RSS and
    CPU once a second, its CPU percent measured since the last sampling. A batch read through
    the status sampler would drop every other worker's kept process (and start its CPU afresh)."""
    import os
    import subprocess
    import sys

    from herder.supervisor.views.usage import Usage

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        t = [0.0]
        usage = Usage(lambda: t[0])
        pids = [os.getpid(), *(c.pid for c in children)]
        assert all(rss for rss, _ in usage.of(pids).values())
        kept = dict(usage._processes)
        t[0] += 5
        rss = usage.rss(pids[:1])
        assert rss[os.getpid()] and rss[os.getpid()] > 10 * MIB
        assert usage._processes == kept  # the same Process objects, every worker's
        assert usage.rss([children[0].pid + 10**7]) == {children[0].pid + 10**7: None}
    finally:
        for c in children:
            c.kill()
            c.wait()
