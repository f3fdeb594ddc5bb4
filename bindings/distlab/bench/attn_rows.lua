-- distlab.bench.attn_rows — attention checked against fp64 on the host at
-- sampled rows, for shapes whose whole reference costs too much (s^2 d per
-- head). It reads only the tensors it is given and computes softmax(scale q
-- k^T) v and its gradients itself, in plain fp64 loops (core/bench/attn_rows.c,
-- on host copies of the rows it needs; threads share the rows:
-- DISTLAB_CHECK_THREADS, else one a core): it shares no code with dl.attn's
-- kernels or their cpu twin.
--
--   local rows = require "distlab.bench.attn_rows"
--   local R = rows.prepare { q =, k =, v =, dout = (for dq), opts = (dl.attn's options: layout,
--     mask, window, align, scale, cu_seqlens_*), elements = 1e5, keys = 0.25, seed =,
--     part = {r, C}, all = false }
--   local n_wrong, msg, err, maxabs = R:check { out =, lse =, dq =, dk =, dv = }
--       msg: what was wrong, or (n_wrong 0) what each comparison found (--show-checks)
--
-- Query rows: spread over every (sequence, query head) slice, about
-- `elements` / d of them in all (every row where there are fewer), each with
-- its full softmax over the keys it sees: out and lse, and dq (with dout)
-- from the reference's own out and lse. prepare computes these once; check
-- compares any number of results with them (cp_bench checks every strategy
-- against one prepare).
-- Key rows: `keys` times as many, in a few (sequence, kv head) slices spread
-- over all (4, or one a rank), each with dk and dv summed over every query
-- that sees it, of every query head of its group. Those need the q, dout, lse
-- and out of every query of their slice (hence few slices, more rows each):
-- check takes out and lse from the ones it is given (the ones the backward was
-- handed), as the backward itself does; their own rows are checked beside. all = true: every query and key row (small shapes), and
-- for thd, the rows outside the sequences of out, dq, dk, dv must be 0.
-- part = {r, C}: this process checks the slices i with i % C == r (ranks
-- share the work; their counts add up over the ranks).
--
-- Each result is compared element-wise (atol + rtol |ref|), normwise
-- (||got - ref|| / ||ref|| over the rows checked) and by its bias (<got - ref,
-- ref> / <ref, ref>: a scale error is all bias, rounding has none), as
-- distlab.bench.verify counts them: non-finite values are wrong, a normwise
-- or bias miss adds one. The tolerances (rows.TOL): TransformerEngine's
-- element-wise ones; normwise 8e-3 for bf16 (rounding alone: about 2e-3),
-- 2e-3 for f16, 1e-5 for the fp32 lse; bias 2^-10 (from 1024 elements), so a
-- result scaled by 1.01 fails both ways; out, dq, dk, dv are compared as rows
-- (verify's tol.rows: the bias's noise is judged over rows, not elements). err, maxabs: the normwise error and the largest
-- |got - ref| of each result checked (over this process's rows).
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local verify = require "distlab.bench.verify"

local C, check, fail = core.C, core.check, core.fail
local T = tensor.methods
local max, min, floor, ceil = math.max, math.min, math.floor, math.ceil
local NINF = -math.huge

local M = {}

M.TOL = {
  bf16 = { atol = 2.5e-2, rtol = 2.5e-2, norm = 8e-3, bias = 2 ^ -10 },
  f16 = { atol = 5e-3, rtol = 5e-3, norm = 2e-3, bias = 2 ^ -10 },
  lse = { atol = 1e-3, rtol = 1e-4, norm = 1e-5, bias = 2 ^ -10 },
}

-- ---- geometry --------------------------------------------------------------------------

local function list(x)
  if x == nil then return nil end
  if tensor.is_tensor(x) then return T.tolist(x) end
  return x
end

-- Sequences, heads and the visible key range of each query (window
-- semantics as distlab.attn states them).
local function geometry(q, k, v, o)
  o = o or {}
  local layout = o.layout or "bshd"
  local g = { layout = layout, hq = T.size(q, -2), hkv = T.size(k, -2), dqk = T.size(q, -1), dv = T.size(v, -1),
    ql = {}, kl = {}, qs = {}, ks = {} }
  g.scale = o.scale or 1 / math.sqrt(g.dqk)
  if g.hq % g.hkv ~= 0 then fail("attn_rows: %d query heads over %d kv heads", g.hq, g.hkv) end
  if layout == "thd" then
    local cq = list(o.cu_seqlens_q)
    if not cq then fail("attn_rows: thd needs cu_seqlens_q") end
    local ck = list(o.cu_seqlens_kv) or cq
    local pq, pk = list(o.cu_seqlens_q_padded) or cq, list(o.cu_seqlens_kv_padded) or list(o.cu_seqlens_kv) or ck
    if not o.cu_seqlens_kv_padded and not o.cu_seqlens_kv and o.cu_seqlens_q_padded then pk = pq end
    g.b = #cq - 1
    for b = 1, g.b do
      g.ql[b], g.kl[b] = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
      g.qs[b], g.ks[b] = pq[b], pk[b]
    end
    g.tq, g.tk = T.size(q, 1), T.size(k, 1)
  else
    local sdim, bdim = layout == "bshd" and 2 or 1, layout == "bshd" and 1 or 2
    g.b = T.size(q, bdim)
    for b = 1, g.b do g.ql[b], g.kl[b], g.qs[b], g.ks[b] = T.size(q, sdim), T.size(k, sdim), 0, 0 end
  end
  local wl, wr, br = -1, -1, o.align == "bottom_right"
  if o.window then wl, wr = o.window[1], o.window[2] end
  if o.mask == "causal" then wr, br = 0, false end
  if o.mask == "causal_bottom_right" then wr, br = 0, true end
  g.wl, g.wr, g.br = wl, wr, br
  return g
end

-- ---- host copies ---------------------------------------------------------------------------

-- Rows [start, start + n) of sequence b (0-based), head h, of t: a contiguous
-- f64 host tensor [n, d] ([n] for an lse) and its data.
local function slice(g, t, b, start, n, h, is_lse)
  local s
  if is_lse then
    if g.layout == "thd" then s = T.narrow(T.select(t, 1, h + 1), 1, start + 1, n)
    else s = T.narrow(T.select(T.select(t, 1, b + 1), 1, h + 1), 1, start + 1, n) end
  elseif g.layout == "bshd" then s = T.select(T.narrow(T.select(t, 1, b + 1), 1, start + 1, n), 2, h + 1)
  elseif g.layout == "sbhd" then s = T.select(T.select(T.narrow(t, 1, start + 1, n), 2, b + 1), 2, h + 1)
  else s = T.select(T.narrow(t, 1, start + 1, n), 2, h + 1) end
  s = T.contiguous(s)
  if s.device ~= "cpu" then s = T.to(s, "cpu") end
  s = T.contiguous(T.to(s, "f64"))
  return s, ffi.cast("double*", T.data_ptr(s))
end

-- The listed rows (0-based, of sequence b from `start`) of head h of t, one after
-- the other: a host f64 [#rows, width] and its data (a copy a row: few rows of
-- a long sequence cost little).
local function pick(g, t, b, start, rows, h, width, is_lse)
  local out = tensor.empty({ math.max(#rows, 1), width }, { dtype = "f64", device = "cpu" })
  local p = ffi.cast("double*", T.data_ptr(out))
  for n, r in ipairs(rows) do
    local _, q = slice(g, t, b, start + r, 1, h, is_lse)
    ffi.copy(p + (n - 1) * width, q, 8 * width)
  end
  return out, p
end

-- ---- the fp64 arithmetic, in C ----------------------------------------------------------

-- Slice b (0-based) of g for C, and the listed rows (0-based) as C's int64s.
local function ref_slice(g, b)
  return ffi.new("dl_attn_ref_slice_t", { ql = g.ql[b + 1], kl = g.kl[b + 1], dqk = g.dqk, dv = g.dv,
    wl = g.wl, wr = g.wr, bottom_right = g.br and 1 or 0, scale = g.scale })
end
local function int64s(rows)
  local p = ffi.new("int64_t[?]", max(#rows, 1))
  for n, r in ipairs(rows) do p[n - 1] = r end
  return p
end

-- ---- sampling ---------------------------------------------------------------------------

-- The slices (b, h) with rows (at most `most` of them, spread over all), and
-- the rows of each: `total` spread evenly over them (every row when `total`
-- is nil or covers them all).
local function sample(lens, heads, B, total, seed, most)
  local all, slices, avail = {}, {}, 0
  for b = 1, B do
    for h = 0, heads - 1 do
      if lens[b] > 0 then all[#all + 1] = { b = b - 1, h = h, n = lens[b] } end
    end
  end
  for _, i in ipairs(verify.spread(#all, most or #all, seed)) do
    slices[#slices + 1] = all[i + 1]
    avail = avail + all[i + 1].n
  end
  local per = (total and total < avail) and max(1, ceil(total / #slices)) or math.huge
  for i, s in ipairs(slices) do s.rows = verify.spread(s.n, min(per, s.n), (seed or 1) * 7919 + i) end
  return slices
end

-- ---- prepare and check -----------------------------------------------------------------

local R = {}
R.__index = R

local function doubles(n) return ffi.new("double[?]", max(n, 1)) end

function M.prepare(o)
  if type(o) ~= "table" then fail("attn_rows.prepare: expected a table") end
  for _, key in ipairs { "q", "k", "v" } do
    if not tensor.is_tensor(o[key]) then fail("attn_rows.prepare: %s must be a tensor", key) end
  end
  local g = geometry(o.q, o.k, o.v, o.opts)
  local r = setmetatable({ g = g, q = o.q, k = o.k, v = o.v, dout = o.dout, all = o.all,
    dtype = o.q.dtype, part = o.part or { 0, 1 } }, R)
  local rows_q = not o.all and ceil((o.elements or 1e5) / min(g.dqk, g.dv)) or nil
  local rows_k = rows_q and max(1, ceil(rows_q * (o.keys or 0.25))) or nil
  r.qslices = sample(g.ql, g.hq, g.b, rows_q, o.seed)
  -- key rows need every query of their slice: in a few slices (4, or one a rank), more rows each
  r.kslices = sample(g.kl, g.hkv, g.b, rows_k, (o.seed or 1) + 1, not o.all and max(4, r.part[2]) or nil)
  local mine = function(i) return (i - 1) % r.part[2] == r.part[1] end
  -- the query rows' reference, slice by slice
  local nq = 0
  for i, s in ipairs(r.qslices) do if mine(i) then nq = nq + #s.rows end end
  r.nq = nq
  r.ref_out, r.ref_lse = doubles(nq * g.dv), doubles(nq)
  r.ref_dq = o.dout and doubles(nq * g.dqk) or nil
  local at = 0
  local group = g.hq / g.hkv
  local kv = {} -- the K and V slices of the last (b, hk)
  for i, s in ipairs(r.qslices) do
    if mine(i) then
      local b, h = s.b, s.h
      local kl = g.kl[b + 1]
      local hk = floor(h / group)
      if kl > 0 and kv.key ~= b * g.hkv + hk then
        kv = { key = b * g.hkv + hk }
        kv.k, kv.K = slice(g, o.k, b, g.ks[b + 1], kl, hk)
        kv.v, kv.V = slice(g, o.v, b, g.ks[b + 1], kl, hk)
      end
      -- the sampled rows of q and dout, one after the other, as C reads them
      local qt, Q = pick(g, o.q, b, g.qs[b + 1], s.rows, h, g.dqk)
      local dt, dO
      if o.dout then dt, dO = pick(g, o.dout, b, g.qs[b + 1], s.rows, h, g.dv) end
      check(C.dl_attn_ref_queries(ref_slice(g, b), #s.rows, int64s(s.rows), Q, dO, kl > 0 and kv.K or nil,
        kl > 0 and kv.V or nil, r.ref_out + at * g.dv, r.ref_lse + at, r.ref_dq and r.ref_dq + at * g.dqk))
      at = at + #s.rows
      qt, dt = nil, nil
    end
  end
  return r
end

local function as_tensor(buf, n)
  local t = tensor.empty({ n }, { dtype = "f64", device = "cpu" })
  if n > 0 then ffi.copy(T.data_ptr(t), buf, 8 * n) end
  return t
end

-- normwise error and max |got - ref| (inf where got is not finite)
local function rel(got, ref, n)
  local num, den, mx = 0, 0, 0
  for i = 0, n - 1 do
    local d = got[i] - ref[i]
    num, den = num + d * d, den + ref[i] * ref[i]
    if not (math.abs(d) <= mx) then mx = d == d and math.abs(d) or math.huge end
  end
  if num ~= num then return math.huge, math.huge end
  if den == 0 then return num == 0 and 0 or math.huge, mx end
  return math.sqrt(num / den), mx
end

-- got: {out, lse, dq, dk, dv}, full tensors on any device; dk, dv need out and
-- lse (those the backward was handed) and the dout given to prepare.
function R:check(got)
  local g = self.g
  local tol = M.TOL[self.dtype] or M.TOL.bf16
  local mine = function(i) return (i - 1) % self.part[2] == self.part[1] end
  local bufs = {}
  local function buf(name, n) bufs[name] = bufs[name] or { p = doubles(n), n = n } return bufs[name].p end
  -- query rows: out, lse, dq
  local at = 0
  for i, s in ipairs(self.qslices) do
    if mine(i) then
      local b, h = s.b, s.h
      local ql = g.ql[b + 1]
      for _, name in ipairs { "out", "dq", "lse" } do
        if got[name] then
          local w = name == "out" and g.dv or name == "dq" and g.dqk or 1
          local t, p = pick(g, got[name], b, g.qs[b + 1], s.rows, h, w, name == "lse")
          ffi.copy(buf(name, self.nq * w) + at * w, p, 8 * w * #s.rows)
          t = nil
        end
      end
      at = at + #s.rows
    end
  end
  local refs = { out = self.ref_out, lse = self.ref_lse, dq = self.ref_dq }
  if got.dq and not self.ref_dq then fail("attn_rows: dq to check, but prepare had no dout") end
  -- key rows: dk, dv against the handed out and lse
  local bad_lse = 0
  if got.dk or got.dv then
    if not (got.out and got.lse and self.dout) then fail("attn_rows: dk/dv need out, lse (checked beside) and dout") end
    local nk = 0
    for i, s in ipairs(self.kslices) do if mine(i) then nk = nk + #s.rows end end
    local rk, rv = doubles(nk * g.dqk), doubles(nk * g.dv)
    local gk, gv = buf("dk", nk * g.dqk), buf("dv", nk * g.dv)
    local group, kat = g.hq / g.hkv, 0
    local n_bad = ffi.new("int64_t[1]")
    for i, s in ipairs(self.kslices) do
      if mine(i) then
        local b, hk = s.b, s.h
        local ql, kl = g.ql[b + 1], g.kl[b + 1]
        local keep, nh = {}, ql > 0 and group or 0
        local heads = { Q = ffi.new("const double*[?]", max(nh, 1)), dO = ffi.new("const double*[?]", max(nh, 1)),
          O = ffi.new("const double*[?]", max(nh, 1)), L = ffi.new("const double*[?]", max(nh, 1)) }
        local K, V
        keep[#keep + 1], K = pick(g, self.k, b, g.ks[b + 1], s.rows, hk, g.dqk)
        keep[#keep + 1], V = pick(g, self.v, b, g.ks[b + 1], s.rows, hk, g.dv)
        for n = 0, nh - 1 do
          local h = hk * group + n
          keep[#keep + 1], heads.Q[n] = slice(g, self.q, b, g.qs[b + 1], ql, h)
          keep[#keep + 1], heads.dO[n] = slice(g, self.dout, b, g.qs[b + 1], ql, h)
          keep[#keep + 1], heads.O[n] = slice(g, got.out, b, g.qs[b + 1], ql, h)
          keep[#keep + 1], heads.L[n] = slice(g, got.lse, b, g.qs[b + 1], ql, h, true)
        end
        check(C.dl_attn_ref_keys(ref_slice(g, b), #s.rows, int64s(s.rows), K, V, nh, heads.Q, heads.dO, heads.O,
          heads.L, rk + kat * g.dqk, rv + kat * g.dv, n_bad))
        bad_lse = bad_lse + tonumber(n_bad[0])
        for _, x in ipairs { { got.dk, gk, g.dqk }, { got.dv, gv, g.dv } } do
          if x[1] then
            local t, p = pick(g, x[1], b, g.ks[b + 1], s.rows, hk, x[3])
            ffi.copy(x[2] + kat * x[3], p, 8 * x[3] * #s.rows)
            keep[#keep + 1] = t
          end
        end
        kat = kat + #s.rows
        keep, heads = nil, nil
      end
    end
    refs.dk, refs.dv = rk, rv
    bufs.dk.n, bufs.dv.n = nk * g.dqk, nk * g.dv
  end
  -- a row that sees no key: lse -inf in both (then left out of the comparison), or wrong
  local wrong, msgs, errs, maxabs, fine = 0, {}, {}, {}, {}
  if got.lse and bufs.lse then
    local gp, rp, n_inf = bufs.lse.p, doubles(bufs.lse.n), 0
    ffi.copy(rp, refs.lse, 8 * bufs.lse.n)
    refs.lse = rp
    for i = 0, bufs.lse.n - 1 do
      if rp[i] == NINF then
        if gp[i] ~= NINF then n_inf = n_inf + 1 end
        gp[i], rp[i] = 0, 0
      end
    end
    if n_inf > 0 then
      wrong = wrong + n_inf
      msgs[#msgs + 1] = string.format("lse: %d rows that see no key are not -inf", n_inf)
    end
  end
  for _, name in ipairs { "out", "lse", "dq", "dk", "dv" } do
    local gb = bufs[name]
    if got[name] and gb then
      local n = gb.n
      local t = name == "lse" and M.TOL.lse or tol
      if name ~= "lse" then -- a row's errors go together (its softmax): the rows are the bias's samples
        t = setmetatable({ rows = (name == "out" or name == "dv") and g.dv or g.dqk }, { __index = t })
      end
      local gt, rt = as_tensor(gb.p, n), as_tensor(refs[name], n)
      errs[name], maxabs[name] = rel(gb.p, refs[name], n)
      local w, msg = verify.close(gt, rt, t)
      if w > 0 then
        wrong = wrong + w
        msgs[#msgs + 1] = name .. ": " .. msg
      else
        fine[#fine + 1] = name .. ": " .. msg
      end
    end
  end
  if bad_lse > 0 then
    wrong = wrong + bad_lse
    msgs[#msgs + 1] = string.format("%d key rows need an lse that is not finite (the one handed to the backward)", bad_lse)
  end
  if self.all and g.layout == "thd" then
    local w, msg = self:gaps(got)
    if w > 0 then
      wrong = wrong + w
      msgs[#msgs + 1] = msg
    end
  end
  -- the message: what was wrong, or (all fine) what each comparison found
  return wrong, table.concat(wrong > 0 and msgs or fine, "; "), errs, maxabs
end

-- thd: rows outside the sequences of out, dq (query rows) and dk, dv (key
-- rows) that are not 0.
function R:gaps(got)
  local g = self.g
  local function outside(starts, lens, total)
    local inside, rows = {}, {}
    for b = 1, g.b do for r = starts[b], starts[b] + lens[b] - 1 do inside[r] = true end end
    for r = 0, total - 1 do if not inside[r] then rows[#rows + 1] = r end end
    return rows
  end
  local qgaps, kgaps = outside(g.qs, g.ql, g.tq), outside(g.ks, g.kl, g.tk)
  local bad = 0
  for _, name in ipairs { "out", "dq", "dk", "dv" } do
    local t = got[name]
    if t then
      for _, r in ipairs((name == "out" or name == "dq") and qgaps or kgaps) do
        local row = T.to(T.contiguous(T.narrow(t, 1, r + 1, 1)), "cpu")
        local c = require("distlab.compare").compare(row, tensor.empty(row.shape, { dtype = row.dtype, device = "cpu" })
          :fill_(0), 0, 0)
        bad = bad + tonumber(c.n_not_close) + tonumber(c.n_nonfinite_a)
      end
    end
  end
  return bad, bad > 0 and string.format("%d elements outside the sequences are not 0", bad) or nil
end

-- What a check covers, for a bench's header line.
function R:describe()
  local nq, nk = 0, 0
  for _, s in ipairs(self.qslices) do nq = nq + #s.rows end
  for _, s in ipairs(self.kslices) do nk = nk + #s.rows end
  local q = string.format("%d query rows over %d (sequence, head) slices (%d elements of out)", nq, #self.qslices,
    nq * self.g.dv)
  if not self.dout then return q end -- no dout: no key rows are checked (dk, dv need it)
  return string.format("%s, %d key rows over %d slices", q, nk, #self.kslices)
end

-- Interpreted: they take raw pointers out of tensors and allocate after
-- (bindings/distlab/tensor.lua's note); the loops they call stay compiled.
for _, fn in ipairs { slice, pick, M.prepare, R.check, R.gaps, as_tensor } do jit.off(fn) end

return M
