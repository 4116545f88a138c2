"""Redis through Sentinel (`redis+sentinel://`, or SENTINEL in RQ's settings module) works
wherever a Redis URL does: the master's threads, the workers and the scheduler all find the
master through a real redis-sentinel, and a killed worker's job is recovered through it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis

from harness import free_port, run_jobs_killing_one_holder, start_redis, wait_for

pytestmark = pytest.mark.slow

HERDER = str(Path(sys.executable).with_name("herder"))


@pytest.fixture
def sentinel(tmp_path: Path):  # noqa: ANN201
    """(a redis-server, its port, a Sentinel's port that monitors it as `mymaster`)."""
    master, port = start_redis(tmp_path)
    sport = free_port()
    conf = tmp_path / "sentinel.conf"  # Sentinel rewrites its file: it must be its own
    conf.write_text(
        f"port {sport}\nbind 127.0.0.1\ndir {tmp_path}\nsentinel monitor mymaster 127.0.0.1 {port} 1\n"
    )
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", str(conf), "--sentinel"],
                            stdout=subprocess.DEVNULL)  # fmt: skip
    probe = Redis(port=sport)
    wait_for(lambda: _asks(probe), 10, what="the Sentinel to know the master")
    yield master, port, sport
    for p in (proc, master):
        p.terminate()
        p.wait(10)


def _asks(probe: Redis) -> bool:
    try:
        return probe.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster") is not None
    except Exception:
        return False


def test_herder_runs_and_recovers_jobs_through_sentinel(herder, sentinel) -> None:
    _, port, sport = sentinel
    conn = Redis(port=port)
    h = herder(redis_url=f"redis+sentinel://127.0.0.1:{sport}/mymaster/0", workers="2")
    h.wait_workers(2)
    status = run_jobs_killing_one_holder(h, conn, "sn")
    assert status["redis_url"].startswith("redis+sentinel://127.0.0.1:")
    h.stop_and_check()


def test_rq_settings_with_sentinel_become_a_sentinel_url_and_a_bad_one_exits_78(tmp_path: Path) -> None:
    (tmp_path / "sentinel_settings.py").write_text(
        'SENTINEL = {"INSTANCES": [("127.0.0.1", 26999)], "MASTER_NAME": "jobs", "DB": 3, "PASSWORD": "pw"}\n'
        'QUEUES = ["high", "low"]\n'
    )
    r = subprocess.run([HERDER, "config", "--rq-config", "sentinel_settings", "--path", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    assert "redis+sentinel://:***@127.0.0.1:26999/jobs/3" in rows["redis_url"] and ":pw@" not in r.stdout
    assert "high, low" in rows["queues"] and "rq settings module" in rows["queues"]
    argv = [
        HERDER,
        "run",
        "--state-dir",
        str(tmp_path / "s"),
        "--redis-url",
        "redis+sentinel://127.0.0.1:26999",
    ]
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 78 and "'redis_url'" in bad.stderr, bad.stderr
