"""The fast path's finish is written only while the job is still the worker's
(herder.worker.fast_path.script): a worker cut off from Redis past its lease has its job recovered
and run by another host; when it comes back, its finish must not overwrite the other run's result.
The script itself, on a real redis-server, with the call framed as a worker frames it (wire.py)."""

from __future__ import annotations

from redis import Redis

from herder.worker.fast_path.script import ScriptConnection
from herder.worker.fast_path.wire import make_encoder, resp_request

WIP = "rq:wip:default"
FINISH = [("HSET", "rq:job:j", "status", "finished"), ("XADD", "rq:results:j", "*", "worker", "cut-off")]


def call(conn: Redis, number: int, owner: tuple[str, str] | None) -> list:
    script = ScriptConnection(conn.connection_pool, lambda exc, tries: None)
    encode = make_encoder(conn.connection_pool.get_encoder())
    request = resp_request(["herder:call:w", number, "rq:job:"], [], FINISH, None, [""], encode, owner)
    try:
        return script.call(request)
    finally:
        script.release()


def test_a_finish_is_written_while_its_execution_is_started(conn: Redis) -> None:
    conn.zadd(WIP, {"j:e1": 1e12})
    conn.hset("rq:job:j", "status", "started")
    assert call(conn, 1, (WIP, "j:e1")) == [1]
    assert conn.hget("rq:job:j", "status") == b"finished"
    assert conn.xlen("rq:results:j") == 1


def test_a_finish_for_a_recovered_job_writes_nothing_even_when_asked_again(conn: Redis) -> None:
    # Recovered from the cut-off worker (its execution e1 left the registry), run and finished
    # by another worker, whose result stands.
    conn.hset("rq:job:j", "status", "finished")
    conn.xadd("rq:results:j", {"worker": "other"})
    assert call(conn, 1, (WIP, "j:e1")) == [6]
    assert call(conn, 1, (WIP, "j:e1")) == [6]  # the same call after a lost reply: answered, not run
    assert conn.xlen("rq:results:j") == 1
    # ...and while another execution of it runs, the old one's finish does not end it either.
    conn.hset("rq:job:j", "status", "started")
    conn.zadd(WIP, {"j:e2": 1e12})
    assert call(conn, 2, (WIP, "j:e1")) == [6]
    assert conn.hget("rq:job:j", "status") == b"started"


def test_a_call_without_an_owner_is_not_checked(conn: Redis) -> None:
    """A start's own call (no finish in it) has no owner: it runs as before."""
    assert call(conn, 1, None) == [1]
    assert conn.hget("rq:job:j", "status") == b"finished"
