"""The one script of the fast path: a job's finish, the next job taken, and its start, in one call.

Redis runs it atomically, so a finish and the take that follows it are one step to every other
client: nothing sees a worker between jobs that has finished one and not yet taken the next.
ARGV layout and replies are below; the worker frames the call itself (wire.py) and sends it on
a connection of its own (ScriptConnection).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from redis.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from herder.common import rq_seam
from herder.common.rq_names import MOVES_LUA

# The finish RQ built, then the next job and its start, as one numbered call of one worker. ARGV:
# the worker's call record key (herder.common.rq_names.call_record_key), the call's number (rising
# through the worker's life), the job key prefix, the worker's lease key and its TTL in seconds
# (renewed with every job it takes or starts); the fence ('0' for none; 'F' then the
# StartedJobRegistry key, the finished execution's member and the job's moves when it was taken,
# or '' (a finish); 'S' then the job id, its moves when it was taken or '', and the intermediate
# list its take put it in, or '' (a start of its own)); the guards (their number, then the sets that must
# be empty), the recorded commands (their number, then each one's argument count and its
# arguments), the start template (start_template.py: its number of commands, 0 for none; then the
# job `timeout` field it is for, the execution id, the time as RQ's ISO string and as a float, the
# number of scores and the scores, then its commands as start_template.script_command lays them
# out: pieces and a plan), then the take: '' for none, or the suspension key and 'move' src dst |
# 'pop' n queue-keys...
# Returns {0} (a guard set is not empty: nothing written), {1} (written, no job taken; a start of
# its own: {1, the job's moves}), {2,
# queue_key, job_id, field sizes (big-endian 32-bit), fields joined, '', moves} (taken), {3, error}
# (a recorded command failed; as with EXEC, the others ran), {4, queue_key, job_id, field sizes,
# fields joined, error or '', moves} (taken and started from the template), {5} (an older call
# than the last one this worker made: it arrived late, and did nothing), {6} (a finish fenced off:
# nothing written, nothing taken) or {7} (a start fenced off: nothing written).
# The fences (herder.worker.fence has the why): a job's moves are how many times herder's recovery
# moved it from a worker (herder.common.rq_names.MOVES_LUA), noted when the worker took it (or
# started it). A start is written only while the job is still where its take put it (taken out
# of it here, so of two workers that both took it one starts it), and its moves, when noted, are
# unchanged. A finish is written while the job's moves, noted when it was taken, are unchanged:
# a cancel (`job.cancel()` while it runs) or a delete by its own code takes it out of RQ's
# registry too, and RQ writes the finish all the same. Where they were not noted, while RQ still
# has its execution started, or the job's hash has no status (deleted). Otherwise the job was
# recovered from this worker, which could not reach Redis past its lease, and may run or have
# run elsewhere: nothing of this worker's is written over that run.
# Each call's outcome is kept under the record key (its number, its code, the moves and the job it
# took), so the same call sent again after a lost reply is answered from it, never run twice; a
# job taken by it that was moved since is no longer this worker's (answered {1}).
FINISH_AND_TAKE = (
    MOVES_LUA
    + """
local i = 1
local function arg() local v = ARGV[i]; i = i + 1; return v end
local record, call_text, prefix, lease, lease_ttl = arg(), arg(), arg(), arg(), arg()
local call = tonumber(call_text)  -- exact: a double holds every integer below 2^53
-- A job this worker takes or starts is held under a live lease, renewed in the same step: a worker
-- back from a cut (its lease lapsed) must not hold a job that another host's sweep would take
-- for a dead worker's, in the moment before its next renewal.
local function hold() redis.call('SET', lease, '1', 'EX', lease_ttl) end
local function job_reply(code, queue, id, h, failed, moved)  -- the hash as two strings: one reply, not fifty
  local sizes = {}  -- packed, not written out: a number written as text costs a printf
  for k = 1, #h do sizes[k] = #h[k] end
  local packed = struct.pack('>' .. string.rep('I4', #h), unpack(sizes))
  return {code, queue, id, packed, table.concat(h), failed or '', moved}
end
-- A call asked again (its reply was lost) answers what it did the first time; an older call
-- that arrives late does nothing.
local last = redis.call('GET', record)
if last then
  local head, seq, code, mv, ql, il, fl = string.match(last, '^((%d+),(%d+),(%d+),(%d+),(%d+),(%d+),)')
  seq, code, mv = tonumber(seq), tonumber(code), tonumber(mv)
  ql, il, fl = tonumber(ql), tonumber(il), tonumber(fl)
  if call < seq then return {5} end
  if call == seq then
    local at = #head
    local queue, id = string.sub(last, at + 1, at + ql), string.sub(last, at + ql + 1, at + ql + il)
    local failed = string.sub(last, at + ql + il + 1, at + ql + il + fl)
    if code == 2 or code == 4 then
      local h = redis.call('HGETALL', prefix .. id)
      if #h == 0 then return {1} end  -- taken, then deleted by someone: nothing to run
      if moves(id) ~= mv then return {1} end  -- taken, then recovered: not this worker's
      hold()
      return job_reply(code, queue, id, h, code == 4 and failed or nil, mv)
    end
    if code == 3 then return {3, failed} end
    return {code}
  end
end
local function run()
  local fence, noted = arg(), nil
  if fence == 'F' then
    local registry, member, moved = arg(), arg(), arg()
    if moved ~= '' then  -- noted at its take: only a move of herder's took it from this worker
      local id = string.match(member, '^(.*):[^:]*$') or member
      if moves(id) ~= tonumber(moved) then return {6} end
    elseif not redis.call('ZSCORE', registry, member) then
      local id = string.match(member, '^(.*):[^:]*$') or member
      -- Not deleted (a job's heartbeat after its delete makes a hash of that field alone): recovered.
      if redis.call('HEXISTS', prefix .. id, 'status') == 1 then return {6} end
    end
  elseif fence == 'S' then  -- and the job still where its take put it: taken out of it here
    local id, moved, claim = arg(), arg(), arg()
    noted = moves(id)
    if moved ~= '' and noted ~= tonumber(moved) then return {7} end
    if claim ~= '' and redis.call('LREM', claim, 1, id) == 0 then return {7} end
  end
  for _ = 1, tonumber(arg()) do
    if redis.call('SCARD', arg()) > 0 then return {0} end
  end
  local err = nil
  for _ = 1, tonumber(arg()) do
    local n = tonumber(ARGV[i])
    local r = redis.pcall(unpack(ARGV, i + 1, i + n))
    i = i + 1 + n
    if type(r) == 'table' and r.err and not err then err = r.err end
  end
  if err then return {3, err} end
  local starts, expected, marks, first = tonumber(arg()), nil, nil, nil
  if starts > 0 then
    expected = arg()
    marks = {['\\0E'] = arg(), ['\\0I'] = arg(), ['\\0F'] = arg()}
    for k = 1, tonumber(arg()) do marks['\\0' .. string.char(96 + k)] = arg() end
    first = i
    for _ = 1, starts do i = i + 2 + tonumber(ARGV[i]) end
  end
  local function start(h, id)  -- the template filled in for this job, or nil if it is not for it
    local timeout, origin = '', nil
    for k = 1, #h, 2 do
      if h[k] == 'timeout' then timeout = h[k + 1] elseif h[k] == 'origin' then origin = h[k + 1] end
    end
    if not origin or timeout ~= expected then return nil end
    marks['\\0J'], marks['\\0Q'] = id, origin
    local failed, at = '', first
    for _ = 1, starts do  -- each command: its pieces' number, its plan, its pieces
      local plan, args = ARGV[at + 1], {}
      at = at + 2
      for k = 1, #plan do
        local c = string.byte(plan, k)
        if c == 46 then  -- '.': one piece, a marker or as it is
          local p = ARGV[at]
          args[k], at = marks[p] or p, at + 1
        else
          local parts = {}
          for m = 1, c - 48 do
            local p = ARGV[at + m - 1]
            parts[m] = marks[p] or p
          end
          args[k], at = table.concat(parts), at + c - 48
        end
      end
      local r = redis.pcall(unpack(args))
      if type(r) == 'table' and r.err and failed == '' then failed = r.err end
    end
    return failed
  end
  local mode = arg()
  if mode == '' then return {1, noted} end  -- a start of its own: the job's moves as it started
  if redis.call('EXISTS', arg()) == 1 then return {1} end
  local function taken(queue, id)
    local h = redis.call('HGETALL', prefix .. id)
    if #h == 0 then return nil end
    local failed = starts > 0 and start(h, id)
    if failed then return job_reply(4, queue, id, h, failed, moves(id)) end
    return job_reply(2, queue, id, h, nil, moves(id))
  end
  if mode == 'move' then
    local src, dst = arg(), arg()
    while true do
      local id = redis.call('LMOVE', src, dst, 'LEFT', 'RIGHT')
      if not id then return {1} end
      local job = taken(src, id)
      if job then return job end
    end
  end
  local n = tonumber(arg())
  while true do  -- as RQ: after a vanished job, pop again from the first queue
    local popped = false
    for q = i, i + n - 1 do
      local id = redis.call('LPOP', ARGV[q])
      if id then
        local job = taken(ARGV[q], id)
        if job then return job end
        popped = true
        break
      end
    end
    if not popped then return {1} end
  end
end
local reply = run()
local code, queue, id, failed, moved = reply[1], '', '', '', 0
if code == 2 or code == 4 or (code == 1 and reply[2]) then hold() end  -- taken, or started: held
if code == 2 or code == 4 then queue, id, failed, moved = reply[2], reply[3], reply[6], reply[7] end
if code == 3 then failed = reply[2] end
redis.call('SET', record, call_text .. ',' .. code .. ',' .. moved .. ',' .. #queue .. ',' .. #id .. ',' ..
  #failed .. ',' .. queue .. id .. failed, 'EX', 3600)
return reply
"""
)
SCRIPT_SHA = hashlib.sha1(FINISH_AND_TAKE.encode()).hexdigest()


class ScriptConnection:
    """The script on a connection of its own, without redis-py's per-call machinery (pool,
    retries, events: five times the cost of the call itself).

    A call whose reply is lost (a reset, a timeout: it may or may not have run) is sent again,
    the same bytes on a new connection, until Redis answers: the script answers a call it ran
    already from the call's record, so it never runs twice, and the worker learns what it did
    (the job it took above all) before it takes anything new. `waiting` is called between tries
    with the exception and the try's number; it keeps the worker's beat and progress going."""

    def __init__(self, pool: Any, waiting: Callable[[Exception, int], None]) -> None:
        self.pool = pool
        self.conn: Connection | None = None
        self.waiting = waiting

    def call(self, request: bytes) -> Any:
        tries = 0
        while True:
            conn = self.conn
            try:
                if conn is None:
                    conn = self.conn = rq_seam.pool_connection(self.pool)
                try:
                    conn.send_packed_command([request])
                    return conn.read_response()
                except NoScriptError:  # a restarted or flushed Redis: load it, then the same call
                    conn.send_command("SCRIPT", "LOAD", FINISH_AND_TAKE)
                    conn.read_response()
                    conn.send_packed_command([request])
                    return conn.read_response()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if conn is not None:
                    conn.disconnect()  # a late reply must never be read as the next call's
                    self.pool.release(conn)
                self.conn = None
                tries += 1
                self.waiting(exc, tries)

    def release(self) -> None:
        if self.conn is not None:
            self.pool.release(self.conn)
            self.conn = None
