-- Extend one lease on every cap of a call. Re-adds a lease that vanished (Redis restarted, or the heartbeat was
-- late) so the count stays true for calls still in flight.
-- KEYS[i]: sorted set of cap i. ARGV[1]: lease id, ARGV[2]: lease ttl in ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[2])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], expiry, ARGV[1])
  redis.call('PEXPIREAT', KEYS[i], math.max(expiry, tonumber(redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')[2])))
end
return 0
