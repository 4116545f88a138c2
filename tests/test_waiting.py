"""A worker that cannot reach Redis says what it waits for (`wait`, docs/protocol.md), whatever
the cause: refused, a connect or a name resolution that gets no answer; and the master shows it
(status, the dashboard's JSON), logs it once, and names it in a kill.

The first tests run the worker's wait (herder.worker.reach) in a process of its own with its
channel on a pipe, with getaddrinfo made to block for one name (a resolver that does not answer
cannot be had for real per process) or the ping blocked in a C call. The end-to-end ones run
`herder run` against a port whose accept queue is full, so a connect gets no answer at all, and
against a name whose resolution blocks in the worker (its --worker-init stalls getaddrinfo).
"""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import HERDER, free_port, unanswered_port, wait_for

PASSWORD = "s3cret-pw"  # in every URL here: never in a line, a log or a status

WAITER = """
import socket, sys, threading, time
from herder.common.redis_connect import connect
from herder.worker import reach
from herder.worker.channel import Channel

mode, url, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
reach.RESOLVE_TIMEOUT = 1.0
real = socket.getaddrinfo

def stalling(host, *args, **kwargs):  # a resolver that never answers for this one name
    if host == "stall.invalid":
        threading.Event().wait()
    return real(host, *args, **kwargs)

socket.getaddrinfo = stalling
channel = Channel(heartbeat_interval=0.2, wait_bound=bound)
channel.start()
probe = connect(url, socket_timeout=0.2, socket_connect_timeout=0.2)
if mode == "ping-blocks":
    probe.ping = lambda: time.sleep(3600)  # the main thread held in a C call for good
ok = reach.wait_for_redis(probe, channel)
helpers = sum(t.name == "herder-resolve" for t in threading.enumerate())
print(f"returned {ok}, resolving threads {helpers}", file=sys.stderr, flush=True)
"""


Lines = list[tuple[float, str]]


def run_waiter(mode: str, url: str, seconds: float, bound: float = 30.0) -> tuple[Lines, str]:
    """The wait's protocol lines over `seconds` (time since start, line), then a stop (stdin
    closed) and its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, mode, url, str(bound)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    lines, buf, start = [], b"", time.monotonic()
    try:
        while (left := start + seconds - time.monotonic()) > 0:
            if select.select([proc.stdout], [], [], left)[0]:
                chunk = proc.stdout.read1(4096)  # type: ignore[union-attr]
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    lines.append((time.monotonic() - start, line.decode()))
        proc.stdin.close()  # type: ignore[union-attr]  # the master is gone: stop waiting
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        return lines, proc.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def waits(lines: Lines) -> list[tuple[float, float, str]]:
    """(arrival, seconds waited, what) of each `wait` line."""
    out = []
    for at, line in lines:
        verb, _ts, waited, what = line.split(" ", 3)
        assert verb == "wait", line  # nothing else while it waits: no `idle`, no `ready`
        out.append((at, float(waited), what))
    return out


@pytest.mark.slow
def test_a_name_that_does_not_resolve_in_time_is_said_and_tried_again() -> None:
    lines, stderr = run_waiter("resolve", f"redis://:{PASSWORD}@stall.invalid:16390/0", 3.5)
    said = waits(lines)
    # The first attempt, while getaddrinfo blocks: said within a beat of it, by the sentinel.
    assert said and said[0][0] < 1.0, lines
    assert said[0][2] == "Redis at stall.invalid:16390: name resolution of stall.invalid not answered yet"
    # Then bounded: the attempt gives up after RESOLVE_TIMEOUT, says why, and tries again.
    timed_out = "Redis at stall.invalid:16390: name resolution of stall.invalid timed out after 1 s"
    assert [w for w in said if w[2] == timed_out], lines
    # A line every beat or so throughout: the master hears a wait, never a silence.
    arrivals = [at for at, _, _ in said]
    assert max(b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)) < 0.8, arrivals
    assert said[-1][1] >= 2.0  # how long it has waited, counted from its first attempt
    # Asked to stop, it stops; the resolution that never answered is one helper, not one a try.
    assert "returned False, resolving threads 1" in stderr, stderr
    assert PASSWORD not in stderr and not any(PASSWORD in line for _, line in lines)


@pytest.mark.slow
def test_a_main_thread_held_in_a_call_is_said_until_the_bound_then_goes_silent() -> None:
    port = free_port()
    lines, _ = run_waiter("ping-blocks", f"redis://:{PASSWORD}@127.0.0.1:{port}/0", 3.5, bound=1.5)
    said = waits(lines)
    assert said and said[0][2] == f"Redis at 127.0.0.1:{port}: no answer yet", lines
    assert said[0][0] < 1.0
    # The sentinel speaks for the blocked loop for wait_bound (1.5 s), then no more: a loop
    # stuck for good goes silent, and the master kills it for that, naming the wait.
    assert said[-1][0] < 2.2 and said[-1][1] >= 1.0, said


@pytest.mark.slow
def test_a_refused_connection_is_said_as_such() -> None:
    port = free_port()  # nobody listens
    lines, stderr = run_waiter("refused", f"redis://:{PASSWORD}@127.0.0.1:{port}/0", 1.5)
    said = waits(lines)
    assert said and {w[2] for w in said} == {f"Redis at 127.0.0.1:{port}: connection refused"}, lines
    assert "returned False" in stderr


# ---- end to end ------------------------------------------------------------------------------


@pytest.fixture
def unanswering_port() -> Iterator[int]:
    with unanswered_port() as port:
        yield port


def status_text(h) -> str:  # noqa: ANN001
    return subprocess.run(
        [HERDER, "status", "--state-dir", h.state_dir], capture_output=True, text=True, timeout=20
    ).stdout


@pytest.mark.slow
def test_a_worker_whose_connect_gets_no_answer_waits_says_so_and_a_kill_names_it(herder, unanswering_port):
    port = unanswering_port
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    h = herder(redis_url=url, workers="1", no_scheduler=True)
    where = f"Redis at 127.0.0.1:{port}: "

    def waiting(s: dict) -> dict | None:
        rows = [w for w in s["workers"] if (w.get("waiting_for") or "").startswith(where)]
        return rows[0] if rows and rows[0]["waiting_seconds"] >= 2 else None

    st = h.wait_status(lambda s: waiting(s) is not None, 30, what="the worker's wait in the status")
    row = waiting(st)
    assert row and row["state"] == "starting", st["workers"]
    # Each connect times out (a beat here); the worker says so and waits, heartbeating: it is
    # not killed for its start timeout, as a worker of a Redis that refuses is not.
    h.wait_status(lambda s: (waiting(s) or {}).get("waiting_for") == where + "connect timed out", 20)
    text = status_text(h)
    assert re.search(rf"starting .*waiting \d+s for {re.escape(where)}connect timed out", text), text
    # An absence over time: past the heartbeat timeout (3 s) several times, no kill, one line
    # in the master's log for each thing it waited for.
    time.sleep(3 * 3.0)
    st = h.snapshot()
    assert st["totals"]["killed"] == 0 and [w["pid"] for w in st["workers"]] == [row["pid"]], st
    logged = re.findall(rf"pid {row['pid']}: waiting for (.*)$", h.log(), re.M)
    assert logged.count(where + "connect timed out") == 1, logged
    assert len(logged) == len(set(logged)) <= 2, logged  # "no answer yet" at most, first
    # Frozen mid-wait: silent past the heartbeat timeout, killed, and the kill says what it
    # was waiting for.
    victim = row["pid"]
    import os

    os.kill(victim, signal.SIGSTOP)
    kill = wait_for(lambda: [k for k in h.kills() if int(k["pid"]) == victim], 20, what="the kill")[0]
    assert re.search(rf"; it was waiting \d+ s for {re.escape(where)}connect timed out$", kill["why"]), kill
    assert PASSWORD not in h.log() and PASSWORD not in json.dumps(h.snapshot()) and PASSWORD not in text
    h.stop_and_check()


HOOK = """
import socket, threading

real = socket.getaddrinfo


def stall_resolver():
    def stalling(host, *args, **kwargs):  # a DNS server that never answers, for this name
        if host == "redis.stall.invalid":
            threading.Event().wait()
        return real(host, *args, **kwargs)

    socket.getaddrinfo = stalling
"""


@pytest.mark.slow
def test_a_worker_whose_redis_name_does_not_resolve_in_time_says_so(herder, tmp_path: Path):
    (tmp_path / "herder_stall_hook.py").write_text(HOOK)
    from harness import JOBS_DIR

    url = f"redis://:{PASSWORD}@redis.stall.invalid:16390/0"
    h = herder(
        redis_url=url,
        workers="1",
        no_scheduler=True,
        path=[str(JOBS_DIR), str(tmp_path)],
        worker_init="herder_stall_hook:stall_resolver",
        start_timeout="8",  # past the 5 s resolution timeout, and soon past: a kill would come at 8 s
    )
    name = "redis.stall.invalid"
    timed_out = f"Redis at {name}:16390: name resolution of {name} timed out after 5 s"
    st = h.wait_status(
        lambda s: any(w.get("waiting_for") == timed_out for w in s["workers"]), 30, what="the wait"
    )
    row = next(w for w in st["workers"] if w["waiting_for"] == timed_out)
    assert row["state"] == "starting" and row["waiting_seconds"] >= 5, row
    # Waiting past the start timeout is no reason to kill it: it says what it waits for.
    h.wait_status(
        lambda s: s["workers"] and s["workers"][0]["uptime"] > 10, 30, what="the start timeout past"
    )
    st = h.snapshot()
    assert st["totals"]["killed"] == 0 and st["workers"][0]["pid"] == row["pid"], st
    logged = re.findall(rf"pid {row['pid']}: waiting for (.*)$", h.log(), re.M)
    assert logged.count(timed_out) == 1, logged
    assert PASSWORD not in h.log()
    h.stop_and_check()


@pytest.mark.slow
def test_a_ready_worker_whose_redis_stops_answering_says_so_until_it_answers(herder, own_redis):
    """Between jobs too: an idle worker whose Redis freezes shows what it waits for, and the row
    clears once Redis answers again."""
    proc, port = own_redis
    # The heartbeat timeout above --redis-timeout (5 s), as by default: a dequeue on a frozen
    # Redis gives up before the worker's silence is a kill.
    h = herder(
        redis_url=f"redis://127.0.0.1:{port}/0", workers="1", no_scheduler=True, heartbeat_timeout="10"
    )
    (pid,) = [p.pid for p in h.wait_workers(1)]
    proc.send_signal(signal.SIGSTOP)  # Redis hangs: connections open, nothing answers
    try:
        where = f"Redis at 127.0.0.1:{port}: "
        st = h.wait_status(
            lambda s: (s["workers"][0].get("waiting_for") or "").startswith(where), 30, what="the wait"
        )
        assert st["workers"][0]["pid"] == pid and st["workers"][0]["state"] == "idle", st["workers"]
    finally:
        proc.send_signal(signal.SIGCONT)
    st = h.wait_status(lambda s: s["workers"][0]["waiting_for"] is None, 30, what="the wait to clear")
    assert st["workers"][0]["pid"] == pid and st["totals"]["killed"] == 0, st
    h.stop_and_check()
