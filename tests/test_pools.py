"""Several pools in one herder (docs/operations.md, "Pools"): a latency-sensitive pool that a
bulk flood never delays, each pool sized and restarted on its own, and bad pool files refused."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest
from rq import Queue
from rq.job import Job

from harness import HERDER, free_port, metrics, sample, wait_for
from herder.common.config import ConfigError, load_file, pool_configs, resolve
from herder.supervisor.policy.pool import share_limit
from herder.supervisor.views.prometheus import REQUEUE_REASONS

QUEUES = ("high", "bulk")
HIGH_AND_BULK = """
[herder]
scale_down_delay = 3
[pools.high]
queues = ["high"]
workers = 1
[pools.bulk]
queues = ["bulk"]
min_workers = 1
max_workers = 4
drain_target = 1
"""


def cli(h, *args: str) -> subprocess.CompletedProcess:  # noqa: ANN001 - harness.Herder
    argv = [HERDER, *args, "--state-dir", h.state_dir]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def pool_counts(st: dict) -> dict[str, tuple[int, int]]:
    """pool -> (desired, ready), from a status."""
    return {name: (p["desired"], p["ready"]) for name, p in st["pools"].items()}


def enqueue_on_both(
    conn,  # noqa: ANN001
    tag: str,
    seconds: float,
    each: int,
    func: str = "herder_testjobs.record",
) -> list[str]:
    """`each` jobs of `func` (herder_testjobs.record) on each pool's queue, in one round trip."""
    ids = []
    with conn.pipeline() as pipe:
        for q in QUEUES:
            queue = Queue(q, connection=conn)
            ids += [queue.enqueue(func, tag, seconds, pipeline=pipe).id for _ in range(each)]
        pipe.execute()
    return ids


def pids_of(st: dict, pool: str) -> set[int]:
    return {w["pid"] for w in st["workers"] if w["pool"] == pool}


@pytest.mark.slow
def test_a_bulk_flood_grows_its_pool_never_the_high_one_and_never_delays_a_high_job(herder, conn, tmp_path):
    conf = tmp_path / "herder.toml"
    conf.write_text(HIGH_AND_BULK)
    h = herder(config=str(conf))
    h.wait_status(lambda s: pool_counts(s) == {"high": (1, 1), "bulk": (1, 1)}, 20, what="1 high, 1 bulk")
    high_pids: set[int] = set()
    seen = threading.Event()
    stop = threading.Event()

    def watch_high() -> None:  # every pid the high pool ever had, and its size, while the flood runs
        while not stop.is_set():
            st = h.try_snapshot()
            if st and st["pools"]:
                high_pids.update(pids_of(st, "high"))
                assert st["pools"]["high"]["desired"] == 1
                seen.set()
            stop.wait(0.1)

    watcher = threading.Thread(target=watch_high, daemon=True)
    watcher.start()
    bulk = Queue("bulk", connection=conn)
    ids = [bulk.enqueue("herder_testjobs.record", "bulk", 0.03).id for _ in range(400)]
    h.wait_status(lambda s: s["pools"]["bulk"]["desired"] == 4, 20, what="the bulk pool at its max of 4")
    urgent = Queue("high", connection=conn).enqueue("herder_testjobs.record", "urgent")
    wait_for(
        lambda: Job.fetch(urgent.id, connection=conn).get_status() == "finished" or None,
        10,
        what="the high job",
    )
    job = Job.fetch(urgent.id, connection=conn)
    assert (job.started_at - job.enqueued_at).total_seconds() < 1.0  # no wait behind the flood
    wait_for(lambda: conn.llen("finished:bulk") >= 400 or None, 60, what="the flood drained")
    h.wait_status(lambda s: s["pools"]["bulk"]["desired"] == 1, 30, what="the bulk pool back to its minimum")
    stop.set()
    watcher.join(5)
    assert seen.is_set() and high_pids
    st = h.snapshot()  # each pool counts its own jobs (and /metrics labels them by pool)
    assert st["pools"]["bulk"]["jobs"]["ok"] >= 400 and st["pools"]["high"]["jobs"]["ok"] == 1
    bulk_workers = {Job.fetch(i, connection=conn).worker_name for i in ids}
    assert not {int(name.rsplit(".", 1)[1]) for name in bulk_workers if name} & high_pids  # never on high
    h.stop_and_check()


@pytest.mark.slow
def test_scale_restart_and_pause_name_a_pool_and_reload_drains_a_removed_one(herder, conn, tmp_path):
    conf = tmp_path / "herder.toml"
    conf.write_text(HIGH_AND_BULK)
    h = herder(config=str(conf))
    h.wait_status(lambda s: pool_counts(s) == {"high": (1, 1), "bulk": (1, 1)}, 20, what="both pools up")
    r = cli(h, "scale", "2")
    assert r.returncode != 0 and "high" in r.stderr and "bulk" in r.stderr  # which pool?
    r = cli(h, "scale", "2", "--pool", "nosuch")
    assert r.returncode != 0 and "no pool 'nosuch'" in r.stderr and "high, bulk" in r.stderr
    assert cli(h, "scale", "2", "--pool", "high").returncode == 0
    st = h.wait_status(lambda s: pool_counts(s)["high"] == (2, 2), 20, what="high at 2")
    assert pool_counts(st)["bulk"] == (1, 1)
    before = pids_of(st, "bulk")
    assert cli(h, "restart", "--pool", "high").returncode == 0
    st = h.wait_status(
        lambda s: s["pools"]["high"]["generation"] == 1 and pool_counts(s)["high"] == (2, 2), 20
    )
    assert pids_of(st, "bulk") == before  # the bulk pool was not restarted
    assert cli(h, "pause", "--pool", "bulk").returncode == 0
    st = h.wait_status(lambda s: s["pools"]["bulk"]["paused"], 10)
    assert not st["pools"]["high"]["paused"]
    assert cli(h, "resume", "--pool", "bulk").returncode == 0
    # A reload that removes the bulk pool drains it: its job finishes, nothing is lost.
    job = Queue("bulk", connection=conn).enqueue("herder_testjobs.record", "drained", 2.0)
    wait_for(lambda: conn.llen("started:drained") or None, 10, what="the bulk job running")
    conf.write_text("[pools.high]\nqueues = ['high']\nworkers = 2\n")
    h.signal(signal.SIGHUP)
    st = h.wait_status(lambda s: "bulk" not in s["pools"], 30, what="the bulk pool drained and gone")
    assert Job.fetch(job.id, connection=conn).get_status() == "finished"
    assert conn.lrange("finished:drained", 0, -1) == [job.id.encode()]  # ran once, to its end
    assert pool_counts(st) == {"high": (2, 2)}
    assert "pool bulk removed" in h.log()
    h.stop_and_check()


@pytest.mark.slow
def test_a_reload_that_adds_a_pool_or_changes_one_touches_only_that_pool(herder, conn, tmp_path):
    conf = tmp_path / "herder.toml"
    high = "[pools.high]\nqueues = ['high']\nworkers = 1\n"
    conf.write_text(high)
    h = herder(config=str(conf))
    st = h.wait_status(lambda s: pool_counts(s) == {"high": (1, 1)}, 20, what="the high pool up")
    high_pids = pids_of(st, "high")
    # Added: the bulk pool starts; the high pool's worker is the same process.
    conf.write_text(high + "[pools.bulk]\nqueues = ['bulk']\nworkers = 1\n")
    r = cli(h, "reload")
    assert r.returncode == 0 and "pool bulk added" in r.stdout, r.stdout + r.stderr
    st = h.wait_status(lambda s: pool_counts(s) == {"high": (1, 1), "bulk": (1, 1)}, 20, what="bulk up")
    assert pids_of(st, "high") == high_pids and st["pools"]["high"]["generation"] == 0
    bulk_pids = pids_of(st, "bulk")
    # Changed: a setting only new workers pick up rolls the bulk pool alone, after its job.
    job = Queue("bulk", connection=conn).enqueue("herder_testjobs.record", "rolled", 2.0)
    wait_for(lambda: conn.llen("started:rolled") or None, 10, what="the bulk job running")
    conf.write_text(high + "[pools.bulk]\nqueues = ['bulk']\nworkers = 1\nworker_ttl = 600\n")
    r = cli(h, "reload")
    assert r.returncode == 0 and "pool bulk changed (worker_ttl: rolled)" in r.stdout, r.stdout + r.stderr
    st = h.wait_status(
        lambda s: (
            s["pools"]["bulk"]["generation"] == 1
            and pool_counts(s)["bulk"] == (1, 1)
            and not pids_of(s, "bulk") & bulk_pids
        ),
        20,
        what="the bulk pool rolled",
    )
    assert Job.fetch(job.id, connection=conn).get_status() == "finished"
    assert conn.lrange("finished:rolled", 0, -1) == [job.id.encode()]  # ran once, never interrupted
    assert pids_of(st, "high") == high_pids and st["pools"]["high"]["generation"] == 0
    assert st["settings"]["pools"]["bulk"]["worker_ttl"] == 600
    h.stop_and_check()


@pytest.mark.slow
def test_a_kill_storm_across_both_pools_loses_no_job(herder, conn, tmp_path):
    import random
    import time

    conf = tmp_path / "herder.toml"
    conf.write_text(HIGH_AND_BULK.replace("max_workers = 4", "max_workers = 3") + "max_requeues = 20\n")
    port = free_port()
    h = herder(config=str(conf), http=str(port))
    h.wait_status(lambda s: pool_counts(s) == {"high": (1, 1), "bulk": (1, 1)}, 20, what="both pools up")
    ids = enqueue_on_both(conn, "storm", 0.05, 60)
    rng, killed = random.Random(7), 0
    while killed < 8 and conn.llen("finished:storm") < len(ids):
        time.sleep(rng.uniform(0.1, 0.4))  # random moments: mid-job, between jobs, just after a pop
        workers = h.workers()
        if workers:
            try:
                rng.choice(workers).send_signal(signal.SIGKILL)
                killed += 1
            except Exception:  # gone meanwhile
                pass
    ran = lambda: {x.decode() for x in conn.lrange("finished:storm", 0, -1)} >= set(ids) or None  # noqa: E731
    wait_for(ran, 60, what="every job of both pools")
    assert killed >= 3, f"the storm killed only {killed} workers before the jobs ran out"
    assert h.snapshot()["totals"]["failed_by_herder"] == 0  # requeued, never given up
    st = h.wait_status(
        lambda s: pool_counts(s) == {"high": (1, 1), "bulk": (s["pools"]["bulk"]["desired"],) * 2}, 20
    )
    # Each pool counts its own requeues (by the job's queue), and /metrics labels them by pool.
    # (a job can come back by its worker's death, or by the recovery sweep: every reason counts)
    by_pool = {name: sum(p["requeued_by"].values()) for name, p in st["pools"].items()}
    assert sum(by_pool.values()) == st["totals"]["requeued"]
    m = metrics(f"http://127.0.0.1:{port}")
    for name in QUEUES:
        served = [sample(m, "herder_requeues_total", reason=r, pool=name) for r in REQUEUE_REASONS]
        assert sum(x or 0 for x in served) == by_pool[name]
        assert sample(m, "herder_kills_total", reason="silent", pool=name) == 0  # SIGKILLs are not herder's
        assert sample(m, "herder_jobs_failed_by_herder_total", pool=name) == 0
    h.stop_and_check()


@pytest.mark.slow
def test_a_pool_with_its_own_imports_gets_its_own_fork_server(herder, conn, tmp_path):
    from harness import is_template

    conf = tmp_path / "herder.toml"
    conf.write_text(HIGH_AND_BULK + "preload = ['herder_testjobs']\n")  # the bulk pool's imports differ
    h = herder(config=str(conf))
    h.wait_status(lambda s: pool_counts(s) == {"high": (1, 1), "bulk": (1, 1)}, 20, what="both pools up")
    master = h.master()
    assert master is not None
    two = lambda: len([c for c in master.children() if is_template(c)]) == 2 or None  # noqa: E731
    wait_for(two, 20, what="2 fork servers, one per set of imports")
    Queue("bulk", connection=conn).enqueue("herder_testjobs.record", "preloaded")
    wait_for(lambda: conn.llen("finished:preloaded") or None, 10, what="a job of the preloading pool")
    h.stop_and_check()


# ---- the config, pure ------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> str:
    f = tmp_path / "pools.toml"
    f.write_text(text)
    return str(f)


def test_each_pool_is_a_whole_config_over_the_defaults(tmp_path):
    cfg, _ = resolve(
        [
            load_file(
                write(
                    tmp_path,
                    "[herder]\nmax_workers = 8\njob_timeout = 60\n" + HIGH_AND_BULK.split("[herder]")[1],
                )
            )
        ]
    )
    pools = pool_configs(cfg)
    assert list(pools) == ["high", "bulk"]
    assert (pools["high"].autoscale, pools["high"].workers, pools["high"].job_timeout) == (False, 1, 60)
    assert (pools["bulk"].floor, pools["bulk"].ceiling, pools["bulk"].queues) == (1, 4, ["bulk"])
    assert pool_configs(resolve([])[0]).keys() == {"default"}  # no pools: today's one fleet


@pytest.mark.parametrize(
    ("text", "key", "why"),
    [
        ("[pools.a]\nqueues = ['a']\nredis_url = 'redis://x'\n", "pools.a.redis_url", "not a pool setting"),
        ("[pools.a]\nqueues = ['x']\n[pools.b]\nqueues = ['x']\n", "pools.b.queues", "already pool 'a'"),
        ("[pools.a]\nqueues = ['a']\nworkers = 'many'\n", "pools.a.workers", "must be an integer"),
        (
            "[pools.a]\nqueues = ['a']\nworkers_limit = 40\n",
            "pools.a.workers_limit",
            "not a pool setting",
        ),
        (
            "[herder]\nworkers_limit = 4\n[pools.a]\nqueues = ['a']\nworkers = 3\n"
            "[pools.b]\nqueues = ['b']\nworkers = 2\n",
            "pools",
            "add up to 5",
        ),
        ("[pools.\"a-b\"]\nqueues = ['a']\n", "pools.a-b", "plain identifier"),
    ],
)
def test_a_bad_pool_names_the_pool_and_the_key(tmp_path, text, key, why):
    with pytest.raises(ConfigError) as err:
        resolve([load_file(write(tmp_path, text))])
    assert err.value.key == key and why in str(err.value), str(err.value)


@pytest.mark.slow
def test_a_bad_pool_file_exits_78_naming_pool_and_key(tmp_path):
    f = write(tmp_path, "[pools.high]\nqueues = ['high']\nmax_memory = -1\n")
    r = subprocess.run(
        [
            HERDER,
            "run",
            "--config",
            f,
            "--redis-url",
            "redis://127.0.0.1:1/0",
            "--state-dir",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 78 and "'pools.high.max_memory'" in r.stderr and "[pools.high]" in r.stderr


def test_the_workers_limit_is_shared_minimums_first_then_in_turn():
    assert share_limit([("high", 1, 1), ("bulk", 1, 16)], 8) == {"high": 1, "bulk": 7}
    assert share_limit([("a", 2, 10), ("b", 1, 10)], 8) == {"a": 5, "b": 3}  # neither starves
    assert share_limit([("a", 0, 0), ("b", 1, 3)], 8) == {"a": 0, "b": 3}  # room a pool does not want
    assert share_limit([("a", 3, 3), ("b", 2, 9)], 5) == {"a": 3, "b": 2}  # at the limit: minimums hold


@pytest.mark.slow
def test_two_hosts_share_a_pools_cluster_cap_and_not_the_other_pools(herder, conn, tmp_path):
    conf = tmp_path / "herder.toml"
    conf.write_text(HIGH_AND_BULK + "cluster_max_workers = 3\n")  # the bulk pool's, cluster-wide
    hosts = [herder(config=str(conf), host_id=f"host-{n}") for n in "ab"]
    wait_for(
        lambda: conn.zcard("herder:cluster:hosts:bulk") == 2, 20, what="both hosts in the bulk pool's cluster"
    )
    for h in hosts:
        h.wait_status(lambda s: pool_counts(s)["high"] == (1, 1), 20, what="each host's high worker ready")
    samples: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:  # (bulk workers on both hosts, high workers on both) every 50 ms
        while not stop.is_set():
            sts = [h.try_snapshot() for h in hosts]
            if all(st and st["pools"] for st in sts):
                samples.append(
                    tuple(sum(st["pools"][p]["actual"] for st in sts) for p in ("bulk", "high"))  # type: ignore[index]
                )
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        bulk = Queue("bulk", connection=conn)
        for _ in range(300):
            bulk.enqueue("herder_testjobs.record", "capped", 0.05)
        wait_for(lambda: samples and samples[-1][0] == 3 or None, 20, what="3 bulk workers across both hosts")
    finally:
        stop.set()
        sampler.join(5)
    assert max(b for b, _ in samples) <= 3, "the bulk pool ran past its cluster cap"
    assert {h for _, h in samples} == {2}  # each host's high pool kept its one worker throughout
    for h in hosts:
        h.stop_and_check()


@pytest.mark.slow
def test_redis_killed_and_restarted_under_two_pools_loses_no_job(herder, tmp_path):
    from redis import Redis

    from harness import redis_on, start_redis

    aof = ("--appendonly", "yes", "--appendfsync", "always")
    proc, port = start_redis(tmp_path, *aof)
    url = f"redis://127.0.0.1:{port}/0"
    conn = Redis.from_url(url)
    try:
        conf = tmp_path / "herder.toml"
        conf.write_text(HIGH_AND_BULK.replace("max_requeues", "") + "max_requeues = 10\n")
        h = herder(redis_url=url, config=str(conf), health_grace="1")
        h.wait_status(lambda s: pool_counts(s) == {"high": (1, 1), "bulk": (1, 1)}, 20, what="both pools up")
        # The jobs' own Redis calls wait out the restart, as such jobs are written: herder's part
        # is that none is lost, run twice or given up (record's first refused call failed it).
        ids = enqueue_on_both(conn, "aof", 0.02, 150, func="herder_testjobs.record_through_outage")
        wait_for(lambda: conn.llen("finished:aof") >= 30, 20, what="the load under way")
        proc.kill()  # kill -9, mid-load
        proc.wait(5)
        h.wait_status(lambda s: "redis unreachable" in s["health"], 10, what="herder to see Redis gone")
        proc = redis_on(port, tmp_path, *aof)  # back from its append-only file
        wait_for(
            lambda: set(x.decode() for x in conn.lrange("finished:aof", 0, -1)) >= set(ids),
            60,
            what="every job",
        )
        st = h.wait_status(lambda s: pool_counts(s)["high"] == (1, 1), 20, what="the high pool whole again")
        assert st["totals"]["failed_by_herder"] == 0  # every job requeued and run, none given up
        h.stop_and_check()
    finally:
        proc.kill()
        proc.wait(5)
