-- spec/ep/common.lua — what the ep rank scripts share: the world, every
-- rank's inputs (each rank can recompute every other rank's, so each checks
-- what it must receive), an fp8 quantizer written from the format's
-- definition (not from kernels/ep/fp8.h; its number conversions are
-- distlab.bench.ep_ref's, which ep_bench checks with), the expert each rank applies, the
-- fp64 references and the checks, each returning nil or a message.
local ffi = require "ffi"
local dl = require "distlab"
local ep_ref = require "distlab.bench.ep_ref"

local X = {}

X.timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "20")
X.w = dl.comm.world { timeout = X.timeout }
X.N, X.me = X.w.size, X.w.rank
X.on_cpu = X.w.device == "cpu"

-- the configurations every script runs: both layouts, both outputs, both dtypes
X.combos = {}
for _, layout in ipairs { "per_rank", "per_expert" } do
  for _, output in ipairs { "expert_major", "rank_major" } do
    for _, dtype in ipairs { "bf16", "fp8" } do
      X.combos[#X.combos + 1] = { layout = layout, output = output, dtype = dtype }
    end
  end
end

function X.buffer(o)
  return dl.ep.buffer { comm = X.w, max_tokens = o.B, hidden = o.H, experts = o.E, topk = o.K, layout = o.layout,
    output = o.output, dtype = o.dtype }
end

-- Run fn; on error print "ERR: <message>" and exit 3.
function X.report(fn)
  local ok, err = pcall(fn)
  if not ok then
    io.stdout:write("ERR: rank " .. X.me .. ": " .. tostring(err) .. "\n")
    io.stdout:flush()
    os.exit(3)
  end
end

-- ---- numbers -------------------------------------------------------------------------------

-- fp32 and bf16 rounding, e4m3 codes: distlab.bench.ep_ref's (ep_bench checks with the same)
X.f32, X.bf16_value, X.bf16_bits = ep_ref.f32, ep_ref.bf16_value, ep_ref.bf16_bits
X.e4m3_value, X.e4m3_code = ep_ref.e4m3_value, ep_ref.e4m3_code

-- One row's fp8 payload as the dispatch defines it: codes[H] and scales[H/128].
function X.quantize(vals, H)
  local codes, scales = {}, {}
  for g = 0, H / 128 - 1 do
    local amax = X.f32(1e-4)
    for i = 1, 128 do amax = math.max(amax, math.abs(vals[g * 128 + i])) end
    local inv = X.f32(448 / amax)
    for i = 1, 128 do codes[g * 128 + i] = X.e4m3_code(X.f32(vals[g * 128 + i] * inv)) end
    scales[g + 1] = X.f32(amax / 448)
  end
  return codes, scales
end

-- ---- inputs --------------------------------------------------------------------------------

local function lcg(seed)
  local s = (seed * 7919 + 17) % 2147483647
  return function(n) -- 0..n-1
    s = (s * 48271) % 2147483647
    return s % n
  end
end

-- Rank s's inputs of call `call` for config o ({B, H, E, K}) and routing
-- `route`: "random" (distinct experts, about one in eight -1), "one_rank"
-- (every token's experts on one rank, (t + call) mod N; -1 once its L
-- experts are taken), "none" (all -1), "dup" (k = 2 repeats k = 1's
-- expert, which the kernels drop and report). T: tokens (default from the call).
function X.inputs(o, call, s, route, T)
  local rnd = lcg(call * 131 + s * 7 + 1)
  T = T or o.T or rnd(o.B + 1)
  local L = o.E / X.N
  local idx, w = {}, {}
  for t = 1, T do
    local row, taken = {}, {}
    local rank = (t + call) % X.N
    for k = 1, o.K do
      local e
      if route == "none" or (route == "random" and rnd(8) == 0) or (route == "one_rank" and k > L) then
        e = -1
      else
        repeat
          e = route == "one_rank" and rank * L + rnd(L) or rnd(o.E)
        until not taken[e] or (route == "dup" and k == 2)
      end
      if route == "dup" and k == 2 then e = row[1] end
      if e >= 0 then taken[e] = true end
      row[k] = e
    end
    idx[t] = row
    local wr = {}
    for k = 1, o.K do wr[k] = X.f32((rnd(1000) + 1) / 997) end
    w[t] = wr
  end
  local x = dl.randn({ T, o.H }, { dtype = "bf16", seed = call * 1009 + s, device = "cpu" })
  local xv = {}
  local p = ffi.cast("uint16_t*", x:data_ptr())
  for t = 1, T do
    local r = {}
    for i = 1, o.H do r[i] = X.bf16_value(p[(t - 1) * o.H + i - 1]) end
    xv[t] = r
  end
  return { T = T, idx = idx, w = w, x = x, xv = xv, s = s }
end

-- Whether a token of inputs `inp` picks one expert twice; with drop, those
-- repeats become -1 in inp.idx (as the kernels drop them).
function X.repeats(inp, drop)
  local any = false
  for t = 1, inp.T do
    local row = inp.idx[t]
    for k = 2, #row do
      for j = 1, k - 1 do
        if row[k] >= 0 and row[k] == row[j] then
          any = true
          if drop then row[k] = -1 end
          break
        end
      end
    end
  end
  return any
end

-- This rank's inputs as device tensors.
function X.tensors(inp, o)
  local dev = X.w.device
  local idx = dl.empty({ inp.T, o.K }, { dtype = "i32", device = "cpu" })
  local w = dl.empty({ inp.T, o.K }, { dtype = "f32", device = "cpu" })
  local pi, pw = ffi.cast("int32_t*", idx:data_ptr()), ffi.cast("float*", w:data_ptr())
  for t = 1, inp.T do
    for k = 1, o.K do
      pi[(t - 1) * o.K + k - 1] = inp.idx[t][k]
      pw[(t - 1) * o.K + k - 1] = inp.w[t][k]
    end
  end
  return inp.x:to(dev), idx:to(dev), w:to(dev)
end

-- The value a row of x arrives as: itself (bf16), or its fp8 code times scale.
function X.arrived(o, vals)
  if o.dtype ~= "fp8" then return vals end
  local codes, scales = X.quantize(vals, o.H)
  local r = {}
  for i = 1, o.H do r[i] = X.e4m3_value(codes[i]) * scales[math.floor((i - 1) / 128) + 1] end
  return r, codes, scales
end

-- ---- what each rank must receive -----------------------------------------------------------

-- The bytes of a row as it arrives (bf16 bits, or fp8 codes then scales):
-- the key that identifies it among the received rows.
local function key_of(o, vals)
  if o.dtype ~= "fp8" then
    local b = ffi.new("uint16_t[?]", o.H)
    for i = 1, o.H do b[i - 1] = X.bf16_bits(vals[i]) end
    return ffi.string(b, 2 * o.H)
  end
  local _, codes, scales = X.arrived(o, vals)
  local b, sc = ffi.new("uint8_t[?]", o.H), ffi.new("float[?]", #scales)
  for i = 1, o.H do b[i - 1] = codes[i] end
  for i = 1, #scales do sc[i - 1] = scales[i] end
  return ffi.string(b, o.H) .. ffi.string(sc, 4 * #scales)
end

local function received_key(o, x, sc, row)
  if o.dtype ~= "fp8" then return ffi.string(ffi.cast("uint16_t*", x) + row * o.H, 2 * o.H) end
  local G = o.H / 128
  return ffi.string(ffi.cast("uint8_t*", x) + row * o.H, o.H) .. ffi.string(ffi.cast("float*", sc) + row * G, 4 * G)
end

local function host(t) return t and t:to("cpu") end

-- Checks recv against all ranks' inputs `all` (all[s + 1]); nil or a message.
-- Every row of every expert (or source) must be one that belongs there,
-- each exactly as often as it was selected; counts, ids and weights exact.
function X.check_dispatch(o, recv, all)
  local N, me, L, B, K = X.N, X.me, o.E / X.N, o.B, o.K
  local x, sc, counts = host(recv.x), host(recv.scales), host(recv.counts)
  local px, ps = x:data_ptr(), sc and sc:data_ptr()
  local pc = ffi.cast("int32_t*", counts:data_ptr())
  if o.output == "expert_major" then
    for le = 0, L - 1 do
      local e, want, n = me * L + le, {}, 0
      for s = 0, N - 1 do
        local inp = all[s + 1]
        for t = 1, inp.T do
          for k = 1, K do
            if inp.idx[t][k] == e then
              local key = key_of(o, inp.xv[t])
              want[key] = (want[key] or 0) + 1
              n = n + 1
            end
          end
        end
      end
      if pc[le] ~= n then return string.format("expert %d got %d rows, expected %d", e, pc[le], n) end
      for r = 0, n - 1 do
        local key = received_key(o, px, ps, le * N * B + r)
        if not want[key] or want[key] == 0 then
          return string.format("expert %d row %d is not a token this expert should get (or one too many)", e, r)
        end
        want[key] = want[key] - 1
      end
    end
    return nil
  end
  local ids, wts = host(recv.expert_ids), host(recv.weights)
  local pid, pw = ffi.cast("int32_t*", ids:data_ptr()), ffi.cast("float*", wts:data_ptr())
  for s = 0, N - 1 do
    local inp, want, n = all[s + 1], {}, 0
    for t = 1, inp.T do
      local here = false
      for k = 1, K do here = here or (inp.idx[t][k] >= 0 and math.floor(inp.idx[t][k] / L) == me) end
      if here then
        want[key_of(o, inp.xv[t])] = t
        n = n + 1
      end
    end
    if pc[s] ~= n then return string.format("rank %d sent %d rows here, expected %d", s, pc[s], n) end
    for j = 0, n - 1 do
      local t = want[received_key(o, px, ps, s * B + j)]
      if not t then return string.format("row %d from rank %d is not one of its tokens routed here (or twice)", j, s) end
      want[received_key(o, px, ps, s * B + j)] = nil
      for k = 1, K do
        local e = inp.idx[t][k]
        local on = e >= 0 and math.floor(e / L) == me
        local id, wt = pid[(s * B + j) * K + k - 1], pw[(s * B + j) * K + k - 1]
        if id ~= (on and e - me * L or -1) or wt ~= (on and inp.w[t][k] or 0) then
          return string.format("row %d from rank %d (its token %d), selection %d: expert id %d weight %g, expected %d, %g",
            j, s, t - 1, k - 1, id, wt, on and e - me * L or -1, on and inp.w[t][k] or 0)
        end
      end
    end
  end
  return nil
end

-- ---- the experts and the combine ------------------------------------------------------------

-- Expert e multiplies by c(e): exact binary fractions, distinct per expert.
function X.coef(e) return ep_ref.coef(e) end

-- y for recv as each rank's experts compute it (rows past the counts stay NaN).
function X.expert_outputs(o, recv)
  local N, me, L, B, H, K = X.N, X.me, o.E / X.N, o.B, o.H, o.K
  local x, sc, counts = host(recv.x), host(recv.scales), host(recv.counts)
  local px, ps = x:data_ptr(), sc and ffi.cast("float*", sc:data_ptr())
  local pc = ffi.cast("int32_t*", counts:data_ptr())
  local y = dl.full(x:size(), 0 / 0, { dtype = "bf16", device = "cpu" })
  local py = ffi.cast("uint16_t*", y:data_ptr())
  local function value(row, i)
    if o.dtype ~= "fp8" then return X.bf16_value(ffi.cast("uint16_t*", px)[row * H + i]) end
    return X.e4m3_value(ffi.cast("uint8_t*", px)[row * H + i]) * ps[row * (H / 128) + math.floor(i / 128)]
  end
  if o.output == "expert_major" then
    for le = 0, L - 1 do
      local c = X.coef(me * L + le, o.E)
      for r = 0, pc[le] - 1 do
        local row = le * N * B + r
        for i = 0, H - 1 do py[row * H + i] = X.bf16_bits(c * value(row, i)) end
      end
    end
  else
    local ids, wts = host(recv.expert_ids), host(recv.weights)
    local pid, pw = ffi.cast("int32_t*", ids:data_ptr()), ffi.cast("float*", wts:data_ptr())
    for s = 0, N - 1 do
      for j = 0, pc[s] - 1 do
        local row = s * B + j
        for i = 0, H - 1 do
          local v = value(row, i)
          local acc = 0
          for k = 0, K - 1 do
            local id = pid[row * K + k]
            if id >= 0 then acc = acc + pw[row * K + k] * X.coef(me * L + id, o.E) * v end
          end
          py[row * H + i] = X.bf16_bits(acc)
        end
      end
    end
  end
  return y:to(X.w.device)
end

-- The combined output of my tokens, in fp64: `exact` from the y values the
-- experts produced (bf16-rounded as above), `ideal` from x itself.
function X.reference(o, inp)
  local L, H, K, E = o.E / X.N, o.H, o.K, o.E
  local exact = dl.zeros({ inp.T, H }, { dtype = "f64", device = "cpu" })
  local ideal = dl.zeros({ inp.T, H }, { dtype = "f64", device = "cpu" })
  local pe, pi = ffi.cast("double*", exact:data_ptr()), ffi.cast("double*", ideal:data_ptr())
  for t = 1, inp.T do
    local v = X.arrived(o, inp.xv[t])
    for i = 0, H - 1 do
      local ex, id = 0, 0
      if o.output == "expert_major" then
        for k = 1, K do
          local e = inp.idx[t][k]
          if e >= 0 then
            ex = ex + inp.w[t][k] * X.bf16_value(X.bf16_bits(X.coef(e, E) * v[i + 1]))
            id = id + inp.w[t][k] * X.coef(e, E) * inp.xv[t][i + 1]
          end
        end
      else
        for q = 0, X.N - 1 do -- each rank's row: its selections, weighted, in k order
          local acc, any = 0, false
          for k = 1, K do
            local e = inp.idx[t][k]
            if e >= 0 and math.floor(e / L) == q then
              acc = acc + inp.w[t][k] * X.coef(e, E) * v[i + 1]
              id = id + inp.w[t][k] * X.coef(e, E) * inp.xv[t][i + 1]
              any = true
            end
          end
          if any then ex = ex + X.bf16_value(X.bf16_bits(acc)) end
        end
      end
      pe[(t - 1) * H + i], pi[(t - 1) * H + i] = ex, id
    end
  end
  return exact, ideal
end

-- Normwise relative error of got against ref (fp64) and the count of
-- elements beyond atol + rtol |ref|.
local function errors(got, ref, rtol, atol)
  local g = got:to("cpu"):f64()
  local pg, pr = ffi.cast("double*", g:data_ptr()), ffi.cast("double*", ref:data_ptr())
  local num, den, bad, first = 0, 0, 0, nil
  for i = 0, ref:numel() - 1 do
    local d = pg[i] - pr[i]
    if d ~= d then d = math.huge end
    num, den = num + d * d, den + pr[i] * pr[i]
    if math.abs(d) > atol + rtol * math.abs(pr[i]) then
      bad = bad + 1
      first = first or string.format("element %d: got %.6g, expected %.6g", i, pg[i], pr[i])
    end
  end
  return den > 0 and math.sqrt(num / den) or math.sqrt(num), bad, first
end

-- The tolerances: out is an fp32 sum rounded once to bf16 (2^-9 relative)
-- against `exact`; against `ideal` the experts' bf16 rounding adds as much,
-- and fp8 its own bound: 2^-4 |x| + 2^-10 s per value (kernels/ep/fp8.h).
X.tol = { exact = 2 ^ -8, bf16 = 2 ^ -7, fp8 = 2 ^ -4 + 2 ^ -7 }

function X.check_combine(o, out, inp)
  if inp.T == 0 then
    if out:numel() ~= 0 then return "combine of 0 tokens is not empty" end
    return nil
  end
  local exact, ideal = X.reference(o, inp)
  local rel, bad, first = errors(out, exact, X.tol.exact, 1e-6)
  if rel > X.tol.exact or bad > 0 then
    return string.format("combine vs the fp64 sum of the experts' outputs: normwise %.3g (bound %.3g), %d elements off (%s)",
      rel, X.tol.exact, bad, first or "-")
  end
  local bound = X.tol[o.dtype]
  local rel2 = errors(out, ideal, 1, 1e300)
  if rel2 > bound then
    return string.format("combine vs the fp64 reference from x: normwise %.3g, bound %.3g (%s)", rel2, bound, o.dtype)
  end
  return nil
end

-- fp8 only: every value that arrived within 2^-4 |x| + 2^-10 s of x.
function X.check_fp8_bound(o, inp)
  if o.dtype ~= "fp8" then return nil end
  for t = 1, inp.T do
    local _, codes, scales = X.arrived(o, inp.xv[t])
    for i = 1, o.H do
      local s = scales[math.floor((i - 1) / 128) + 1]
      local got, x = X.e4m3_value(codes[i]) * s, inp.xv[t][i]
      if math.abs(got - x) > 2 ^ -4 * math.abs(x) + 2 ^ -10 * s then
        return string.format("fp8: token %d value %d arrives as %.6g for %.6g (scale %.3g)", t - 1, i - 1, got, x, s)
      end
    end
  end
  return nil
end

-- ep:bytes() against the layout's formula: equal on cpu; on cuda the
-- buffer in whole 2 MiB pages, the rounding in signals; and the allocator's
-- ep_dispatch_recv tag holding at least this buffer's part.
function X.check_bytes(o, ep)
  local f = dl.ep.formula { max_tokens = o.B, hidden = o.H, experts = o.E, topk = o.K, layout = o.layout,
    output = o.output, dtype = o.dtype, ranks = X.N }
  local b, page = ep:bytes(), 2 ^ 21
  for _, part in ipairs { "dispatch_send", "dispatch_recv", "combine_send", "combine_recv", "outputs" } do
    if b[part] ~= f[part] then return string.format("bytes: %s %d, the formula says %d", part, b[part], f[part]) end
  end
  local want = X.on_cpu and f.total or math.ceil(f.total / page) * page
  if b.total ~= want or b.signals ~= want - f.dispatch_recv - f.combine_recv then
    return string.format("bytes: total %d, signals %d; expected %d, %d (formula total %d)", b.total, b.signals, want,
      want - f.dispatch_recv - f.combine_recv, f.total)
  end
  local tag = dl.mem.stats(X.w.device).tags.ep_dispatch_recv
  if not tag or tag.current < b.dispatch_recv then return "bytes: the allocator's ep_dispatch_recv tag misses the buffer" end
  return nil
end

-- Poison the buffer's outputs, so a row or entry the kernels skip shows.
function X.poison(ep)
  local t = ep.tensors
  t.x:fill_(t.x.dtype_id == require("distlab.core").C.DL_U8 and 127 or 0 / 0)
  if t.scales then t.scales:fill_(0 / 0) end
  t.counts:fill_(-7)
  if t.expert_ids then t.expert_ids:fill_(-7) end
  if t.weights then t.weights:fill_(0 / 0) end
  t.out:fill_(0 / 0)
end

-- Interpreted: these take raw pointers out of tensors and then allocate; in
-- compiled code LuaJIT may let the tensor die under the pointer (see the end
-- of bindings/distlab/tensor.lua).
for _, fn in ipairs { X.inputs, X.tensors, key_of, received_key, X.check_dispatch, X.expert_outputs, X.reference,
  errors } do
  jit.off(fn)
end

return X
