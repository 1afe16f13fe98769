-- The lookup alone. KEYS: blocks, ids, names   ARGV: packed block hashes, then replica filter names
local filter = {}
for i = 2, #ARGV do filter[i - 1] = ARGV[i] end
return lkv_lookup(KEYS[1], KEYS[2], KEYS[3], ARGV[1], filter)
