-- spec/ep/nccl_equiv.lua [calls] — ours and nccl_ep (NVIDIA's NCCL EP behind
-- dl.ep.buffer) on the EP spec's cases: ids of -1, every expert of a token on
-- one rank, tokens with no expert, T = 0, 1, B and varying per rank, for each
-- of nccl_ep's configurations beside the one of ours it maps to (low latency
-- expert_major and rank_major, bf16 and fp8, against per_rank; high throughput
-- expert_major against expert_major, flat against rank_major); then `calls`
-- (default 1000) calls alternating between ours and nccl_ep and among the
-- configurations, new routing and data every call. Dispatch: both deliver the
-- same rows to the same experts (order within an expert free): bf16 rows
-- checked exactly against the routing, each backend (nccl_ep's in our shape,
-- distlab.bench.ep_nccl_ref), fp8 rows dequantized and matched between the two
-- within twice the format's bound. Combine: both against the fp64 reference
-- (X.check_combine for ours) and nccl_ep's against ours within the normwise
-- bound (bf16 2^-7, fp8 X.tol.fp8). Prints "nccl_equiv ok" per rank, or
-- "nccl_equiv skipped: <why>" on every rank where NCCL EP cannot run (no NCCL
-- communicator, library or NCCL new enough): ep_nccl_spec.lua counts it pending.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local X = dofile(dir .. "/common.lua")
local ffi = require "ffi"
local dl = require "distlab"
local nref = require "distlab.bench.ep_nccl_ref"

local N, me = X.N, X.me
local calls = tonumber(arg[1] or "1000")

local function skip(why)
  print("nccl_equiv skipped: " .. why:gsub("\n", " "))
  os.exit(0)
end
if X.w.backend ~= "nccl" then
  skip(string.format("nccl_ep runs on an NCCL communicator, one rank a GPU; this job's is %s on %s", X.w.backend,
    X.w.device))
end
do -- the library and its NCCL: every rank fails alike (they agree before NCCL EP's group)
  local ok, b = pcall(dl.ep.buffer, { backend = "nccl_ep", comm = X.w, max_tokens = 1, hidden = 512, experts = N,
    topk = 1 })
  if not ok then
    local e = tostring(b)
    if e:find("cannot open NCCL EP", 1, true) or e:find("needs NCCL 2.29.2", 1, true) or e:find("lacks ncclEp", 1, true) then
      skip(e)
    end
    error(e, 0)
  end
  b:free()
end

local kinds = {
  { algorithm = "low_latency", output = "expert_major", dtype = "bf16" },
  { algorithm = "low_latency", output = "rank_major", dtype = "bf16" },
  { algorithm = "low_latency", output = "expert_major", dtype = "fp8" },
  { algorithm = "low_latency", output = "rank_major", dtype = "fp8" },
  { algorithm = "high_throughput", output = "expert_major", dtype = "bf16" },
  { algorithm = "high_throughput", output = "flat", dtype = "bf16" },
}
-- DISTLAB_NCCL_EQUIV_KINDS="low_latency/expert_major/bf16,...": only those (a GPU run that
-- sets one kind's failure apart from the others'; the spec itself runs all)
if os.getenv("DISTLAB_NCCL_EQUIV_KINDS") then
  local want, left = {}, {}
  for w in os.getenv("DISTLAB_NCCL_EQUIV_KINDS"):gmatch("[^,%s]+") do want[w] = true end
  for _, k in ipairs(kinds) do
    if want[k.algorithm .. "/" .. k.output .. "/" .. k.dtype] then left[#left + 1] = k end
  end
  if #left == 0 then error("DISTLAB_NCCL_EQUIV_KINDS names none of the kinds (algorithm/output/dtype)", 0) end
  kinds = left
end
local cases = {
  { route = "random", T = 16 }, { route = "random", T = 1 }, { route = "random", T = 0 }, { route = "random" },
  { route = "one_rank", T = 16 }, { route = "none", T = 3 },
}

-- A pair: nccl_ep's buffer of kind k and ours of the output it maps to.
local function pair(k)
  local o = { B = 16, H = 512, E = 4 * N, K = 4, layout = "per_rank", dtype = k.dtype }
  o.output = nref.ours_output { algorithm = k.algorithm, output = k.output }
  local on = { N = N, me = me, E = o.E, B = o.B, H = o.H, K = o.K, output = k.output, dtype = k.dtype,
    algorithm = k.algorithm }
  local nccl = dl.ep.buffer { backend = "nccl_ep", comm = X.w, max_tokens = o.B, hidden = o.H, experts = o.E,
    topk = o.K, algorithm = k.algorithm, output = k.output, dtype = k.dtype }
  return { o = o, on = on, ours = X.buffer(o), nccl = nccl, what = k.algorithm .. "/" .. k.output .. "/" .. k.dtype }
end

-- every source's inputs on the host, as distlab.bench.ep_ref takes them
local function host_inputs(all, o)
  local r = {}
  for s = 1, N do
    local x, idx, w = X.tensors(all[s], o)
    r[s] = { x = x:to("cpu"), idx = idx:to("cpu"), w = w:to("cpu"), s = s - 1 }
  end
  return r
end

-- fp8: each group's rows (expert or source) of a and b, dequantized, matched
-- one to one within twice the format's bound (order free)
local function fp8_rows(recv, g, n, H)
  local x, sc = recv.x:to("cpu"), recv.scales:to("cpu")
  local R = x:size(2)
  local px, ps = ffi.cast("uint8_t*", x:data_ptr()), ffi.cast("float*", sc:data_ptr())
  local rows = {}
  for r = 0, n - 1 do
    local v, row = { scales = {} }, g * R + r
    for i = 0, H - 1 do v[i + 1] = X.e4m3_value(px[row * H + i]) * ps[row * (H / 128) + math.floor(i / 128)] end
    for q = 0, H / 128 - 1 do v.scales[q + 1] = ps[row * (H / 128) + q] end
    rows[r + 1] = v
  end
  return rows
end
local function same_fp8(o, a, b)
  local ca, cb = a.counts:to("cpu"):tolist(), b.counts:to("cpu"):tolist()
  for g = 1, #ca do
    if ca[g] ~= cb[g] then return string.format("group %d: %d rows in ours, %d in nccl_ep", g - 1, ca[g], cb[g]) end
    local ra, rb, used = fp8_rows(a, g - 1, ca[g], o.H), fp8_rows(b, g - 1, cb[g], o.H), {}
    for i, u in ipairs(rb) do
      local found
      for j, v in ipairs(ra) do
        if not used[j] then
          local close = true
          for c = 1, o.H do
            local scale = v.scales[math.floor((c - 1) / 128) + 1]
            if math.abs(u[c] - v[c]) > 2 * (2 ^ -4 * math.abs(v[c]) + 2 ^ -10 * scale) then close = false break end
          end
          if close then found = j break end
        end
      end
      if not found then return string.format("group %d: nccl_ep's row %d is none of ours", g - 1, i - 1) end
      used[found] = true
    end
  end
  return nil
end
jit.off(fp8_rows)

-- normwise |a - b| / |b| in fp64
local function normwise(a, b)
  local pa, pb = a:to("cpu"):f64(), b:to("cpu"):f64()
  local x, y = ffi.cast("double*", pa:data_ptr()), ffi.cast("double*", pb:data_ptr())
  local num, den = 0, 0
  for i = 0, pb:numel() - 1 do
    local d = x[i] - y[i]
    if d ~= d then d = math.huge end
    num, den = num + d * d, den + y[i] * y[i]
  end
  return den > 0 and math.sqrt(num / den) or math.sqrt(num)
end
jit.off(normwise)

-- One call of both backends on the same inputs; nil or a message.
local function both(p, all)
  local o, on, mine = p.o, p.on, all[me + 1]
  local x, idx, w = X.tensors(mine, o)
  X.poison(p.ours)
  X.poison(p.nccl)
  local ro, ho = p.ours:dispatch(x, idx, w)
  p.ours:check()
  local rn, hn = p.nccl:dispatch(x, idx, w)
  p.nccl:check()
  local err = X.check_dispatch(o, ro, all)
  if err then return "ours' dispatch: " .. err end
  local conv = nref.as_ours(on, rn, host_inputs(all, o))
  if o.dtype == "fp8" then err = same_fp8(o, ro, conv) else err = X.check_dispatch(o, conv, all) end
  if err then return "nccl_ep's dispatch: " .. err end
  local out_o = p.ours:combine(X.expert_outputs(o, ro), ho)
  local out_n = p.nccl:combine(nref.expert_outputs(on, rn):to(X.w.device), hn)
  p.nccl:check()
  err = X.check_combine(o, out_o, mine)
  if err then return "ours' combine: " .. err end
  if mine.T > 0 then
    local rel, bound = normwise(out_n, out_o), o.dtype == "fp8" and X.tol.fp8 or X.tol.bf16
    if rel > bound then return string.format("combine: nccl_ep's output off ours by %.3g normwise (bound %.3g)", rel, bound) end
  end
  return nil
end

X.report(function()
  local pairs_ = {}
  for i, k in ipairs(kinds) do pairs_[i] = pair(k) end
  local call = 0
  for _, p in ipairs(pairs_) do
    for c, case in ipairs(cases) do
      call = call + 1
      local all = {}
      local T = case.T and math.min(case.T, p.o.B)
      for s = 0, N - 1 do all[s + 1] = X.inputs(p.o, call, s, case.route, T) end
      local err = both(p, all)
      if err then error(string.format("%s case %d (%s, T=%s): %s", p.what, c, case.route, tostring(T or "varying"), err), 0) end
    end
  end
  -- alternating calls: ours then nccl_ep, a configuration after another, new data every call
  for i = 1, calls do
    local p = pairs_[(i - 1) % #pairs_ + 1]
    call = call + 1
    local all = {}
    for s = 0, N - 1 do all[s + 1] = X.inputs(p.o, call, s, call % 13 == 0 and "one_rank" or "random") end
    local err = both(p, all)
    if err then error(string.format("alternating call %d (%s): %s", i, p.what, err), 0) end
  end
  X.w:barrier()
  for _, p in ipairs(pairs_) do
    p.ours:free()
    p.nccl:free()
  end
  print(string.format("nccl_equiv ok: rank %d of %d, %d calls each backend", me, N, call))
end)
