-- Take one lease on every concurrency cap of a call, all-or-nothing.
-- KEYS[i]: sorted set of cap i (member = lease id, score = expiry in ms on the Redis clock).
-- ARGV[1]: lease id, ARGV[2]: lease ttl in ms, ARGV[2 + i]: max of cap i.
-- Returns 0 when taken, else the 1-based index of the first full cap (nothing taken).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[2])
for i = 1, #KEYS do
  -- Leases of dead replicas stop counting here, once their heartbeat has stopped extending them.
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[2 + i]) then
    return i
  end
end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], expiry, ARGV[1])
  redis.call('PEXPIREAT', KEYS[i], math.max(expiry, tonumber(redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')[2])))
end
return 0
