"""The operator's path: the unit `herder install-service systemd` writes, its ExecStart run as
is, and bare `herder status|scale|restart|reload|stop` (no --state-dir) finding that service.

The service keeps its state in /var/lib/herder; a bare command as root looks in /run/herder
first. Both paths are real here: the unit's command runs in a mount namespace of its own
whose /var/lib and /run are empty tmpfs mounts, and every command is run inside it with
nsenter, so nothing of this test touches the host's /var/lib or /run, and a herder running
on the host cannot answer in the service's place.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from harness import HERDER, JOBS_DIR, TAG_VAR, tagged, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of its own needs root"),
    pytest.mark.skipif(not (shutil.which("unshare") and shutil.which("nsenter")), reason="util-linux"),
]


def in_fresh_mounts(argv: list[str]) -> list[str]:
    """argv run in a mount namespace of its own whose /var/lib and /run are empty, like a fresh
    host's herder dirs."""
    setup = "mount -t tmpfs -o mode=0755 tmpfs /var/lib && mount -t tmpfs -o mode=0755 tmpfs /run"
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'{setup} && exec "$@"',
        "sh",
        *argv,
    ]


def exec_start(unit: str) -> list[str]:
    lines = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, unit
    return shlex.split(lines[0].removeprefix("ExecStart="))


class Service:
    """The unit's ExecStart, started as systemd would (its environment, its own session)."""

    def __init__(self, argv: list[str], workdir: Path) -> None:
        self.tag = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
        env.update({"PYTHONUNBUFFERED": "1", TAG_VAR: self.tag})
        self.log = open(workdir / "service.log", "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            in_fresh_mounts(argv),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def herder(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A bare `herder ...` as an operator types it, on the service's side of the mounts."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
        return subprocess.run(
            ["nsenter", "-t", str(self.proc.pid), "-m", "--", HERDER, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    def processes(self) -> list:
        return tagged(self.tag, self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for p in self.processes():
            p.kill()
        wait_for(lambda: not self.processes(), 10, what="the service's processes to exit")
        self.log.close()


@pytest.fixture
def service(tmp_path: Path, redis_url: str):
    conf = tmp_path / "herder.toml"
    conf.write_text(
        f'[herder]\nredis_url = "{redis_url}"\nworkers = 2\npaths = ["{JOBS_DIR}"]\nstop_timeout = 10\n'
    )
    conf.chmod(0o600)
    rendered = subprocess.run(
        [HERDER, "install-service", "systemd", "--config", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert rendered.returncode == 0, rendered.stderr
    argv = exec_start(rendered.stdout)
    assert argv[:2] == [HERDER, "run"], argv
    assert "ReadWritePaths=/var/lib/herder" in rendered.stdout.splitlines()
    started = Service(argv, tmp_path)
    try:
        yield started
    finally:
        started.close()


def test_bare_commands_find_the_installed_service(service: Service) -> None:
    def running() -> dict | None:
        r = service.herder("status", "--json")
        if r.returncode != 0:
            return None
        status = json.loads(r.stdout)
        return status if status["actual"] == 2 and status["running"] else None

    status = wait_for(running, 30, what="`herder status` to find the service running 2 workers")
    assert status["settings"]["state_dir"] == "/var/lib/herder"

    scaled = service.herder("scale", "3")
    assert scaled.returncode == 0, scaled.stderr
    wait_for(lambda: running_count(service) == 3, 30, what="3 workers after `herder scale 3`")

    restarted = service.herder("restart")
    assert restarted.returncode == 0 and "replacing 3 workers" in restarted.stdout, restarted

    reloaded = service.herder("reload")
    assert reloaded.returncode == 0, reloaded.stderr

    stopped = service.herder("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped
    assert service.proc.wait(30) == 0
    wait_for(lambda: not service.processes(), 10, what="every process of the service to exit")


def running_count(service: Service) -> int | None:
    r = service.herder("status", "--json")
    return json.loads(r.stdout)["actual"] if r.returncode in (0, 3) else None


def test_nothing_answering_names_every_place_looked_at() -> None:
    """With no herder anywhere, the message names both places and the exit is 4 (unreachable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
    r = subprocess.run(
        in_fresh_mounts([HERDER, "status"]),
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert r.returncode == 4, r
    assert "/run/herder or /var/lib/herder" in r.stderr, r.stderr
