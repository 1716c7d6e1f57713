-- GCRA over every limit of one call, all-or-nothing. A faithful port of bastion/ratelimit/gcra.py:admit.
-- KEYS[i]: bucket key of check i.  ARGV[1]: now in microseconds, or "" to read the Redis clock (the normal case;
-- an explicit time exists so the table tests can drive this script and the Python function identically).
-- ARGV[2 + 3(i-1) ..]: emission_us, burst, cost of check i.  All values are integers below 2^53, exact in doubles.
-- Returns {allowed (1|0), tripped check (1-based, 0 if none), retry_after_us, now_us}.
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local new_tats = {}
local worst = 0
local worst_retry = 0
for i = 1, #KEYS do
  local base = 2 + 3 * (i - 1)
  local emission = tonumber(ARGV[base])
  local burst = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local stored = tonumber(redis.call('GET', KEYS[i]) or '')
  local tat = now
  if stored ~= nil and stored > now then
    tat = stored
  end
  local new_tat = tat + emission * cost
  local allow_at = new_tat - emission * burst
  if allow_at > now and allow_at - now > worst_retry then
    worst = i
    worst_retry = allow_at - now
  end
  new_tats[i] = new_tat
end

if worst > 0 then
  return {0, worst, worst_retry, now}
end
for i = 1, #KEYS do
  -- %d, not tostring: tostring keeps 14 significant digits and would corrupt a microsecond timestamp.
  local ttl_ms = math.max(1, math.ceil((new_tats[i] - now) / 1000))
  redis.call('SET', KEYS[i], string.format('%d', new_tats[i]), 'PX', ttl_ms)
end
return {1, 0, 0, now}
