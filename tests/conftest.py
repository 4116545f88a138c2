"""The suite's fixtures and hooks; what they drive (Herder, redis-server, the process helpers)
is in harness.py.

- One redis-server per test session on a free loopback port (never the default one), flushed
  before each test.
- The pytest process is a child subreaper, so workers orphaned by a killed master
  come back to it and are reaped here: a zombie left behind is a finding, not noise.
- Every process a test starts carries HERDER_TEST_TAG in its environment; after the
  test, any process still carrying it is a leftover: the test fails and it is killed
  (a test that failed already is not failed again for what its failure left running).
- A failed test's report carries the end of each herder's log.
- herder's image (podman) is built once per session, for every container test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from redis import Redis

from fakes import FakeClock
from harness import HERDER, HERDERS, REPORTS, Herder, JobsHelper, become_subreaper, start_redis
from podman import Podman, Unusable, build_image


def pytest_configure(config: pytest.Config) -> None:
    """Before any test starts a process: orphans must come back to this one to be reaped."""
    become_subreaper()


# ---- Redis ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, port = start_redis(tmp_path_factory.mktemp("redis"))
    url = f"redis://127.0.0.1:{port}/0"
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def redis_url(redis_server: str) -> str:
    Redis.from_url(redis_server).flushall()
    return redis_server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A redis-server for one test, which the test may stop, freeze or restart."""
    proc, port = start_redis(tmp_path)
    yield proc, port
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def conn(redis_url: str) -> Redis:
    return Redis.from_url(redis_url)


@pytest.fixture
def unit_fast_worker(conn: Redis) -> Any:
    """herder's fast worker on `conn`'s queue `default`, with no master behind it: for tests that
    call its methods directly (rq 3 only: its tests skip on rq 2, so it is imported here)."""
    from rq import Queue

    from herder.worker.fast_path.worker import HerderFastWorker

    w = HerderFastWorker([Queue("default", connection=conn)], connection=conn, name="unit-worker")
    channel = SimpleNamespace(progress=lambda: None, on_request=lambda wake: None)  # no master
    w.attach(channel, lease_seconds=3)
    return w


# ---- herder ---------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the end of each herder's log: a CI failure explains itself.
    Each phase's report is kept on the item, for the herder fixture's teardown to read."""
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    if report.failed and report.when == "call":
        for n, h in enumerate(item.stash.get(HERDERS, [])):
            report.sections.append((f"herder {n} log (last 6000 characters)", h.log()[-6000:]))
    return report


@pytest.fixture
def herder(redis_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Herder]]:
    started: list[Herder] = []
    request.node.stash[HERDERS] = started

    def make(
        env: dict[str, str] | None = None, executable: str = HERDER, **args: str | list[str] | bool | None
    ) -> Herder:
        flags = {"--" + k.replace("_", "-"): v for k, v in args.items()}
        workdir = tmp_path / f"herder{len(started)}"
        workdir.mkdir()
        h = Herder(redis_url, workdir, uuid.uuid4().hex, flags, env, executable)
        started.append(h)
        return h.start()

    yield make
    problems = []
    for h in started:
        problems += h.cleanup()  # kills what is left, whatever the outcome
    reports = request.node.stash.get(REPORTS, {})
    already_failed = any(r.failed for r in reports.values())
    # A test that failed midway leaves its herder running: that is the failure's echo, not a
    # second finding. Only a test that passed is failed for what it left behind.
    if problems and not already_failed:
        pytest.fail("processes left behind: " + "; ".join(problems))


@pytest.fixture
def jobs(conn: Redis) -> JobsHelper:
    """Enqueue test jobs from tests/jobs/herder_testjobs.py and read what they recorded."""
    return JobsHelper(conn)


# ---- containers ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def image() -> Iterator[tuple[Podman, str]]:
    """herder's image, built once per session by podman from this tree (tests/podman.py), for
    every container test; removed at the end. It skips, saying why, where no container can run;
    with HERDER_REQUIRE_CONTAINER=1 (.ci/run's container step) that is a failure instead."""
    try:
        podman = Podman.find()
        tag = f"localhost/herder-test:{uuid.uuid4().hex[:12]}"
        build_image(podman, tag)
    except Unusable as why:
        if os.environ.get("HERDER_REQUIRE_CONTAINER") == "1":
            pytest.fail(f"HERDER_REQUIRE_CONTAINER=1, but no container can run here: {why}")
        pytest.skip(str(why))
    try:
        yield podman, tag
    finally:
        podman.run("rmi", "-f", tag, check=False, timeout=300)


# ---- the unit tests' fakes ------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    """The fake clock the unit tests' master runs on (fakes.py)."""
    return FakeClock()
