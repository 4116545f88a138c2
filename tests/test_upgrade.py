"""`herder upgrade` under steady load: a new master takes over while the old one's workers
finish their jobs, alternating between two builds of herder installed into one venv; and a
broken build leaves the running master serving.

Two wheels of this checkout are built once for the module, offline (from the wheels scripts/setup
caches in $VENV/peer-wheels, as tests/test_install.py does): one as it is, one with a bumped
version; and a third whose master cannot import. Between upgrades the test installs the other
wheel into the venv herder runs from, as `pip install --upgrade` would.

Sampled every 10 ms from Redis, as RQ sees it: the workers registered on the queue and idle or
busy never fall below the pool's count (4) during any upgrade. That is the pool's count, not
only its minimum: an old worker is told to stop only once a new one is ready in its place, and
one finishing its last job is still busy with it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis import Redis
from rq.registry import FailedJobRegistry, StartedJobRegistry

from harness import MASTER_SUMMARY, TESTS, Herder, JobsHelper, clean_env, free_port, wait_for
from harness import run_clean as run
from herder.supervisor import __version__

pytestmark = pytest.mark.slow

REPO = TESTS.parent
PEER_WHEELS = Path(sys.prefix) / "peer-wheels"
BUMPED = __version__.replace(".dev", ".post1.dev") if ".dev" in __version__ else __version__ + ".post1"
BROKEN = BUMPED.replace(".post1", ".post2")
POOL = 4


def source_copy(dest: Path, version: str, broken: bool = False) -> Path:
    """The checkout (no build output, venv or dot folder) with `version`; `broken`: its master
    cannot import (a build shipped with a missing module)."""

    def leave_out(folder: str, names: list[str]) -> set[str]:
        return {
            n
            for n in names
            if n.startswith(".")
            or n in ("__pycache__", "build", "dist", "state")
            or n.endswith(".egg-info")
            or (Path(folder, n) / "pyvenv.cfg").exists()
        }

    shutil.copytree(REPO, dest, ignore=leave_out)
    init = dest / "supervisor" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', f'__version__ = "{version}"'))
    if broken:
        master = dest / "supervisor" / "master.py"
        master.write_text(master.read_text() + "\nimport herder.supervisor.no_such_module  # broken\n")
    return dest


@dataclass
class Builds:
    venv: Path
    wheels: dict[str, Path]  # "old" (this checkout), "new" (bumped), "broken"
    versions: dict[str, str]

    @property
    def herder(self) -> str:
        return str(self.venv / "bin" / "herder")

    def install(self, which: str) -> None:
        """`pip install --upgrade` (or a rollback) of one build, over the other, while herder runs."""
        pip = (self.venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps")
        run(*pip, "--force-reinstall", self.wheels[which], cwd=self.venv)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    if not (PEER_WHEELS / ".stamp").is_file():
        pytest.fail(f"no wheel cache at {PEER_WHEELS}: run scripts/setup with the test extra")
    root = tmp_path_factory.mktemp("upgrade")
    versions = {"old": __version__, "new": BUMPED, "broken": BROKEN}
    building = {}
    for which, version in versions.items():  # the three builds side by side
        src = source_copy(root / which / "src", version, broken=which == "broken")
        argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--find-links",
                str(PEER_WHEELS), "-w", str(root / which / "dist"), str(src)]  # fmt: skip
        building[which] = subprocess.Popen(argv, env=clean_env(), cwd=root, stderr=subprocess.PIPE)
    for which, proc in building.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"building {which}: {err.decode()}"
    wheels = {which: next((root / which / "dist").glob("herder-*.whl")) for which in versions}
    venv = root / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=root)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--find-links", PEER_WHEELS,
        wheels["old"], cwd=root)  # fmt: skip
    return Builds(venv, wheels, versions)


class Sampler(threading.Thread):
    """Every 10 ms: RQ's workers on the queue that are idle or busy (registered, not gone)."""

    def __init__(self, conn: Redis) -> None:
        super().__init__(daemon=True)
        self.conn, self.samples, self.done = conn, [], threading.Event()
        self.failed: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.wait(0.01):
                names = self.conn.smembers("rq:workers:default")
                pipe = self.conn.pipeline(transaction=False)
                for name in names:
                    pipe.hget(name, "state")  # the set holds the workers' keys
                states = pipe.execute()
                self.samples.append((time.monotonic(), sum(s in (b"idle", b"busy") for s in states)))
        except BaseException as exc:  # noqa: BLE001 - said by the test
            self.failed = exc

    def lowest(self, since: float) -> int:
        return min(n for t, n in self.samples if t >= since)


class Load(threading.Thread):
    """Jobs of 50-500 ms at 10 a second: 2.75 s of work a second, a pool of 4 about 70% busy."""

    def __init__(self, jobs: JobsHelper) -> None:
        super().__init__(daemon=True)
        self.jobs, self.ids, self.done = jobs, [], threading.Event()
        self.rng = random.Random(53)

    def run(self) -> None:
        try:
            while not self.done.wait(0.1):
                self.ids.append(self.jobs.enqueue("record", "u", self.rng.uniform(0.05, 0.5)).id)
        except Exception:  # noqa: BLE001 - Redis gone: the test failed already and tears it down
            pass


def status(h: Herder, herder: str) -> dict:
    argv = [herder, "status", "--json", "--state-dir", h.state_dir]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout)


def upgrade(h: Herder, herder: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [herder, "upgrade", "--state-dir", h.state_dir, "--timeout", "60"], capture_output=True, text=True,
        timeout=90,
    )  # fmt: skip


def test_upgrades_under_load_never_dip_and_run_every_job_once(
    builds: Builds, herder, jobs: JobsHelper, conn: Redis
) -> None:
    h = herder(workers=str(POOL), executable=builds.herder)
    h.wait_workers(POOL)
    watchdog = status(h, builds.herder)["watchdog"]["pid"]
    sampler, load = Sampler(Redis(connection_pool=conn.connection_pool)), Load(jobs)
    sampler.start()
    load.start()
    time.sleep(1.0)  # the load settles
    began = time.monotonic()
    for which in ("new", "old", "new"):  # an upgrade, a rollback, an upgrade again
        builds.install(which)
        r = upgrade(h, builds.herder)
        assert r.returncode == 0, f"herder upgrade to {which} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        version = builds.versions[which]
        assert subprocess.run([builds.herder, "--version"], capture_output=True, text=True).stdout.startswith(
            f"herder {version} "
        )
        st = status(h, builds.herder)
        assert (st["version"], st["handover"], st["watchdog"]["pid"]) == (version, None, watchdog), st
        assert len([w for w in st["workers"] if w["state"] in ("idle", "busy")]) == POOL, st["workers"]
    master = status(h, builds.herder)["master"]["pid"]
    # A build whose master cannot import: refused before anything of it starts; the master goes on.
    builds.install("broken")
    r = upgrade(h, builds.herder)
    assert r.returncode == 1, r
    assert "no_such_module" in r.stderr and "herder upgrade failed" in r.stderr, r.stderr
    st = status(h, builds.herder)
    assert (st["master"]["pid"], st["version"], st["watchdog"]["pid"]) == (master, BUMPED, watchdog)
    time.sleep(0.5)  # the master serves on after the refusal
    # The load ends once it has been more than a few jobs (faster upgrades leave fewer).
    wait_for(lambda: len(load.ids) > 100, 30, what="over 100 jobs enqueued")
    ended = time.monotonic()
    load.done.set()
    load.join()
    wait_for(lambda: all(jobs.status(i) == "finished" for i in load.ids), 20, what="every job to finish")
    sampler.done.set()
    sampler.join()
    assert sampler.failed is None, sampler.failed
    assert len([t for t, _ in sampler.samples if began <= t <= ended]) > 300  # every 10 ms, or near
    assert sampler.lowest(began) >= POOL, [n for t, n in sampler.samples if t >= began and n < POOL][:20]
    # Every job exactly once: none lost, none run twice, none requeued, abandoned or failed.
    assert sorted(jobs.started("u")) == sorted(load.ids) == sorted(jobs.finished("u"))
    assert len(set(load.ids)) == len(load.ids) > 100
    assert FailedJobRegistry("default", connection=conn).count == 0
    assert StartedJobRegistry("default", connection=conn).count == 0
    h.stop_and_check()
    summaries = [m.groupdict() for m in MASTER_SUMMARY.finditer(h.log())]
    assert len(summaries) == 4, summaries  # the first master, three taken over, the last stopped
    assert all(s["requeued"] == s["killed"] == s["failed_by_herder"] == "0" for s in summaries), summaries
    assert "restarting it in" not in h.log()  # the watchdog restarted no master


class Knocker(threading.Thread):
    """Every 10 ms: one connection to the control socket and one to the HTTP port; each refused
    one (or a path that is gone) is counted."""

    def __init__(self, state_dir: str, port: int) -> None:
        super().__init__(daemon=True)
        self.state_dir, self.port, self.done = state_dir, port, threading.Event()
        self.tries, self.refused = 0, []

    def run(self) -> None:
        path = os.path.join(self.state_dir, "herder.sock")
        while not self.done.wait(0.01):
            self.tries += 1
            for family, address in ((socket.AF_UNIX, path), (socket.AF_INET, ("127.0.0.1", self.port))):
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    try:
                        s.connect(address)
                    except OSError as exc:
                        self.refused.append(f"{address}: {exc}")


def test_an_upgrade_applies_what_a_reload_cannot_and_never_refuses_a_connection(
    herder, tmp_path: Path, jobs: JobsHelper
) -> None:
    """From this checkout to itself: the config file read again by the installed code applies a
    setting only a restart applied before (log_format), while the control socket and the HTTP
    port answer every connection throughout."""
    conf = tmp_path / "herder.toml"
    conf.write_text('log_format = "text"\n')
    port = free_port()
    h = herder(config=str(conf), workers="2", http=f"127.0.0.1:{port}")
    h.wait_workers(2)
    watchdog, master = h.status()["watchdog"]["pid"], h.status()["master"]["pid"]
    conf.write_text('log_format = "json"\n')
    r = subprocess.run([h.argv[0], "reload", "--state-dir", h.state_dir], capture_output=True, text=True)
    assert r.returncode == 1 and "herder upgrade" in r.stderr, r.stderr
    knocker = Knocker(h.state_dir, port)
    knocker.start()
    r = upgrade(h, h.argv[0])
    knocker.done.set()
    knocker.join()
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    st = h.status()
    assert (st["watchdog"]["pid"], st["settings"]["log_format"]) == (watchdog, "json"), st["settings"]
    assert st["master"]["pid"] != master
    assert knocker.tries > 50 and not knocker.refused, knocker.refused[:5]
    assert f'"pid": {st["master"]["pid"]}' in h.log() or f'"process": {st["master"]["pid"]}' in h.log()
    h.stop_and_check()


def test_a_new_master_dying_mid_hand_over_gives_the_pool_back_to_the_old_one(
    herder, jobs: JobsHelper
) -> None:
    """B killed once the hand-over began: A takes its pool back (its target again, a worker in
    place of the one it had stopped), the watchdog makes it the master again instead of starting
    a third, `herder upgrade` exits 1, and the jobs running meanwhile finish once."""
    h = herder(workers="2")
    h.wait_workers(2)
    old = h.status()["master"]["pid"]
    ids = [jobs.enqueue("record", "mid", 4.0).id for _ in range(2)]  # both of A's workers busy
    wait_for(lambda: len(jobs.started("mid")) == 2, 10, what="both jobs to start")
    cli = subprocess.Popen(
        [h.argv[0], "upgrade", "--state-dir", h.state_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        (new,) = [
            int(m[1]) for m in h.wait_log(r"upgrade: master (\d+) ready; master \d+ hands its workers over")
        ]
        os.kill(new, 9)
        out, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 1 and "during the hand-over" in err and f"master {old} goes on" in err, out + err
    h.wait_log(rf"herder\[{old}\] WARNING herder upgrade: master {new} went before the hand-over finished")
    h.wait_workers(2)
    assert h.status()["master"]["pid"] == old and h.status()["handover"] is None
    for i in ids:
        jobs.wait_finished(i, 15, what="the jobs A's workers ran")
    assert sorted(jobs.finished("mid")) == sorted(ids) == sorted(jobs.started("mid"))
    assert "restarting it in" not in h.log()
    h.stop_and_check()
