-- distlab.workload — real-shaped inputs: the experts each token picks and the
-- lengths of the sequences a batch packs (thd), drawn from a distribution
-- or read from a file, so a run can replay the routing and the sequence mix
-- of a user's own model.
--
--   ids = dl.workload.routing{tokens = T, experts = E, topk = K, dist = "zipf" | "uniform",
--           s = 1.0, seed = 1, layer = 0, rank = 0, device =}            i64 [T, K]
--       K distinct experts a token, drawn one after another without
--       replacement. zipf: expert popularity 1 / i^s over a permutation of the
--       experts drawn from (seed, layer) — each layer has its own hot experts,
--       the same on every rank — and each rank's tokens from (seed, layer, rank)
--   ids = dl.workload.routing{file = "topk.npy", tokens = T, experts = E, topk = K,
--           layer = 0, rank = 0, device =}
--       top-k ids saved from a model (anything dl.load reads: .npy, or the first
--       tensor of a .safetensors), integer [tokens, K] or [layers, tokens, K]
--       (layer picks one); rank r takes rows r T .. (r + 1) T - 1, wrapping
--       around the file's tokens; ids in [0, E), -1 for none
--   lens = dl.workload.seqlens{total = S, multiple = m, dist = "fixed" | "uniform" | "lognormal",
--           mean = 1024, sigma = 1.0, min = 1, max = S, seed = 1}
--   lens = dl.workload.seqlens{file = "lens.npy", total = S, multiple = m}
--       a Lua list of sequence lengths whose padded sizes (each rounded up to a
--       multiple of m: thd context parallelism needs 2C) add up to exactly S;
--       the last sequence is cut to fit (a file is read from its start, again
--       from the start when it runs out). lognormal: exp(N(log mean - sigma^2/2,
--       sigma)), mean its mean; uniform: min .. max
--   cu, cu_padded = dl.workload.cu_seqlens(lens, m)   Lua lists of b + 1 offsets from 0
--   st = dl.workload.routing_stats(ids, experts)
--       {counts (a list), max, mean, imbalance = max / mean, none (the -1 entries)}
--
-- Random numbers come from dl.rand's counter-based generator on the host
-- (the same on every device and run for the same seed).
local core = require "distlab.core"
local args = require "distlab.args"
local create = require "distlab.create"
local tmath = require "distlab.tensor_math"

local fail = core.fail
local M = {}

-- n uniforms in [0, 1) for this stream of (seed, parts...)
local function uniforms(n, seed, ...)
  local s = seed
  for i = 1, select("#", ...) do s = (s * 1000003 + select(i, ...) + 1) % 2 ^ 52 end
  if n == 0 then return {} end
  return create.rand({ n }, { dtype = "f64", device = "cpu", seed = s }):tolist()
end

local function normals(n, seed, ...)
  local s = seed
  for i = 1, select("#", ...) do s = (s * 1000003 + select(i, ...) + 1) % 2 ^ 52 end
  if n == 0 then return {} end
  return create.randn({ n }, { dtype = "f64", device = "cpu", seed = s }):tolist()
end

-- ---- routing ------------------------------------------------------------------------

local ROUTING_KEYS = { tokens = true, experts = true, topk = true, dist = true, s = true, seed = true, layer = true,
  rank = true, device = true, file = true }

local function from_file(o, T, E, K)
  local ok, t = pcall(require("distlab.io").load, o.file, { device = "cpu" })
  if not ok then fail("workload.routing: cannot read %s: %s", o.file, tostring(t)) end
  if type(t) == "table" and not require("distlab.tensor").is_tensor(t) then
    local name = next(t)
    if name == nil then fail("workload.routing: %s holds no tensor", o.file) end
    t = t[name]
  end
  if t.dtype ~= "i64" and t.dtype ~= "i32" and t.dtype ~= "u8" then
    fail("workload.routing: %s holds %s; top-k ids must be integers", o.file, t.dtype)
  end
  if t.nd == 3 then
    local layer = args.int(o.layer or 0, "workload.routing: layer", 0)
    if layer >= t.shape[1] then fail("workload.routing: layer %d, but %s has %d layers", layer, o.file, t.shape[1]) end
    t = t:select(1, layer + 1)
  elseif t.nd ~= 2 then
    fail("workload.routing: %s is [%s]; expected [tokens, K] or [layers, tokens, K]", o.file, table.concat(t.shape, ", "))
  end
  if t.shape[2] ~= K then fail("workload.routing: %s has %d ids a token, the block routes to %d", o.file, t.shape[2], K) end
  local n = t.shape[1]
  local rows = t:i64():contiguous():tolist()
  local out, start = {}, (args.int(o.rank or 0, "workload.routing: rank", 0) * T) % n
  for i = 1, T do
    local row = rows[(start + i - 1) % n + 1]
    for k = 1, K do
      if row[k] < -1 or row[k] >= E then
        fail("workload.routing: %s: token %d has expert %d, outside [0, %d)", o.file, (start + i - 1) % n, row[k], E)
      end
    end
    out[i] = row
  end
  return out
end

-- a random permutation of 1..n (Fisher-Yates)
local function permutation(n, u)
  local p = {}
  for i = 1, n do p[i] = i end
  for i = n, 2, -1 do
    local j = math.floor(u[i] * i) + 1
    p[i], p[j] = p[j], p[i]
  end
  return p
end

local function drawn(o, T, E, K)
  local dist = o.dist or "zipf"
  if dist ~= "zipf" and dist ~= "uniform" then fail("workload.routing: dist %q (zipf or uniform)", tostring(dist)) end
  local seed, layer = o.seed or 1, args.int(o.layer or 0, "workload.routing: layer", 0)
  local rank = args.int(o.rank or 0, "workload.routing: rank", 0)
  local s = dist == "zipf" and (o.s or 1.0) or 0
  local perm = permutation(E, uniforms(E, seed, layer, 0x51ed))
  local weight = {} -- weight[e]: popularity of expert e (0-based), 1/i^s for its place i in the permutation
  for i = 1, E do weight[perm[i] - 1] = 1 / i ^ s end
  local u = uniforms(T * K, seed, layer, rank)
  local out = {}
  for t = 1, T do
    local row, taken, left = {}, {}, 0
    for e = 0, E - 1 do left = left + weight[e] end
    for k = 1, K do
      local x, pick = u[(t - 1) * K + k] * left, nil
      for e = 0, E - 1 do
        if not taken[e] then
          pick = e
          x = x - weight[e]
          if x < 0 then break end
        end
      end
      taken[pick] = true
      left = left - weight[pick]
      row[k] = pick
    end
    out[t] = row
  end
  return out
end

function M.routing(o)
  o = args.options(o, ROUTING_KEYS, "workload.routing")
  local T = args.int(o.tokens, "workload.routing: tokens", 0)
  local E = args.int(o.experts, "workload.routing: experts", 1)
  local K = args.int(o.topk, "workload.routing: topk", 1, E)
  local rows = o.file and from_file(o, T, E, K) or drawn(o, T, E, K)
  local t = create.from_table(T > 0 and rows or {}, { dtype = "i64", device = "cpu" })
  if T == 0 then t = create.empty({ 0, K }, { dtype = "i64", device = "cpu" }) end
  return o.device and t:to(o.device) or t
end

function M.routing_stats(ids, E)
  local counts = tmath.bincount(ids:contiguous():view(ids:numel()), E):tolist()
  local mx, sum = 0, 0
  for _, c in ipairs(counts) do
    mx = math.max(mx, c)
    sum = sum + c
  end
  local mean = sum / E
  return { counts = counts, max = mx, mean = mean, imbalance = mean > 0 and mx / mean or 0, none = ids:numel() - sum }
end

-- ---- sequence lengths ------------------------------------------------------------------

local SEQ_KEYS = { total = true, multiple = true, dist = true, mean = true, sigma = true, min = true, max = true,
  seed = true, file = true }

local function round_up(n, m) return math.ceil(n / m) * m end

function M.seqlens(o)
  o = args.options(o, SEQ_KEYS, "workload.seqlens")
  local S = args.int(o.total, "workload.seqlens: total", 1)
  local m = args.int(o.multiple or 1, "workload.seqlens: multiple", 1)
  if S % m ~= 0 then fail("workload.seqlens: total %d is not a multiple of %d", S, m) end
  local source
  if o.file then
    local ok, t = pcall(require("distlab.io").load, o.file, { device = "cpu" })
    if not ok then fail("workload.seqlens: cannot read %s: %s", o.file, tostring(t)) end
    local list = t:i64():contiguous():view(t:numel()):tolist()
    if #list == 0 then fail("workload.seqlens: %s holds no lengths", o.file) end
    for i, n in ipairs(list) do
      if n < 1 then fail("workload.seqlens: %s: length %d at %d (lengths must be positive)", o.file, n, i - 1) end
    end
    local i = 0
    source = function() i = i % #list + 1 return list[i] end
  else
    local dist, seed = o.dist or "lognormal", o.seed or 1
    local lo, hi = args.int(o.min or 1, "workload.seqlens: min", 1), args.int(o.max or S, "workload.seqlens: max", 1)
    local mean = o.mean or math.max(1, math.floor(S / 8))
    local batch, pos, nb, u = 1024, 0, 0, {}
    local function next_u()
      pos = pos + 1
      if pos > #u then
        nb = nb + 1
        u = dist == "lognormal" and normals(batch, seed, nb) or uniforms(batch, seed, nb)
        pos = 1
      end
      return u[pos]
    end
    if dist == "fixed" then
      source = function() return math.max(1, math.floor(mean)) end
    elseif dist == "uniform" then
      source = function() return lo + math.floor(next_u() * (hi - lo + 1)) end
    elseif dist == "lognormal" then
      local sigma = o.sigma or 1.0
      local mu = math.log(mean) - sigma * sigma / 2
      source = function() return math.max(lo, math.min(hi, math.floor(math.exp(mu + sigma * next_u()) + 0.5))) end
    else
      fail("workload.seqlens: dist %q (fixed, uniform or lognormal)", tostring(dist))
    end
  end
  local lens, used = {}, 0
  while used < S do
    local n = source()
    if used + round_up(n, m) > S then n = S - used end
    lens[#lens + 1] = n
    used = used + round_up(n, m)
  end
  return lens
end

function M.cu_seqlens(lens, m)
  m = m or 1
  local cu, cup = { 0 }, { 0 }
  for i, n in ipairs(lens) do
    cu[i + 1] = cu[i] + n
    cup[i + 1] = cup[i] + round_up(n, m)
  end
  return cu, cup
end

return M
