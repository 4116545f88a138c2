"""One worker's script calls, and what recording RQ's code for them needs.

`Calls.run` is one numbered call of this worker (script.py, the call framed by wire.py): sent
again until Redis answers it, and never run twice. `encode` is redis-py's argument encoding for
the worker's connection, `clock` RQ's clock pinned while its start or finish is recorded
(start_template.FrozenClock). The take, the start and the finish (take.py, start.py, finish.py)
share one `Calls`, the worker's `FastPath` (worker.py) holds it.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from herder.common.rq_names import call_record_key
from herder.worker.fast_path.script import ScriptConnection
from herder.worker.fast_path.start_template import FrozenClock, StartTemplate
from herder.worker.fast_path.wire import make_encoder, resp_request
from herder.worker.rq_worker import HerderMixin


class Calls:
    """One worker's numbered script calls, its encoder and its pinned clock."""

    def __init__(self, worker: HerderMixin) -> None:
        self.worker = worker
        self._script: ScriptConnection | None = None  # opened at the first call, released at teardown
        self._calls = 0  # the number of this worker's last script call
        self._lost = 0  # tries of the current call whose reply was lost

    @functools.cached_property
    def clock(self) -> FrozenClock:
        """RQ's clock, pinned while RQ's start or finish is recorded (made at the first)."""
        return FrozenClock()

    @functools.cached_property
    def encode(self) -> Any:
        """redis-py's argument encoding for this worker's connection (made once)."""
        return make_encoder(self.worker.connection.connection_pool.get_encoder())

    def run(
        self,
        guards: list[str],
        commands: list[tuple[Any, ...]],
        start: tuple[StartTemplate, list[Any]] | None,
        take: list[Any],
        owner: tuple[str, str, int | str] | None = None,
        fence: tuple[str, int | str, str] | None = None,
    ) -> list[Any]:
        """One numbered call of this worker (script.py): sent again until Redis answers it, and
        never run twice. With `owner`, a finish is written only while it is this worker's (RQ
        still has the job started under its execution; or its own code deleted it); with `fence`,
        a start only while the job was not moved since it was taken (herder.worker.fence)."""
        w = self.worker
        if self._script is None:
            self._script = ScriptConnection(w.connection.connection_pool, self._reply_lost)
            self._calls = time.time_ns() // 1000  # rising, also past an earlier process of this name
        self._calls += 1
        self._lost = 0
        call = [
            call_record_key(w.name),
            self._calls,
            w.job_class.redis_job_namespace_prefix,
            w.lease,
            w.lease_ttl,
        ]
        request = resp_request(call, guards, commands, start, take, self.encode, owner, fence)
        reply = self._script.call(request)
        if self._lost:
            w.log.warning("Worker %s: Redis answered the call after %d tries", w.name, self._lost + 1)
        if int(reply[0]) == 5:  # only if this name's record is from the future (the clock went back)
            raise RuntimeError(f"Redis holds a later call of worker {w.name} than this one")
        return reply

    def _reply_lost(self, exc: Exception, tries: int) -> None:
        """Between tries of a call whose reply was lost: said once, then a growing pause. The
        worker is waiting for Redis, not stuck, so its progress goes on (the master's bound)."""
        w = self.worker
        if tries == 1:
            w.log.warning(
                "Worker %s: no reply to a call (%s: %s); asking Redis again until it answers",
                w.name, exc.__class__.__name__, exc,
            )  # fmt: skip
        self._lost = tries
        w.channel.progress()
        time.sleep(min(1.0, 0.05 * 2 ** (tries - 1)))

    def release(self) -> None:
        """The script's connection back to the pool (a later call opens it again)."""
        if self._script is not None:
            self._script.release()
            self._script = None
