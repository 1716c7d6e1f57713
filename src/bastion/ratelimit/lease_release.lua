-- Drop one lease from every concurrency cap it was taken on.
-- KEYS[i]: sorted set of cap i; ARGV[1]: lease id. Returns 0.
for i = 1, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[1])
end
return 0
