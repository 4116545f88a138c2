"""The one script of the fast path: a job's finish, the next job taken, and its start, in one call.

Redis runs it atomically, so a finish and the take that follows it are one step to every other
client: nothing sees a worker between jobs that has finished one and not yet taken the next.
ARGV layout and replies are below; the worker frames the call itself (wire.py) and sends it on
a connection of its own (ScriptConnection).
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from herder.common import rq_seam

# The finish RQ built, then the next job and its start. ARGV: the guards (their number, then
# the sets that must be empty), the recorded commands (their number, then each one's argument
# count and its arguments), the start template (herder.worker.start_template: its number of
# commands, 0 for none; then the job `timeout` field it is for, the execution id, the time as
# RQ's ISO string and as a float, the number of scores and the scores, then its commands as
# the recorded ones), then the take: '' for none, or the suspension key, the job key prefix and
# 'move' src dst | 'pop' n queue-keys...
# Returns {0} (a guard set is not empty: nothing written), {1} (written, no job taken),
# {2, queue_key, job_id, field sizes, fields joined} (taken), {3, error} (a recorded command
# failed; as with EXEC, the others ran) or {4, queue_key, job_id, field sizes, fields joined,
# error or ''} (taken and started from the template).
FINISH_AND_TAKE = """
local i = 1
local function arg() local v = ARGV[i]; i = i + 1; return v end
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
  marks = {E = arg(), I = arg(), F = arg()}
  for k = 1, tonumber(arg()) do marks[string.char(96 + k)] = arg() end
  first = i
  for _ = 1, starts do i = i + 1 + tonumber(ARGV[i]) end
end
local function start(h, id)  -- the template filled in for this job, or nil if it is not for it
  local timeout, origin = '', nil
  for k = 1, #h, 2 do
    if h[k] == 'timeout' then timeout = h[k + 1] elseif h[k] == 'origin' then origin = h[k + 1] end
  end
  if not origin or timeout ~= expected then return nil end
  marks.J, marks.Q = id, origin
  local failed, at = '', first
  for _ = 1, starts do
    local n, args = tonumber(ARGV[at]), {}
    for k = 1, n do
      local a = ARGV[at + k]
      if string.find(a, '\\0', 1, true) then a = (string.gsub(a, '%z(.)', marks)) end
      args[k] = a
    end
    local r = redis.pcall(unpack(args))
    if type(r) == 'table' and r.err and failed == '' then failed = r.err end
    at = at + 1 + n
  end
  return failed
end
local mode = arg()
if mode == '' then return {1} end
if redis.call('EXISTS', arg()) == 1 then return {1} end
local prefix = arg()
local function taken(queue, id)  -- the hash as two strings: parsing one reply of fifty is the cost
  local h = redis.call('HGETALL', prefix .. id)
  if #h == 0 then return nil end
  local sizes = {}
  for k = 1, #h do sizes[k] = #h[k] end
  local failed = starts > 0 and start(h, id)
  if failed then return {4, queue, id, table.concat(sizes, ','), table.concat(h), failed} end
  return {2, queue, id, table.concat(sizes, ','), table.concat(h)}
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
"""
SCRIPT_SHA = hashlib.sha1(FINISH_AND_TAKE.encode()).hexdigest()


class ScriptConnection:
    """The script on a connection of its own, without redis-py's per-call machinery (pool,
    retries, events: five times the cost of the call itself). A lost connection is not retried:
    a script sent twice would write twice. The error goes up, as RQ's own would."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.conn: Connection | None = None

    def call(self, request: bytes) -> Any:
        conn = self.conn
        if conn is None:
            conn = self.conn = rq_seam.pool_connection(self.pool)
        try:
            try:
                conn.send_packed_command([request])
                return conn.read_response()
            except NoScriptError:  # a restarted or flushed Redis: load it, then the same call
                conn.send_command("SCRIPT", "LOAD", FINISH_AND_TAKE)
                conn.read_response()
                conn.send_packed_command([request])
                return conn.read_response()
        except (RedisConnectionError, RedisTimeoutError):
            conn.disconnect()  # the next call connects again
            raise

    def release(self) -> None:
        if self.conn is not None:
            self.pool.release(self.conn)
            self.conn = None
