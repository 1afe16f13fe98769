-- lkv_lookup(blocks, ids, names, packed, filter): packed block hashes (8 bytes each) and the replica
-- names to consider (an empty table: all). Returns a flat list: name, gpu, cpu, storage, name, ...
-- The chunk size placeholder below is replaced by LOOKUP_CHUNK when the file is read.
local function lkv_lookup(blocks, ids, names, packed, filter)
  local allow = nil
  if #filter > 0 then
    allow = {}
    local any = false
    for i = 1, #filter do
      local id = redis.call('HGET', ids, filter[i])
      if id then allow[tonumber(id)] = true; any = true end
    end
    if not any then return {} end
  end
  -- Replicas still matching: {id, counts per tier, the three entry prefixes to look for}.
  local active = nil
  local alive = 0
  local prev_v, prev_tiers = nil, {}
  local n = #packed / 8
  local chunk = tonumber(__CHUNK__)
  local i = 1
  local stop = false
  while i <= n and not stop do
    local j = math.min(i + chunk - 1, n)
    local fields = {}
    for k = i, j do fields[k - i + 1] = string.sub(packed, 8 * k - 7, 8 * k) end
    local vals = redis.call('HMGET', blocks, unpack(fields))
    for k = 1, #vals do
      local v = vals[k]
      if not v then stop = true; break end
      if active == nil then
        -- First block: every replica holding it starts a match at its fastest tier.
        local best = {}
        for code in string.gmatch(v, ';(%d+):') do
          code = tonumber(code)
          local id, tier = math.floor(code / 4), code % 4
          if (allow == nil or allow[id]) and (best[id] == nil or tier < best[id]) then best[id] = tier end
        end
        active = {}
        for id, tier in pairs(best) do
          -- A purged replica's id has no name any more; its entries await the sweep: skip them.
          local name = redis.call('HGET', names, id)
          if name then
            local c = {0, 0, 0}
            c[tier + 1] = 1
            local b = id * 4
            table.insert(active, {id, c, ';' .. b .. ':', ';' .. (b + 1) .. ':', ';' .. (b + 2) .. ':', true, name})
            alive = alive + 1
          end
        end
      else
        -- Consecutive blocks mostly have the same holders, so the same value string (Lua strings are
        -- interned: comparing them is a pointer test): reuse the tiers found for the previous block.
        if v ~= prev_v then
          prev_v = v
          for x, a in ipairs(active) do
            if a[6] then
              if string.find(v, a[3], 1, true) then prev_tiers[x] = 1
              elseif string.find(v, a[4], 1, true) then prev_tiers[x] = 2
              elseif string.find(v, a[5], 1, true) then prev_tiers[x] = 3
              else prev_tiers[x] = 0 end
            end
          end
        end
        for x, a in ipairs(active) do
          if a[6] then
            local t = prev_tiers[x]
            if t > 0 then a[2][t] = a[2][t] + 1 else a[6] = false; alive = alive - 1 end
          end
        end
      end
      if alive == 0 then stop = true; break end
    end
    i = j + 1
  end
  local out = {}
  for _, a in ipairs(active or {}) do
    table.insert(out, a[7]); table.insert(out, a[2][1]); table.insert(out, a[2][2]); table.insert(out, a[2][3])
  end
  return out
end
