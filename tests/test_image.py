"""herder's image built and run by a real container runtime (podman; tests/podman.py), as a
user runs it: `podman build` of deploy/container/Dockerfile, then a container of 1 CPU and
384 MiB on a read-only root, with the image's own herder.toml, the test jobs as the job code
and a redis-server on the host.

It skips, saying why, where no container can run; with HERDER_REQUIRE_CONTAINER=1 (.ci/run,
which runs it as a step of its own: `-m container`) that is a failure instead, so CI never
passes by skipping it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest
from redis import Redis

from harness import SECRET_PLACEHOLDER, JobsHelper, free_port, http_status, image_uid, reap_adopted, wait_for
from podman import REPO, Podman, redis_image

pytestmark = [pytest.mark.slow, pytest.mark.container]

# slirp4netns' address for the host's loopback, with allow_host_loopback: the container
# reaches the test's redis-server, which listens on 127.0.0.1 only.
HOST_LOOPBACK = "10.0.2.2"
CPUS, MEMORY = "1", "384m"
# The workers limit herder must read from those cgroup limits: min(16 x 1 CPU, 384 MiB / 64 MiB).
LIMIT = 6


class Container:
    """One running container of the image, driven as an operator drives it."""

    def __init__(self, podman: Podman, name: str) -> None:
        self.podman, self.name = podman, name

    def exec(self, *argv: str) -> str:
        return self.podman.run("exec", self.name, *argv, timeout=60).stdout

    def status(self) -> dict[str, Any] | None:
        r = self.podman.run("exec", self.name, "herder", "status", "--json", check=False, timeout=60)
        return json.loads(r.stdout) if r.stdout.strip() else None

    def wait_running(self, timeout: float = 90) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            st = self.status()
            return st if st and st.get("running") and st["actual"] == st["desired"] else None

        try:
            return wait_for(running, timeout, 0.5, what=f"{self.name}: herder running, all workers up")  # type: ignore[return-value]
        except AssertionError as exc:
            logs = "\n".join(self.logs()[-40:])
            raise AssertionError(f"{exc}; container {self.state('Status')}, its log ends:\n{logs}") from None

    def logs(self) -> list[str]:
        r = self.podman.run("logs", self.name, check=False, timeout=60)
        return [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]

    def state(self, key: str) -> str:
        return self.podman.run("inspect", self.name, "--format", f"{{{{.State.{key}}}}}").stdout.strip()

    def processes(self) -> list[psutil.Process]:
        """Every process in the container, as the host sees it (podman top's host pids)."""
        out = self.podman.run("top", self.name, "hpid").stdout.split()[1:]
        return [psutil.Process(int(pid)) for pid in out]


def worker_pid(conn: Redis, job_id: str) -> int:
    """The pid (in the container's namespace) of the worker that took a job, from RQ's record."""
    from rq.job import Job

    def pid() -> int | None:
        name = Job.fetch(job_id, connection=conn).worker_name
        return int(name.rsplit(".", 1)[1]) if name else None

    return wait_for(pid, 30, what=f"a worker to take job {job_id}")  # type: ignore[return-value]


def test_the_image_runs_herder_within_its_cgroup_limits_and_drains_on_stop(
    image: tuple[Podman, str], redis_url: str, conn: Redis
) -> None:
    podman, tag = image
    jobs = JobsHelper(conn)
    # What the image is: the entrypoint, its user, the drain's signal.
    inspected = json.loads(podman.run("image", "inspect", tag).stdout)[0]
    cfg = inspected["Config"]
    assert cfg["Entrypoint"] == ["herder", "run"]
    assert cfg["User"].split(":")[0] == str(image_uid())
    assert cfg.get("StopSignal", "SIGTERM") == "SIGTERM"
    healthcheck = cfg.get("Healthcheck") or inspected["Healthcheck"]  # docker: in Config; podman: beside it
    assert healthcheck["Test"] == ["CMD", "herder", "status"]
    # Its own config passes herder's check, run as its user on a read-only root.
    r = podman.run("run", "--rm", "--read-only", "--network", "none", *podman.ulimits(),
                   "-e", f"HERDER_REDIS_URL={SECRET_PLACEHOLDER}", "--entrypoint", "herder",
                   tag, "config", "--config", "/etc/herder/herder.toml")  # fmt: skip
    assert re.search(r"^state_dir\s+/var/lib/herder/state\s", r.stdout, re.M), r.stdout

    # Run as docs/deploy/containers.md runs it: the image's own herder.toml, the Redis URL from the
    # environment, JSON logs; the test's jobs as the job code (a user's image has its own at /srv/app).
    url = urlsplit(redis_url)
    in_container = urlunsplit(url._replace(netloc=f"{HOST_LOOPBACK}:{url.port}"))
    port = free_port()
    name = f"herder-test-{uuid.uuid4().hex[:12]}"
    podman.run(
        "run", "-d", "--name", name, "--cpus", CPUS, "--memory", MEMORY, "--read-only", *podman.ulimits(),
        "--network", "slirp4netns:allow_host_loopback=true", "-p", f"127.0.0.1:{port}:9100",
        "-e", f"HERDER_REDIS_URL={in_container}", "-e", "HERDER_LOG_FORMAT=json",
        "-e", "HERDER_PATH=/srv/app",
        "-v", f"{REPO / 'tests' / 'jobs'}:/srv/app:ro",
        tag,
    )  # fmt: skip
    c = Container(podman, name)
    try:
        started = time.monotonic()
        st = c.wait_running()
        print(f"herder running in the container {time.monotonic() - started:.1f} s after `podman run`")
        # The workers limit, read from the container's cgroup, and how it was reached.
        assert st["workers_limit"] == LIMIT, st
        reason = st["workers_limit_reason"]
        assert "cgroup CPU quota" in reason and "cgroup memory limit" in reason, reason
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/healthz") == 200, 30, 0.25,
                 what="/healthz 200 on the published port")  # fmt: skip
        podman.run("healthcheck", "run", name)  # the image's HEALTHCHECK (herder status): exit 0

        # Jobs enqueued from the host run in it.
        tag_quick = uuid.uuid4().hex
        quick = [jobs.enqueue("record", tag_quick).id for _ in range(20)]
        wait_for(lambda: sorted(jobs.finished(tag_quick)) == sorted(quick), 60, what="20 jobs to run")

        # Every process in it runs as the image's user.
        procs = {p.pid: (p.uids().real, " ".join(p.cmdline())) for p in c.processes()}
        assert len(procs) >= 1 + 1 + st["actual"], procs  # the watchdog, the master, the workers
        assert {uid for uid, _ in procs.values()} == {image_uid()}, procs

        # A worker killed mid-job (SIGKILL, from inside): replaced, its job requeued and run once.
        tag_killed = uuid.uuid4().hex
        held = jobs.enqueue("record", tag_killed, 3)
        wait_for(lambda: jobs.started(tag_killed) == [held.id], 30, what="the held job to start")
        victim = worker_pid(conn, held.id)
        c.exec("python3", "-c", "import os, sys; os.kill(int(sys.argv[1]), 9)", str(victim))
        jobs.wait_finished(held.id, 60, what="the killed worker's job to be requeued and finish")
        assert jobs.started(tag_killed) == [held.id, held.id]
        assert jobs.finished(tag_killed) == [held.id]  # run to its end once
        st = c.wait_running()
        assert victim not in [w["pid"] for w in st["workers"]]

        # The JSON log: every line herder wrote parses, and the kill is in it.
        records = [json.loads(line) for line in c.logs()]
        assert all(isinstance(r, dict) and "msg" in r for r in records)
        assert any(str(victim) in r["msg"] and "SIGKILL" in r["msg"] for r in records), records[-20:]

        # `podman stop` mid-job: SIGTERM to the watchdog (PID 1), the job finishes, exit 0.
        tag_stop = uuid.uuid4().hex
        last = jobs.enqueue("record", tag_stop, 3)
        wait_for(lambda: jobs.started(tag_stop) == [last.id], 30, what="the last job to start")
        stopping = time.monotonic()
        podman.run("stop", "-t", "30", name, timeout=90)
        took = time.monotonic() - stopping
        assert c.state("ExitCode") == "0", c.logs()[-20:]
        assert took < 30, f"podman stop took {took:.1f} s: SIGKILLed at the end of -t 30?"
        assert jobs.status(last.id) == "finished" and jobs.finished(tag_stop) == [last.id]
    finally:
        podman.run("rm", "-f", "-v", name, check=False, timeout=120)
        reap_adopted()  # podman's conmon, re-parented to this subreaper


COMPOSE_FILE = REPO / "deploy" / "container" / "compose.yaml"


def test_compose_starts_herder_and_redis_and_runs_the_example_jobs(image: tuple[Podman, str]) -> None:
    """deploy/container/compose.yaml under podman-compose, as docs/deploy/containers.md's laptop
    commands run it: up, the example jobs enqueued from inside, /healthz, then a stop that drains (exit 0)."""
    podman, tag = image
    compose = shutil.which("podman-compose")
    if compose is None:
        why = "no podman-compose here (apt-get install podman-compose)"
        if os.environ.get("HERDER_REQUIRE_CONTAINER") == "1":
            pytest.fail(f"HERDER_REQUIRE_CONTAINER=1, but {why}")
        pytest.skip(why)
    project = f"herdertest{uuid.uuid4().hex[:10]}"
    port = free_port()
    # docker.io's redis cannot be pulled here: Debian's redis-server on the same base stands in.
    env = dict(os.environ, REDIS_IMAGE=redis_image(podman), HERDER_IMAGE=tag, HERDER_HTTP_PORT=str(port))
    argv = [compose, "-p", project, "-f", str(COMPOSE_FILE), "--podman-run-args", " ".join(podman.ulimits())]
    if podman.global_args:
        argv += ["--podman-args", " ".join(podman.global_args)]

    def compose_run(*args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)  # fmt: skip
        assert r.returncode == 0, f"podman-compose {' '.join(args)}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        return r

    ours = f"label=io.podman.compose.project={project}"

    def herder_container() -> str:
        service = "label=com.docker.compose.service=herder"
        (name,) = podman.run(
            "ps", "-a", "--filter", ours, "--filter", service, "--format", "{{.Names}}"
        ).stdout.split()
        return name

    try:
        compose_run("up", "-d")
        c = Container(podman, herder_container())
        c.wait_running()
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/healthz") == 200, 30, 0.25,
                 what="/healthz 200 on the port compose publishes")  # fmt: skip
        out = c.exec("python", "/srv/app/enqueue.py", "--count", "20")  # HERDER_REDIS_URL from compose
        assert "enqueued 20 example jobs" in out

        def all_done() -> bool:
            st = c.status()
            return st is not None and st["jobs"]["ok"] + st["jobs"]["failed"] == 20

        wait_for(all_done, 60, 0.5, what="the 20 example jobs to run")
        compose_run("stop")
        assert c.state("ExitCode") == "0", c.logs()[-20:]
        assert any("stopped" in line for line in c.logs()[-5:])
    finally:
        # The containers first, each with its anonymous volume (the image's VOLUME): podman-compose
        # 1.0's `down` removes them without it, and one volume stayed behind each run.
        for kind in ("container", "pod"):  # also whatever an interrupted `up` left behind
            left = podman.run(kind, "ls", "-aq", "--filter", ours, check=False).stdout.split()
            if left:
                podman.run(kind, "rm", "-f", *(["-v"] if kind == "container" else []), *left, check=False)
        subprocess.run([*argv, "down"], env=env, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        podman.run("network", "rm", "-f", f"{project}_default", check=False)
        reap_adopted()
