-- gpubox gateway (roles/llm_gateway): what the gateway reads of an OpenAI request body, for HAProxy 2.6's Lua.
--
-- HAProxy has no JSON reader that can tell where a key sits or whether it is written twice, so this action reads
-- the body's top-level object itself (HAProxy can run Lua, not Python). It never changes the request. It sets:
--   txn.gpubox_model       the top-level "model" string, decoded as Python's json module decodes it (escapes,
--                          \uXXXX and surrogate pairs), wherever it sits in the object;
--   txn.gpubox_body_error  why the body cannot be routed: not_json (not one JSON object, or a control character in
--                          a string), no_model, model_not_string, duplicate_model (vLLM's json.loads would keep the
--                          last one, this gateway would have to guess), model_too_long, too_large (the body filled
--                          the buffer before its object ended);
--   txn.gpubox_prefix      the key of prefix-aware placement (gpubox_place below; balance hash without it): the
--                          conversation as sent, the value of "messages" (chat), else "prompt" (completions), else
--                          "input" (responses, embeddings); where that value is an array of messages, only up to the
--                          end of its first message whose "role" is "user" (the system prompt(s) and the first
--                          question: what every turn of a chat starts with, so that its turns keep one key); at most
--                          its first N bytes (the action's argument).
-- Nested values are skipped without recursion (a body nested 100,000 deep costs one pass), strings by jumping from
-- one quote or backslash to the next. What is not JSON outside the top-level keys it reads is left to vLLM, which
-- refuses it with its own 400: nothing this action accepts can reach a pool other than the model it names.
-- tests/integration/test_gateway_pools.py runs it in the real HAProxy against Python's json on the same bodies.

local MAX_MODEL = 256
local CONVERSATION_KEYS = { messages = 1, prompt = 2, input = 3 }
local ESCAPES = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

local function skip_ws(s, i)
  return string.find(s, "[^ \t\r\n]", i) or (#s + 1)
end

-- The string whose opening quote is at i: its decoded text and the index after its closing quote, or nil and
-- "end" (the data ran out) or "bad" (not a JSON string).
local function read_string(s, i)
  local out, j = {}, i + 1
  while true do
    local k = string.find(s, '[\0-\31"\\]', j)
    if not k then return nil, "end" end
    if k > j then out[#out + 1] = string.sub(s, j, k - 1) end
    local c = string.sub(s, k, k)
    if c == '"' then return table.concat(out), k + 1 end
    if c ~= "\\" then return nil, "bad" end  -- a raw control character (json.loads' strict mode refuses it)
    local e = string.sub(s, k + 1, k + 1)
    if e == "" then return nil, "end" end
    if e == "u" then
      local hex = string.sub(s, k + 2, k + 5)
      if #hex < 4 then return nil, "end" end
      if not string.match(hex, "^%x%x%x%x$") then return nil, "bad" end
      local cp, after = tonumber(hex, 16), k + 6
      if cp >= 0xD800 and cp <= 0xDBFF then
        local low = string.match(s, "^\\u(%x%x%x%x)", after)
        low = low and tonumber(low, 16)
        if low and low >= 0xDC00 and low <= 0xDFFF then
          cp, after = 0x10000 + (cp - 0xD800) * 0x400 + (low - 0xDC00), after + 6
        end
      end
      out[#out + 1] = utf8.char(cp)
      j = after
    else
      local r = ESCAPES[e]
      if not r then return nil, "bad" end
      out[#out + 1] = r
      j = k + 2
    end
  end
end

-- The index after the string whose opening quote is at i (not decoded), or nil when the data ran out.
local function skip_string(s, i)
  local j = i + 1
  while true do
    local k = string.find(s, '["\\]', j)
    if not k then return nil end
    if string.sub(s, k, k) == '"' then return k + 1 end
    j = k + 2
  end
end

-- The index after the value that starts at i (i is not white space), or nil when the data ran out.
local function skip_value(s, i)
  local c = string.sub(s, i, i)
  if c == '"' then return skip_string(s, i) end
  if c == "{" or c == "[" then
    local depth, j = 0, i
    while true do
      local k = string.find(s, '["{}%[%]]', j)
      if not k then return nil end
      local d = string.sub(s, k, k)
      if d == '"' then
        j = skip_string(s, k)
        if not j then return nil end
      else
        depth = depth + ((d == "{" or d == "[") and 1 or -1)
        j = k + 1
        if depth == 0 then return j end
      end
    end
  end
  -- a number, true, false, null (or what vLLM will refuse): up to the next separator of this object
  local k = string.find(s, "[,}%s]", i)
  return k
end

-- The index of the "}" that closes the first object of the array at i (its "[") whose "role" is "user" (the last
-- "role" of the object, as Python's json keeps it), or nil when there is none or the array is not read whole
-- before index stop (the key is cut there anyway). The array was already skipped whole by skip_value.
local function first_user_end(s, i, stop)
  i = skip_ws(s, i + 1)
  while i <= stop do
    local c = string.sub(s, i, i)
    if c ~= "{" then
      if c == "]" then return nil end
      local after = skip_value(s, i)
      if not after then return nil end
      i = after
    else
      local role
      i = skip_ws(s, i + 1)
      while string.sub(s, i, i) == '"' do
        local key, after = read_string(s, i)
        if not key then return nil end
        i = skip_ws(s, after)
        if string.sub(s, i, i) ~= ":" then return nil end
        i = skip_ws(s, i + 1)
        if key == "role" and string.sub(s, i, i) == '"' then
          role, after = read_string(s, i)
          if not role then return nil end
        else
          if key == "role" then role = nil end
          after = skip_value(s, i)
          if not after then return nil end
        end
        i = skip_ws(s, after)
        if string.sub(s, i, i) ~= "," then break end
        i = skip_ws(s, i + 1)
      end
      if string.sub(s, i, i) ~= "}" then return nil end
      if role == "user" then return i end
      i = i + 1
    end
    i = skip_ws(s, i)
    if string.sub(s, i, i) ~= "," then return nil end
    i = skip_ws(s, i + 1)
  end
  return nil
end

-- Reads the body's top-level object: (model, error, conversation value start, end).
local function read_body(s)
  local i = skip_ws(s, 1)
  if string.sub(s, i, i) ~= "{" then return nil, "not_json" end
  i = skip_ws(s, i + 1)
  local model, seen, conv_rank, conv_from, conv_to = nil, false, 99, nil, nil
  if string.sub(s, i, i) == "}" then i = i + 1 else
    while true do
      if i > #s then return nil, "end" end
      if string.sub(s, i, i) ~= '"' then return nil, "not_json" end
      local key, after = read_string(s, i)
      if not key then return nil, (after == "end") and "end" or "not_json" end
      i = skip_ws(s, after)
      if i > #s then return nil, "end" end
      if string.sub(s, i, i) ~= ":" then return nil, "not_json" end
      i = skip_ws(s, i + 1)
      if i > #s then return nil, "end" end
      local value_end
      if key == "model" then
        if seen then return nil, "duplicate_model" end
        seen = true
        if string.sub(s, i, i) == '"' then
          local text, stop = read_string(s, i)
          if not text then return nil, (stop == "end") and "end" or "not_json" end
          model, value_end = text, stop
        else
          value_end = skip_value(s, i)
          if not value_end then return nil, "end" end
          model = false
        end
      else
        value_end = skip_value(s, i)
        if not value_end then return nil, "end" end
        local rank = CONVERSATION_KEYS[key]
        if rank and rank < conv_rank then conv_rank, conv_from, conv_to = rank, i, value_end - 1 end
      end
      i = skip_ws(s, value_end)
      local c = string.sub(s, i, i)
      if c == "}" then i = i + 1; break end
      if c == "" then return nil, "end" end
      if c ~= "," then return nil, "not_json" end
      i = skip_ws(s, i + 1)
    end
  end
  if skip_ws(s, i) <= #s then return nil, "not_json" end
  if model == nil then return nil, "no_model" end
  if model == false then return nil, "model_not_string" end
  if #model == 0 or #model > MAX_MODEL then return nil, "model_too_long" end
  return model, nil, conv_from, conv_to
end

-- Arguments: the bytes of the placement key, and the largest body the gateway takes (llm_gateway_max_body_bytes:
-- a body that has not ended by then is too large; the configuration refuses a larger Content-Length before).
core.register_action("gpubox_route", { "http-req" }, function(txn, prefix_bytes, max_body)
  local body = txn.sf:req_body() or ""
  local model, err, from, to = read_body(body)
  if err == "end" then
    err = (#body >= tonumber(max_body)) and "too_large" or "not_json"
  end
  if err then
    txn:set_var("txn.gpubox_body_error", err)
    return
  end
  txn:set_var("txn.gpubox_model", model)
  if from then
    local last = math.min(to, from + tonumber(prefix_bytes) - 1)
    if string.sub(body, from, from) == "[" then last = math.min(last, first_user_end(body, from, last) or last) end
    txn:set_var("txn.gpubox_prefix", string.sub(body, from, last))
  end
end, 2)

-- Prefix placement with homes (llm_gateway_placement: prefix). `balance hash` alone puts each key where its hash
-- falls, so with a few long prompts the boxes hold unequal numbers of them (16 keys on 3 boxes: 7/5/4 or worse in
-- most draws, docs/design.md), and the box with the most cannot hold them all in its prefix cache. Here each key has
-- a home box, and no box is home to more than its share of the pool's keys (by weight, rounded up); a key goes to
-- the first box in its own order (a rendezvous hash of key and box: the same for that key wherever HAProxy runs) that
-- is below its share. A request goes to its key's home unless the home holds its share of the pool's requests in
-- flight (the first argument, llm_gateway_hash_balance_factor, counted as HAProxy's hash-balance-factor: percent of
-- the mean, the request being placed included); then to the first box in the key's order below it. Only boxes that
-- take new requests count: up, neither drained nor in maintenance, weight above 0 (a canary's share is its weight).
-- A home that stops taking requests, or holds more than its share after boxes came back, gives its keys new homes
-- as their requests come. A key unused for one to two generations (the second argument, in seconds) is forgotten.
-- The homes live in this HAProxy process (one Lua state for all its threads): a reload or restart forgets them, and
-- keys find homes again in the order they come. It sets txn.gpubox_box, read by the backend's use-server rules; with
-- no key (or no box up) it sets nothing and HAProxy's own balance places the request.
local HOMES_MAX = 65536  -- keys per pool; past it a new key has no home and goes by its order and the load bound
local pools = {}

-- splitmix64's finalizer: spreads a 64-bit integer's bits over all of them (Lua 5.3 integers wrap around).
local function mix(x)
  x = (x ~ (x >> 30)) * 0xbf58476d1ce4e5b9
  x = (x ~ (x >> 27)) * 0x94d049bb133111eb
  return x ~ (x >> 31)
end

-- FNV-1a, 64 bits.
local function fnv(s)
  local h = 0xcbf29ce484222325
  for i = 1, #s do h = (h ~ string.byte(s, i)) * 0x100000001b3 end
  return h
end

-- A pool's homes in two generations, {key: box} each with its count per box: a key used goes to (or stays in) the
-- newer one; every generation the older one is dropped whole, so forgetting costs nothing per key.
local function pool_of(name, now, generation)
  local pool = pools[name]
  if pool == nil or now - pool.rotated >= 2 * generation then
    pool = { new = {}, old = {}, new_n = {}, old_n = {}, n = 0, rotated = now }
    pools[name] = pool
  elseif now - pool.rotated >= generation then
    for _, count in pairs(pool.old_n) do pool.n = pool.n - count end
    pool.old, pool.old_n, pool.new, pool.new_n, pool.rotated = pool.new, pool.new_n, {}, {}, now
  end
  return pool
end

-- A box's place in every key's order: its name's hash, computed once per name.
local name_ids = setmetatable({}, { __index = function(ids, name) ids[name] = fnv(name) return ids[name] end })

local function keys_of(pool, box)
  return (pool.new_n[box] or 0) + (pool.old_n[box] or 0)
end

-- The key's home box, or nil; a key of the older generation moves to the newer.
local function home_of(pool, id)
  local box = pool.new[id]
  if box == nil then
    box = pool.old[id]
    if box ~= nil then
      pool.old[id], pool.old_n[box] = nil, pool.old_n[box] - 1
      pool.new[id], pool.new_n[box] = box, (pool.new_n[box] or 0) + 1
    end
  end
  return box
end

local function set_home(pool, id, box)
  local was = pool.new[id]
  if was ~= nil then pool.new_n[was], pool.n = pool.new_n[was] - 1, pool.n - 1 end
  pool.new[id] = box
  if box ~= nil then pool.new_n[box], pool.n = (pool.new_n[box] or 0) + 1, pool.n + 1 end
end

-- Arguments: llm_gateway_hash_balance_factor (0: no load bound) and the homes' generation in seconds.
core.register_action("gpubox_place", { "http-req" }, function(txn, factor, generation)
  local key, pool_name = txn:get_var("txn.gpubox_prefix"), txn.f:be_name()
  local backend = core.backends[pool_name]
  if key == nil or key == "" or backend == nil then return end
  local id = fnv(key)
  local boxes, by_name, weight, load = {}, {}, 0, 0
  for name, server in pairs(backend.servers) do
    local stats = server:get_stats()
    local w, status = tonumber(stats.weight) or 0, stats.status or ""
    if w > 0 and (string.sub(status, 1, 2) == "UP" or status == "no check") then
      local box = { name = name, weight = w, load = tonumber(stats.scur) or 0, rank = mix(id ~ name_ids[name]) }
      boxes[#boxes + 1], by_name[name] = box, box
      weight, load = weight + w, load + box.load
    end
  end
  if #boxes == 0 then return end
  table.sort(boxes, function(a, b) return a.rank < b.rank end)
  local pool = pool_of(pool_name, core.now().sec, tonumber(generation))
  local function share(box, n) return math.ceil(n * box.weight / weight) end
  local home = home_of(pool, id)
  if home ~= nil and (by_name[home] == nil or keys_of(pool, home) > share(by_name[home], pool.n)) then
    set_home(pool, id, nil)
    home = nil
  end
  if home == nil and pool.n < HOMES_MAX then
    for _, box in ipairs(boxes) do
      if keys_of(pool, box.name) < share(box, pool.n + 1) then
        home = box.name
        set_home(pool, id, home)
        break
      end
    end
  end
  local target = by_name[home] or boxes[1]
  local bound = tonumber(factor) or 0
  if bound > 0 then
    local slots = math.ceil((load + 1) * bound / 100)
    local function below(box) return box.load < math.max(1, math.ceil(slots * box.weight / weight)) end
    if not below(target) then
      for _, box in ipairs(boxes) do
        if below(box) then target = box break end
      end
    end
  end
  txn:set_var("txn.gpubox_box", target.name)
end, 2)
