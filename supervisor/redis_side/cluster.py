"""Several hosts, one Redis: a cluster-wide worker cap that is never exceeded.

Each master registers its host id with a TTL and *reserves* worker capacity in one
atomic Lua script per scale interval (docs/scaling.md, "Many hosts"):

- hosts whose TTL ran out are forgotten, with their reservations;
- a host's reservation is max(workers it still runs, workers it was granted);
- a host is granted min(what it wants, cap - what the other live hosts reserve).

A host only spawns within its grant and counts a stopping worker until it has exited,
so the sum of reservations, and so of running workers, stays <= the cap at every
instant. What each host *wants* is its deterministic share of the cluster-wide
desired count (`share_of`): live host ids sorted, the remainder going to the first
ones, so two hosts never both take the same share.

The clock is Redis's own (TIME), so hosts with skewed clocks still agree on who is live.
"""

from __future__ import annotations

from dataclasses import dataclass

# KEYS[1] hosts zset (id -> expiry), KEYS[2] reservations hash (id -> workers)
# ARGV: host id, target (workers this host keeps), running, ttl seconds, cap
RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local me, target, running = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, id in ipairs(dead) do redis.call('HDEL', KEYS[2], id) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, me)
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) * 2)
redis.call('EXPIRE', KEYS[2], math.ceil(ttl) * 2)
local others = 0
local hosts = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(hosts) do
  if id ~= me then others = others + tonumber(redis.call('HGET', KEYS[2], id) or '0') end
end
local grant = math.max(0, math.min(target, cap - others))
redis.call('HSET', KEYS[2], me, math.max(running, grant))
table.sort(hosts)
return {grant, others, unpack(hosts)}
"""

HOSTS_KEY = "herder:cluster:hosts"
RESERVED_KEY = "herder:cluster:reserved"


@dataclass(frozen=True)
class Grant:
    granted: int  # workers this host may run
    hosts: tuple[str, ...]  # live host ids, sorted


def parse_grant(reply: list) -> Grant:
    granted, _others, *hosts = reply  # the script also says what the others reserve
    return Grant(int(granted), tuple(h.decode() if isinstance(h, bytes) else h for h in hosts))


def share_of(total: int, hosts: tuple[str, ...], me: str) -> int:
    """This host's deterministic share of `total` workers among the live `hosts`."""
    if me not in hosts:
        hosts = tuple(sorted((*hosts, me)))
    n = len(hosts)
    index = hosts.index(me)
    return total // n + (1 if index < total % n else 0)
