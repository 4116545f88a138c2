"""A job's start and finish, fenced against herder's recovery of the job (RQ's own path here; the
fast path checks the same inside its one script, herder.worker.fast_path.script).

A worker that could not reach Redis past its lease (its host cut off, or its process stalled) may
have had its job recovered by another master's sweep, put back on its queue and run elsewhere.
When it goes on, it must neither start that job nor write its finish over the other run's.

- **A start** is written only while the job is still where the worker's take put it: RQ's
  dequeue moves it into its queue's intermediate list (one queue, Redis 6.2 and later), and the
  first start transaction takes it out of there (RQ's second one would, a moment later), in the
  same script as RQ's writes. A recovery takes it out of that list too, and another worker's
  start takes it out again: of two workers that both think they took the job (one of them back
  from a cut, its take's reply delivered late) exactly one starts it. A job the worker knows the
  moves of (below: the fast path's script takes note of them) is also refused once they changed.
- **A job's moves** are how many times herder's recovery moved it from a worker
  (herder.common.rq_names.MOVES_LUA). The worker notes them when its start is written (or, on
  the fast path, when the script takes the job), atomically with it.
- **A finish** is written while the job's moves, noted at its start, are unchanged: only
  herder's recovery takes a job from its worker. A cancel while it runs (`job.cancel()`) or a
  delete by its own code (`job.delete()`) takes it out of RQ's registry too, and RQ writes the
  finish all the same. Where the moves were not noted, while RQ still has the job started under
  this worker's execution, or its hash is gone (or holds no status: RQ's job heartbeat after the
  delete makes a hash of its one field). Otherwise it was recovered from this worker and runs
  or ran elsewhere, whose outcome stands.

- **The lease.** A job is held under its worker's lease: another host's sweep takes a job whose
  holder's lease has lapsed for a dead worker's. A worker back from a cut has no lease until its
  next renewal, so the start (and, on the fast path, the take) renews it in the same call: no
  job is ever started under a lapsed lease, and so none is recovered from a live worker in the
  moment after a cut. (Seen in tests/test_hosts.py before: a job the returning host started in
  its first second back was taken over by another host's sweep and ran on both.)

Each check rides in the call that writes (RQ's transaction sent as one script call: the same one
round trip as its MULTI/EXEC), so none costs a round trip of its own.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import ResponseError

from herder.common.rq_names import MOVES_LUA


class StartRefused(Exception):  # noqa: N818 - a verdict, not a mistake
    """The job is no longer where this worker's take put it, or was moved since: not started."""


# KEYS: 1 the job's hash, 2 the intermediate list to take it out of (the job's hash again when
# none), 3 the worker's lease. ARGV: 1 the job id, 2 its moves when taken ('' if not known), 3 '1'
# to take it out of the list, 4 the lease's TTL in seconds, then each command's argument count and
# its arguments. {1, moves} written (the lease renewed with it), {7} fenced off (nothing written),
# {3, error} (a command failed; as with EXEC, the others ran).
FENCED_START = (
    MOVES_LUA
    + """
local m = moves(ARGV[1])
if ARGV[2] ~= '' and m ~= tonumber(ARGV[2]) then return {7} end
if ARGV[3] == '1' and redis.call('LREM', KEYS[2], 1, ARGV[1]) == 0 then return {7} end
redis.call('SET', KEYS[3], '1', 'EX', ARGV[4])
local i, err = 5, nil
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local r = redis.pcall(unpack(ARGV, i + 1, i + n))
  i = i + 1 + n
  if type(r) == 'table' and r.err and not err then err = r.err end
end
if err then return {3, err} end
return {1, m}
"""
)

# KEYS: 1 the StartedJobRegistry, 2 the job's hash. ARGV: 1 the execution's member, 2 the job id,
# 3 its moves when taken ('' if not known). 1: the finish is this worker's to write; 0: not.
FINISH_FENCE = (
    MOVES_LUA
    + """
if ARGV[3] ~= '' then return moves(ARGV[2]) == tonumber(ARGV[3]) and 1 or 0 end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('HEXISTS', KEYS[2], 'status') == 1 then return 0 end
return 1
"""
)


class FencedPipeline(Pipeline):
    """RQ's start transaction, sent as one script call (FENCED_START): StartRefused when the
    fence refuses it. `noted` is told the job's moves once it is written."""

    def __init__(self, real: Redis, fence: Fence) -> None:
        super().__init__(real.connection_pool, real.response_callbacks, True, None)
        self._real, self._fence = real, fence

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.watching or not self.command_stack:  # not a start RQ builds: as redis-py would
            return super().execute(raise_on_error)
        f = self._fence
        lease, ttl = f.lease
        args: list[Any] = [f.job_id, "" if f.moves is None else f.moves, "1" if f.claim else "0", ttl]
        n = len(self.command_stack)
        for command, _ in self.command_stack:
            args += [len(command), *command]
        self.reset()
        reply = _run(self._real, FENCED_START, [f.job_key, f.claim or f.job_key, lease], args)
        code = int(reply[0])
        if code == 7:
            raise StartRefused(f.job_id)
        if code == 3:
            if raise_on_error:
                raise ResponseError(reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1]))
        else:
            f.moves, f.claim = (
                int(reply[1]),
                "",
            )  # taken out of the list once: the next transaction checks the moves
        return [None] * n


class Fence:
    """What a job's start is fenced on: the job, its moves (None: not known yet) and the list it is
    taken out of by the next start transaction ('' for none); and the worker's lease (key, TTL),
    renewed by the start that is written."""

    def __init__(
        self, job_key: str, job_id: str, moves: int | None, claim: str, lease: tuple[str, int]
    ) -> None:
        self.job_key, self.job_id, self.moves, self.claim = job_key, job_id, moves, claim
        self.lease = lease


class FencedConnection:
    """Stands in for the worker's connection while RQ's start runs: its transactions are fenced,
    anything else is the real connection's."""

    def __init__(self, real: Redis, fence: Fence) -> None:
        self._real, self._fence = real, fence

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        if not transaction:
            return self._real.pipeline(transaction, shard_hint)
        return FencedPipeline(self._real, self._fence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


_scripts: dict[str, Script] = {}


def _run(conn: Redis, script: str, keys: list[str], args: list[Any]) -> Any:
    """EVALSHA, loading the script where Redis does not have it (redis-py's Script)."""
    s = _scripts.get(script)
    if s is None:
        s = _scripts[script] = conn.register_script(script)
    return s(keys=keys, args=args, client=conn)


def finish_fenced_off(
    conn: Redis, registry: str, member: str, job_key: str, job_id: str, moves: int | None
) -> bool:
    """True when the finish is not this worker's to write (see the module's doc)."""
    ok = _run(conn, FINISH_FENCE, [registry, job_key], [member, job_id, "" if moves is None else moves])
    return not int(ok)
