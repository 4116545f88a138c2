"""No secret where a job's code can read it: the Redis password, however it is given (a flag,
HERDER_REDIS_URL, the config file), is in no herder process's environment, neither as Python
shows it to a job nor as /proc does, and no descriptor that carried the config stays open.
herder hands the config over on a descriptor read once (herder.common.handover)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue

from harness import is_template, plain_spawns, start_redis, wait_for

pytestmark = pytest.mark.slow

SECRET = "hunter2-env-s3cret"


@pytest.fixture
def password_redis(tmp_path: Path):
    proc, port = start_redis(tmp_path, "--requirepass", SECRET)
    yield port
    proc.terminate()
    proc.wait(10)


def config_descriptors(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "herder-config" in target:
            out.append(f"{fd} -> {target}")
    return out


@pytest.mark.parametrize("given", ["flag", "environment", "file"])
def test_no_herder_process_holds_the_redis_password_in_its_environment(
    herder, password_redis: int, tmp_path: Path, given: str
) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{password_redis}/0"
    if given == "flag":
        h = herder(redis_url=url, workers="2")
    elif given == "environment":
        h = herder(redis_url=None, env={"HERDER_REDIS_URL": url}, workers="2")
    else:
        path = tmp_path / "herder.toml"
        path.write_text(f'redis_url = "{url}"\n')
        path.chmod(0o600)
        h = herder(redis_url=None, config=str(path), workers="2")
    h.wait_workers(2)
    wait_for(h.scheduler, 20, what="RQ's scheduler")
    r = Redis.from_url(url)
    job = Queue(connection=r).enqueue("herder_testjobs.what_job_code_sees", "env")
    wait_for(lambda: job.get_status(refresh=True) == "finished", 20, what="the job on the password Redis")
    seen = job.return_value()
    # The job's own view: its environment as Python and /proc show it, and its descriptors.
    assert SECRET not in repr(seen["environ"]) and SECRET not in seen["proc_environ"]
    assert not {"HERDER_RESOLVED_CONFIG", "HERDER_CONFIG_FD", "HERDER_REDIS_URL"} & set(seen["environ"])
    assert not [t for t in seen["fds"].values() if "herder-config" in t], seen["fds"]
    assert seen["environ"].get("HERDER_SLOT") in ("0", "1")  # it is a worker's environment
    # Every herder process, as /proc shows it (a process that sets its title blanks this view:
    # the job's own view above covers the forked workers).
    processes = h.processes()
    kinds = {"watchdog": h.pid, "master": h.master().pid}
    assert kinds["master"] in {p.pid for p in processes}
    assert len(processes) >= 5 + (0 if plain_spawns() else 1), [p.cmdline() for p in processes]
    if not plain_spawns():
        assert [p for p in processes if is_template(p)], "no fork server among them"
    for p in processes:
        with open(f"/proc/{p.pid}/environ", "rb") as f:
            environ = f.read()
        assert SECRET.encode() not in environ, f"the password in {p.pid}'s environment: {p.cmdline()}"
        assert b"HERDER_RESOLVED_CONFIG" not in environ  # (HERDER_CONFIG_FD, a number, may stay)
        assert not config_descriptors(p.pid), (p.pid, p.cmdline(), config_descriptors(p.pid))
    # It ran the job on the Redis that needs the password: the config did reach every process.
    assert r.llen("finished:env") == 1
    h.stop_and_check()
    assert SECRET not in h.log()
