-- distlab.cp.plan — where this rank's rows are in a context-parallel call,
-- and the bookkeeping the schedules share (views, buffers, metadata).
--
-- Sharding, for every algorithm: the sequence is cut into 2C chunks and rank
-- r holds chunks r and 2C-1-r, in that order (the dual-chunk split, which
-- gives every rank the same causal work; its arithmetic and its copies are
-- dl.seq's). bshd/sbhd: S divisible by 2C, a rank holds S/C positions.
-- thd: sequence b is padded to N_b rows, a multiple of 2C
-- (cu_seqlens_padded), and split the same way into chunks of c_b = N_b/2C
-- rows. Valid tokens come first in a sequence, so chunk j holds
-- clamp(L_b - j c_b, 0, c_b) of them and on every rank the valid rows of a
-- sequence are a prefix of its 2 c_b local rows (the second chunk has valid
-- rows only when the first is full).
--
-- thd steps pick rows through cu_seqlens (valid counts) and
-- cu_seqlens_padded (where each sequence's rows start), never by copying:
-- a plan collects these selections and uploads them as one int32 tensor
-- [2 per selection + 1, b+1] (memory tag "seqlens"), one host-to-device copy
-- per call. Its last row is this rank's padded offsets, for the merges.
--
-- Memory is read exactly on the meta device, so every tensor a schedule
-- makes is freed at a known point: views through plan:drop_views(), buffers
-- with plan.free(...), and the chunk copies of dl.seq free their views at
-- once. The garbage collector never decides a peak.
--
-- What a correction (cp/corrections.lua) or a schedule uses:
--   pl:result(qv, v, out_tag, lse_tag[, dtype]) -> {out =, lse =}   an empty
--       step result for the rows of qv (thd: 0 and -inf), dtype "f32" for fp32
--   pl:part(x, part[, "lse"])   rows "all" | "first" | "second" of a local
--       tensor along its sequence (or lse) dim: a view, freed by drop_views
--       (thd: x itself; rows are picked through cu_seqlens)
--   pl:merge_opts(part[, extra])   options of dl.attn.merge_lse / merge_out /
--       correct_grad for those rows (thd: this rank's padded offsets)
--   pl:opts(base, qsel, kvsel[, extra])   a step's dl.attn options
--   pl:track(view), pl:drop_views()    views freed together
--   plan.free(...)   free tensors now (nil skipped)
--   plan.wait(stream, event), plan.on(stream, event, fn), plan.keep(ts, stream)
--   fields: pl.C, pl.r, pl.layout, pl.thd, pl.device; bshd/sbhd pl.S_r
--       (positions per rank), pl.half; thd pl.B, pl.T_r, pl.L, pl.P
local dl = require "distlab"
local seq = require "distlab.seq"

local fail = dl.fail
local M = {}
local Plan = {}
Plan.__index = Plan

-- ---- geometry ------------------------------------------------------------------

-- Host values of a cu_seqlens argument: a Lua table or an int tensor.
local function host_ints(x, name)
  if type(x) == "table" then return x end
  if dl.is_tensor(x) then
    if x.device == "meta" then fail("cp: %s: on meta, pass cu_seqlens as Lua tables (a meta tensor holds no values)", name) end
    return x:tolist()
  end
  fail("cp: %s must be a Lua table or an int32 tensor, got %s", name, type(x))
end

-- Valid lengths L[b] and padded offsets P[b] (b = 1..B+1) of the full sequence.
function M.thd_lengths(seq, C)
  seq = seq or {}
  if seq.cu_seqlens_q == nil then fail("cp: layout thd needs cu_seqlens_q (of the full sequence)") end
  local cu = host_ints(seq.cu_seqlens_q, "cu_seqlens_q")
  local pad = seq.cu_seqlens_q_padded and host_ints(seq.cu_seqlens_q_padded, "cu_seqlens_q_padded") or cu
  for _, k in ipairs({ "cu_seqlens_kv", "cu_seqlens_kv_padded" }) do
    local mine = k:gsub("_kv", "_q")
    if seq[k] ~= nil and seq[k] ~= seq[mine] then
      local a, b = host_ints(seq[k], k), host_ints(seq[mine] or seq.cu_seqlens_q, mine)
      for i = 1, math.max(#a, #b) do
        if a[i] ~= b[i] then fail("cp: %s differs from %s; context parallelism needs the same sequences for q and kv", k, mine) end
      end
    end
  end
  local B = #cu - 1
  if B < 1 or #pad ~= #cu then fail("cp: cu_seqlens_q and cu_seqlens_q_padded need the same b+1 >= 2 entries") end
  if pad[1] ~= 0 then fail("cp: cu_seqlens_q_padded must start at 0 for the full sequence, got %d", pad[1]) end
  local L, N = {}, {}
  for b = 1, B do
    L[b], N[b] = cu[b + 1] - cu[b], pad[b + 1] - pad[b]
    if L[b] < 0 or L[b] > N[b] then
      fail("cp: sequence %d has %d valid tokens in %d padded rows", b, L[b], N[b])
    end
    if N[b] % (2 * C) ~= 0 then
      fail("cp: sequence %d has %d padded rows, not a multiple of 2C = %d (pad every sequence to a multiple of 2C)",
        b, N[b], 2 * C)
    end
  end
  return L, pad
end

-- plan.new{C =, r =, layout =, x =, seq =, full =, dim =, backend =}: the plan of
-- rank r of C. x is one of this rank's shards (q/k/v), or with full = true a
-- full-sequence tensor; dim is x's sequence dim when it is not the layout's
-- (an lse); seq holds the full-sequence cu_seqlens (thd); backend: dl.attn's,
-- put into every step's options (plan:opts).
function M.new(o)
  local C, r, layout, x = o.C, o.r, o.layout, o.x
  local p = setmetatable({ C = C, r = r, layout = layout, thd = layout == "thd", device = x.device,
    views = {}, sels = {}, sel_order = {}, backend = o.backend }, Plan)
  p.sdim = layout == "bshd" and 2 or 1 -- sequence dim of q/k/v/out
  p.ldim = layout == "thd" and 2 or 3  -- sequence dim of lse
  local n = x:size(o.dim or p.sdim)
  if p.thd then
    p.L, p.P = M.thd_lengths(o.seq, C)
    p.B = #p.L
    p.T = p.P[p.B + 1]
    p.T_r = p.T / C
    local want = o.full and p.T or p.T_r
    if n ~= want then
      fail("cp: the thd %s has %d rows, but cu_seqlens_padded gives %d%s", o.full and "tensor" or "shard",
        n, want, o.full and "" or string.format(" (%d / C) per rank", p.T))
    end
    p.c, p.loc = seq.chunk_sizes(p.P, C)
  else
    if o.full then
      if n % (2 * C) ~= 0 then
        fail("cp: sequence length %d is not divisible by 2C = %d (each rank holds two chunks)", n, 2 * C)
      end
      n = n / C
    elseif n % 2 ~= 0 then
      fail("cp: the shard has %d positions; the full length must be divisible by 2C = %d (each rank holds two chunks)",
        n, 2 * C)
    end
    p.S_r, p.half = n, n / 2
  end
  return p
end

-- thd: counts and starts (local rows) of rank `rank`'s part "all" | "first" | "second".
function Plan:local_rows(rank, part)
  local counts, starts = {}, {}
  for b = 1, self.B do
    local v1 = seq.chunk_valid(self.L[b], self.c[b], rank)
    local v2 = seq.chunk_valid(self.L[b], self.c[b], 2 * self.C - 1 - rank)
    counts[b] = part == "all" and v1 + v2 or part == "first" and v1 or v2
    starts[b] = self.loc[b] + (part == "second" and self.c[b] or 0)
  end
  return counts, starts
end

-- ---- thd selections --------------------------------------------------------------

-- Registers a row selection (thd): counts[b] valid rows starting at row
-- starts[b] of a tensor of `total` rows. Before upload().
function Plan:select(name, counts, starts, total)
  if not self.sels[name] then self.sel_order[#self.sel_order + 1] = name end
  local m = 1
  for b = 1, self.B do m = math.max(m, counts[b]) end
  self.sels[name] = { counts = counts, starts = starts, total = total or self.T_r, max = m }
end

-- One int32 tensor for every selection (tag "seqlens"); sel.cu, sel.pad are views.
function Plan:upload()
  if not self.thd then return end
  local B, rows = self.B, {}
  for _, name in ipairs(self.sel_order) do
    local s = self.sels[name]
    local cu, pad = { 0 }, {}
    for b = 1, B do
      cu[b + 1] = cu[b] + s.counts[b]
      pad[b] = s.starts[b]
    end
    pad[B + 1] = s.total
    rows[#rows + 1], rows[#rows + 2] = cu, pad
  end
  rows[#rows + 1] = self.loc
  dl.mem.tag("seqlens", function()
    if self.device == "meta" then
      self.meta_t = dl.empty({ #rows, B + 1 }, { dtype = "i32", device = "meta" })
    else
      self.meta_t = dl.from_table(rows, { dtype = "i32", device = self.device })
    end
  end)
  self.keep = {}
  local function row(i)
    local v = self.meta_t:select(1, i)
    self.keep[#self.keep + 1] = v
    return v
  end
  for i, name in ipairs(self.sel_order) do
    self.sels[name].cu, self.sels[name].pad = row(2 * i - 1), row(2 * i)
  end
  self.padded = row(#rows)
end

function Plan:release()
  for _, v in ipairs(self.keep or {}) do v:free() end
  if self.meta_t then self.meta_t:free() end
  self.keep, self.meta_t, self.sels, self.sel_order = nil, nil, {}, {}
  self:drop_views()
end

-- Attention options for a step: base (mask, window, ...) plus, for thd, the
-- cu_seqlens of the q and kv selections.
function Plan:opts(base, qsel, kvsel, extra)
  local o = { backend = self.backend }
  for k, v in pairs(base) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  if self.thd then
    local q, kv = self.sels[qsel], self.sels[kvsel]
    o.cu_seqlens_q, o.cu_seqlens_q_padded, o.max_seqlen_q = q.cu, q.pad, q.max
    o.cu_seqlens_kv, o.cu_seqlens_kv_padded, o.max_seqlen_kv = kv.cu, kv.pad, kv.max
  end
  return o
end

-- Merge options (thd needs this rank's padded offsets).
function Plan:merge_opts(half, extra)
  local o = { layout = self.layout, half = half ~= "all" and half or nil }
  if self.thd then o.cu_seqlens_padded = self.padded end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- ---- views and buffers --------------------------------------------------------------

-- A view of rows `part` ("all" | "first" | "second") of a local tensor along
-- its sequence dim (what = "seq") or lse dim (what = "lse"). thd and "all"
-- give x itself (thd selects rows through cu_seqlens). Freed by drop_views.
function Plan:part(x, part, what)
  if part == "all" or self.thd then return x end
  local d = what == "lse" and self.ldim or self.sdim
  local v = x:narrow(d, part == "first" and 1 or self.half + 1, self.half)
  self.views[#self.views + 1] = v
  return v
end

-- Any view the schedule makes, freed with the others by drop_views.
function Plan:track(v)
  self.views[#self.views + 1] = v
  return v
end

function Plan:drop_views()
  for _, v in ipairs(self.views) do v:free() end
  self.views = {}
end

-- Empty (out, lse) for the attention of qv (a q or a view of its rows) with
-- v's head dim, under tags out_tag / lse_tag; thd: zero / -inf, so that rows
-- no step writes read as "nothing" in the merges. out is qv's dtype, or
-- `dtype` ("f32": a partial kept in fp32, which dl.attn.fwd writes).
function Plan:result(qv, v, out_tag, lse_tag, dtype)
  local shape = qv.shape
  shape[#shape] = v:size(-1)
  local lshape
  if self.thd then lshape = { shape[2], shape[1] }
  elseif self.layout == "bshd" then lshape = { shape[1], shape[3], shape[2] }
  else lshape = { shape[2], shape[3], shape[1] } end
  local out = dl.mem.tag(out_tag, dl.empty, shape, { dtype = dtype or qv.dtype, device = qv.device })
  local lse = dl.mem.tag(lse_tag, dl.empty, lshape, { dtype = "f32", device = qv.device })
  if self.thd then
    out:zero_()
    lse:fill_(-math.huge)
  end
  return { out = out, lse = lse }
end

-- Frees tensors now (nil entries skipped): the allocator, not the GC, decides.
function M.free(...)
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if t ~= nil then t:free() end
  end
end

-- Tensors ts are (also) used on stream s: the allocator waits for s before
-- their memory is reused.
function M.keep(ts, s)
  for _, t in ipairs(ts) do t:record_stream(s) end
end

-- Stream s (nil: the default stream) waits for event ev.
function M.wait(s, ev)
  dl.check(dl.C.dl_stream_wait_event(s and s.ptr or nil, ev.ptr))
end

-- Runs fn on stream s and records ev there.
function M.on(s, ev, fn)
  dl.with_stream(s, fn)
  ev:record(s)
end

-- ---- dual-chunk order <-> sequence order ---------------------------------------------

-- Copies between a shard of rank j and the full sequence along dim d (thd:
-- rows, also for an lse [h, t] with d = 2). to_seq: shard -> full.
function Plan:copy_pieces(j, shard, full, d, to_seq)
  local p = self.thd and self.P or { 0, shard:size(d) * self.C }
  seq.copy_chunks(shard, full, d, seq.chunk_segments(p, j, self.C), to_seq)
end

-- Copies between `ranked` ([C, ...shard], rank j's shard at index j+1) and
-- `full` (the sequence in order). to_seq = true: ranked -> full.
function Plan:reorder(ranked, full, d, to_seq)
  for j = 0, self.C - 1 do
    local shard = ranked:select(1, j + 1)
    self:copy_pieces(j, shard, full, d, to_seq)
    shard:free()
  end
end

return M
