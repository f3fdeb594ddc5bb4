-- distlab.bench.ep_ref — expert-parallel dispatch and combine checked on the
-- host against the routing, from every rank's inputs (which every rank can
-- draw again from their seeds). Numbers from the formats' definitions, not
-- from kernels/ep/fp8.h: bf16 by round-to-nearest-even, e4m3 codes by
-- nearest (ties to the even code, saturating at 448), one fp32 scale
-- amax / 448 per 128 values (spec/ep/common.lua uses the same).
--
--   local ep_ref = require "distlab.bench.ep_ref"
--   inputs of source s: {x = cpu bf16 [T, H], idx = cpu i32 [T, K] (-1: none), w = cpu f32 [T, K]}
--   o = {N =, me =, E =, B =, H =, K =, output = "expert_major" | "rank_major", dtype = "bf16" | "fp8"}
--   ep_ref.check_dispatch(o, recv, all) -> wrong, msg, elements
--       every row every local expert (expert_major) or every source (rank_major) got, against
--       the rows the routing sends here (order within an expert or a source free): counts exact;
--       bf16 rows bit-exact; fp8 rows found by their first 128 codes and scale, every scale equal
--       to amax / 448, every value dequantized within 2^-4 |x| + 2^-10 scale of x, and their
--       bias <deq - x, x> / <x, x> within 2^-10 + 5 sqrt(sum (e x)^2) / sum x^2 (a 1% scale is
--       all bias; rounding's is noise of that size: 3e-4 at 1e5 values); o.fp8_scales = "own"
--       (another library's recipe, NCCL EP's): each scale within 2^-20 of amax / 448, a row found
--       by its dequantized first 64 values' nearness to the rows wanted, its values judged on
--       its own scale;
--       rank_major: expert ids and weights exact. Wrong: values of rows missing, extra or off.
--   ep_ref.expert_outputs(o, recv) -> {le or s = {rows = n, y = cpu bf16 [n, H]}}
--       the experts' outputs y for the rows received: expert e multiplies by coef(e)
--       (exact binary fractions, distinct per expert); rank_major rows summed over their
--       selections here, weighted, then rounded to bf16 once
--   ep_ref.combine_ref(o, inp) -> cpu f64 [T, H]: what combine must give for my tokens, from
--       those y, in fp64 (out is their fp32 sum rounded once: within 2^-8 element-wise)
--   ep_ref.COMBINE_TOL: {atol, rtol, norm, bias} for distlab.bench.verify.close
local ffi = require "ffi"
local bit = require "bit"
local tensor = require "distlab.tensor"

local T = tensor.methods
local floor, abs = math.floor, math.abs
local M = {}

M.COMBINE_TOL = { atol = 1e-6, rtol = 2 ^ -8, norm = 2 ^ -8, bias = 2 ^ -10 }
M.FP8_BIAS = 2 ^ -10

-- ---- numbers ------------------------------------------------------------------------------

-- No type punning here (a uint32_t store read back as a float): LuaJIT's
-- compiled code takes pointers of different types for different memory and
-- returned stale values. bf16 values come from a table, bits from frexp.
local fbuf = ffi.new("float[1]")
function M.f32(v) -- v rounded to fp32 (C's conversion: to nearest, ties to even)
  fbuf[0] = v
  return fbuf[0]
end

local BF16 = ffi.new("double[65536]")
local function bf16_table()
  for h = 0, 65535 do
    local sign, e, m = h >= 32768 and -1 or 1, floor(h / 128) % 256, h % 128
    if e == 255 then BF16[h] = m == 0 and sign * math.huge or 0 / 0
    elseif e == 0 then BF16[h] = sign * m * 2 ^ -133 -- subnormal: m / 128 * 2^-126
    else BF16[h] = sign * (1 + m / 128) * 2 ^ (e - 127) end
  end
end
jit.off(bf16_table)
bf16_table()

function M.bf16_value(h) return BF16[h] end -- a bf16 bit pattern as a number

function M.bf16_bits(v) -- v (a number) to bf16 bits: to fp32, then to nearest even
  local f = M.f32(v)
  if f ~= f then return 0x7fc0 end
  local sign = (f < 0 or (f == 0 and 1 / f < 0)) and 32768 or 0
  local a = abs(f)
  if a == math.huge then return sign + 0x7f80 end
  if a == 0 then return sign end
  local m, e = math.frexp(a) -- a = m 2^e, m in [0.5, 1)
  local E, mant = e + 126, 0
  if E >= 1 then mant = (m * 2 - 1) * 8388608 else E, mant = 0, a * 2 ^ 149 end
  local u = E * 8388608 + mant -- the fp32 bits without the sign
  return sign + floor((u + 0x7fff + floor(u / 65536) % 2) / 65536)
end

-- e4m3: values of codes 0..126
local E4M3 = ffi.new("double[128]")
for c = 0, 126 do
  local e, m = bit.rshift(c, 3), bit.band(c, 7)
  E4M3[c] = e == 0 and m * 2 ^ -9 or (1 + m / 8) * 2 ^ (e - 7)
end
E4M3[127] = 0 / 0
function M.e4m3_value(c)
  local v = E4M3[bit.band(c, 0x7f)]
  return c >= 0x80 and -v or v
end
function M.e4m3_code(v)
  local a, sign = abs(v), (v < 0 or (v == 0 and 1 / v < 0)) and 0x80 or 0
  if a >= 448 then return sign + 0x7e end
  local lo, hi = 0, 126
  while lo < hi do
    local mid = floor((lo + hi + 1) / 2)
    if E4M3[mid] <= a then lo = mid else hi = mid - 1 end
  end
  if lo < 126 then
    local below, above = a - E4M3[lo], E4M3[lo + 1] - a
    if above < below or (above == below and lo % 2 == 1) then lo = lo + 1 end
  end
  return sign + lo
end

-- The fp32 scale of the 128 bf16 values at px[base ..] and 1 / it as the quantizer
-- multiplies by it: amax = max(1e-4, max |v|), scale = amax / 448, inv = 448 / amax.
local function group_scale(px, base)
  local amax = M.f32(1e-4)
  for i = 0, 127 do
    local a = abs(BF16[px[base + i]])
    if a > amax then amax = a end
  end
  return M.f32(amax / 448), M.f32(448 / amax)
end
M.group_scale = group_scale

-- Expert e multiplies by coef(e): exact binary fractions, distinct per expert.
function M.coef(e) return 1 + (e % 7) / 8 + floor(e / 7) / 64 end

-- ---- host views ---------------------------------------------------------------------------

local function host(t)
  if t == nil then return nil end
  t = T.contiguous(t)
  if t.device ~= "cpu" then t = T.to(t, "cpu") end
  return t
end

local function ptr(t, ct) return ffi.cast(ct, T.data_ptr(t)) end

-- The values bf16 row t of px (uint16 [T, H]) arrives with, into vals[0 .. H-1]: itself,
-- or (fp8) through the quantizer, dequantized. (No closures in these loops: LuaJIT
-- compiles none where a function is made.)
local function arrived(fp8, px, H, t, vals)
  local base = t * H
  if not fp8 then
    for i = 0, H - 1 do vals[i] = BF16[px[base + i]] end
    return
  end
  for g = 0, H / 128 - 1 do
    local s, inv = group_scale(px, base + g * 128)
    for i = g * 128, g * 128 + 127 do vals[i] = M.e4m3_value(M.e4m3_code(M.f32(BF16[px[base + i]] * inv))) * s end
  end
end

-- Pointers into every source's inputs (kept with them).
local function prepared(all)
  for _, inp in ipairs(all) do
    if not inp.px then
      inp.T = T.size(inp.x, 1)
      inp.px, inp.pi, inp.pw = ptr(inp.x, "uint16_t*"), ptr(inp.idx, "int32_t*"), ptr(inp.w, "float*")
    end
  end
  return all
end

-- ---- dispatch -----------------------------------------------------------------------------

-- The rows source inp sends to `dest` (local expert le, or this rank), each {t =, n = times}.
local function routed(o, inp, match)
  local rows = {}
  for t = 0, inp.T - 1 do
    local n = 0
    for k = 0, o.K - 1 do if match(inp.pi[t * o.K + k]) then n = n + 1 end end
    if n > 0 then rows[#rows + 1] = { t = t, n = n } end
  end
  return rows
end

-- The key a row is found by: its bytes (bf16), or its first 128 codes and first scale (fp8).
local function sent_key(o, inp, t, scratch)
  if o.dtype ~= "fp8" then return ffi.string(inp.px + t * o.H, 2 * o.H) end
  local s, inv = group_scale(inp.px, t * o.H)
  for i = 0, 127 do scratch.c[i] = M.e4m3_code(M.f32(BF16[inp.px[t * o.H + i]] * inv)) end
  scratch.f[0] = s
  return ffi.string(scratch.c, 128) .. ffi.string(scratch.f, 4)
end

-- own scales (o.fp8_scales == "own"): a received row found by nearness instead of its bytes, among
-- the rows still wanted here (another recipe's codes and scales need not equal ours bit for bit):
-- the one whose first 64 values its dequantized ones are nearest to
local function nearest(o, want, rx, rs, row)
  local codes = ffi.cast("uint8_t*", rx) + row * o.H
  local best, best_d, best_key = nil, math.huge, nil
  for key, list in pairs(want) do
    local c = list[#list]
    if c then
      local d = 0
      for i = 0, 63 do
        local v = M.e4m3_value(codes[i]) * rs[row * (o.H / 128)] - BF16[c.inp.px[c.t * o.H + i]]
        d = d + v * v
        if d >= best_d then break end
      end
      if d < best_d then best, best_d, best_key = c, d, key end
    end
  end
  if best then table.remove(want[best_key]) end
  return best
end

local function recv_key(o, rx, rs, row)
  if o.dtype ~= "fp8" then return ffi.string(ffi.cast("uint16_t*", rx) + row * o.H, 2 * o.H) end
  return ffi.string(ffi.cast("uint8_t*", rx) + row * o.H, 128) .. ffi.string(rs + row * (o.H / 128), 4)
end

-- fp8 row `row` of recv (codes at rx, scales at rs) against bf16 row t of px: scales
-- equal to amax / 448, values within the format's bound. Returns the values off and
-- the sums <e, x>, <x, x>, <e x, e x> (e = deq - x) for the bias.
local function fp8_row(H, px, t, rx, rs, row, own)
  local off, dot, xx, ex2 = 0, 0, 0, 0
  local codes = ffi.cast("uint8_t*", rx) + row * H
  for g = 0, H / 128 - 1 do
    local s = group_scale(px, t * H + g * 128)
    local got_s = rs[row * (H / 128) + g]
    -- own: another library's recipe (NCCL EP's), whose amax / 448 may round otherwise (1 / (448 / amax)):
    -- within 2^-20 of ours, the values then judged on its scale
    if own and not (abs(got_s - s) <= 2 ^ -20 * s) or not own and got_s ~= s then off = off + 128 end
    for i = g * 128, g * 128 + 127 do
      local x = BF16[px[t * H + i]]
      local e = M.e4m3_value(codes[i]) * got_s - x
      if not (abs(e) <= 2 ^ -4 * abs(x) + 2 ^ -10 * s) then off = off + 1 end
      dot, xx, ex2 = dot + e * x, xx + x * x, ex2 + (e * x) * (e * x)
    end
  end
  return off, dot, xx, ex2
end

-- recv: the dispatch's outputs (device tensors); all[s + 1]: source s's inputs.
function M.check_dispatch(o, recv, all)
  prepared(all)
  local N, me, B, H, K = o.N, o.me, o.B, o.H, o.K
  local L = o.E / N
  local counts = host(recv.counts)
  local pc = ptr(counts, "int32_t*")
  local scratch = { c = ffi.new("uint8_t[128]"), f = ffi.new("float[1]") }
  local wrong, msgs, elements = 0, {}, 0
  local acc = { dot = 0, xx = 0, ex2 = 0, n = 0 }
  local function say(fmt, ...) if #msgs < 4 then msgs[#msgs + 1] = string.format(fmt, ...) end end
  local em = o.output == "expert_major"
  local ids, wts = not em and host(recv.expert_ids), not em and host(recv.weights)
  local pid, pw = ids and ptr(ids, "int32_t*"), wts and ptr(wts, "float*")
  for slot = 0, (em and L or N) - 1 do
    -- the rows that belong here: key -> list of {inp, t} (a token once per selection of e)
    local want, n = {}, 0
    for s = 0, N - 1 do
      if em or s == slot then
        local inp = all[s + 1]
        local e = me * L + slot
        local match = em and function(x) return x == e end or function(x) return x >= 0 and floor(x / L) == me end
        for _, r in ipairs(routed(o, inp, match)) do
          local key = sent_key(o, inp, r.t, scratch)
          local list = want[key] or {}
          want[key] = list
          for _ = 1, em and r.n or 1 do list[#list + 1] = { inp = inp, t = r.t } end
          n = n + (em and r.n or 1)
        end
      end
    end
    local got = pc[slot]
    local cap = em and N * B or B
    if got ~= n then
      wrong = wrong + 1 + math.min(abs(got - n), cap) * H -- (a poisoned count: at most the slot)
      say("%s %d: %d rows, expected %d", em and "expert" or "source", em and me * L + slot or slot, got, n)
    end
    local rows = math.max(0, math.min(got, n, cap))
    if rows > 0 then
      local base = slot * cap
      local xs = T.narrow(T.select(recv.x, 1, slot + 1), 1, 1, rows)
      local hx = host(xs)
      local hs = recv.scales and host(T.narrow(T.select(recv.scales, 1, slot + 1), 1, 1, rows))
      local rx, rs = T.data_ptr(hx), hs and ptr(hs, "float*")
      local own = o.dtype == "fp8" and o.fp8_scales == "own"
      for r = 0, rows - 1 do
        local hit
        if own then
          hit = nearest(o, want, rx, rs, r)
        else
          local list = want[recv_key(o, rx, rs, r)]
          hit = list and table.remove(list)
        end
        if not hit then
          wrong = wrong + H
          say("%s %d row %d is not a row the routing sends there (or one too many)", em and "expert" or "source",
            em and me * L + slot or slot, r)
        else
          elements = elements + H
          if o.dtype == "fp8" then
            local off, d1, d2, d3 = fp8_row(H, hit.inp.px, hit.t, rx, rs, r, own)
            acc.dot, acc.xx, acc.ex2, acc.n = acc.dot + d1, acc.xx + d2, acc.ex2 + d3, acc.n + H
            if off > 0 then
              wrong = wrong + off
              say("row %d of %s %d (token %d of rank %d): %d fp8 values off their x (scale or bound)", r,
                em and "expert" or "source", em and me * L + slot or slot, hit.t, hit.inp.s or -1, off)
            end
          end
          if not em then
            for k = 0, K - 1 do
              local e = hit.inp.pi[hit.t * K + k]
              local on = e >= 0 and floor(e / L) == me
              local want_id, want_w = on and e - me * L or -1, on and hit.inp.pw[hit.t * K + k] or 0
              local at = ((base + r) * K + k)
              if pid[at] ~= want_id or pw[at] ~= want_w then
                wrong = wrong + 1
                say("row %d from rank %d (its token %d) selection %d: expert id %d weight %g, expected %d, %g", r, slot,
                  hit.t, k, pid[at], pw[at], want_id, want_w)
              end
            end
          end
        end
      end
    end
  end
  if o.dtype == "fp8" and acc.xx > 0 then
    -- rounding's own bias is noise of about sqrt(sum (e x)^2) / sum x^2: allowed 5 times that
    local b, bound = acc.dot / acc.xx, M.FP8_BIAS + 5 * math.sqrt(acc.ex2) / acc.xx
    if not (abs(b) <= bound) then
      wrong = wrong + 1
      say("fp8 values dequantized: bias %.3g against x (bound %.3g)", b, bound)
    end
  end
  return wrong, #msgs > 0 and table.concat(msgs, "; ") or nil, elements
end

-- ---- the experts and the combine ---------------------------------------------------------

-- fp8 rows (codes at rx, scales at rs) dequantized into pv
local function dequant(rx, rs, rows, H, pv)
  local codes = ffi.cast("uint8_t*", rx)
  for r = 0, rows - 1 do
    for i = 0, H - 1 do pv[r * H + i] = M.e4m3_value(codes[r * H + i]) * rs[r * (H / 128) + floor(i / 128)] end
  end
end

-- c * v rounded to bf16 (the f64 tensor v scaled in place), as a f64 tensor: the
-- library's own conversion, the same wherever an expert's output is formed
local function rounded(v, c)
  return T.to(T.to(T.mul_(v, c), "bf16"), "f64")
end

-- y for the rows of recv (this rank's experts): {[slot] = {rows =, y = cpu bf16 [rows, H]}}
function M.expert_outputs(o, recv)
  local N, me, B, H, K = o.N, o.me, o.B, o.H, o.K
  local L = o.E / N
  local em = o.output == "expert_major"
  local pc = ptr(host(recv.counts), "int32_t*")
  local ids, wts = not em and host(recv.expert_ids), not em and host(recv.weights)
  local pid, pw = ids and ptr(ids, "int32_t*"), wts and ptr(wts, "float*")
  local out = {}
  for slot = 0, (em and L or N) - 1 do
    local rows = math.max(0, math.min(pc[slot], em and N * B or B))
    if rows > 0 then
      local hx = host(T.narrow(T.select(recv.x, 1, slot + 1), 1, 1, rows))
      local v
      if o.dtype == "fp8" then
        local hs = host(T.narrow(T.select(recv.scales, 1, slot + 1), 1, 1, rows))
        v = tensor.empty({ rows, H }, { dtype = "f64", device = "cpu" })
        dequant(T.data_ptr(hx), ptr(hs, "float*"), rows, H, ptr(v, "double*"))
      else
        v = T.to(hx, "f64")
      end
      local y
      if em then y = T.to(T.mul_(v, M.coef(me * L + slot)), "bf16")
      else
        for r = 0, rows - 1 do
          local c, at = 0, (slot * B + r) * K
          for k = 0, K - 1 do
            if pid[at + k] >= 0 then c = c + pw[at + k] * M.coef(me * L + pid[at + k]) end
          end
          T.mul_(T.narrow(v, 1, r + 1, 1), c)
        end
        y = T.to(v, "bf16")
      end
      out[slot] = { rows = rows, y = y }
    end
  end
  return out
end

-- What combine gives for my tokens (inp: my inputs), in fp64, from the experts' y.
function M.combine_ref(o, inp)
  prepared({ inp })
  local N, H, K = o.N, o.H, o.K
  local L = o.E / N
  local ref = T.fill_(tensor.empty({ inp.T, H }, { dtype = "f64", device = "cpu" }), 0)
  local vals = tensor.empty({ H }, { dtype = "f64", device = "cpu" })
  local pv = ptr(vals, "double*")
  for t = 0, inp.T - 1 do
    arrived(o.dtype == "fp8", inp.px, H, t, pv)
    local row = T.narrow(ref, 1, t + 1, 1)
    -- the weighted coefficient of each expert's row (expert_major), or of each rank's (rank_major,
    -- its selections in k order, as expert_outputs sums them)
    local parts, order = {}, {}
    for k = 0, K - 1 do
      local e = inp.pi[t * K + k]
      if e >= 0 then
        if o.output == "expert_major" then
          order[#order + 1] = { c = M.coef(e), w = inp.pw[t * K + k] }
        else
          local q = floor(e / L)
          if not parts[q] then
            parts[q] = { c = 0, w = 1 }
            order[#order + 1] = parts[q]
          end
          parts[q].c = parts[q].c + inp.pw[t * K + k] * M.coef(e)
        end
      end
    end
    for _, x in ipairs(order) do
      local r = rounded(T.clone(vals), x.c)
      T.add_(row, T.view(r, 1, H), x.w)
    end
  end
  return ref
end

-- Interpreted: they take raw pointers out of tensors and allocate after
-- (bindings/distlab/tensor.lua's note).
for _, fn in ipairs { host, ptr, prepared, rounded, nearest, M.check_dispatch, M.expert_outputs, M.combine_ref } do
  jit.off(fn)
end

return M
