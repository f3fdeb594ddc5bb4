-- distlab.seq — how context parallelism cuts sequences: the load-balanced
-- dual-chunk split (cut each sequence into 2C chunks; rank r holds chunks r
-- and 2C-1-r, so every rank gets the same share of a causal mask), its
-- inverse, the reorders between rank order (the parts of all ranks one after
-- another, as an all-gather returns them) and sequence order, and the same
-- for thd, whose sequences are first padded to multiples of 2C. This is the
-- one implementation of the split: dl.cp's plans (cp/plan.lua) use it too.
--
-- Ranks are 0-based (as DISTLAB_RANK); dims are 1-based. Everything moves
-- whole chunks with narrow + copy_ (one copy per chunk, adjacent chunks
-- fused), never single elements, and frees each view at once (so the
-- allocator, not the garbage collector, decides when memory returns);
-- results are new tensors on x's device.
--
-- bshd / sbhd (sequence dim 2 / 1, its length divisible by 2C):
--   seq.dual_chunk(x, rank, C, layout)    -> rank's part, sequence dim s/C
--   seq.dual_unchunk(parts, C, layout)    -> x from {part of rank 0, ..., rank C-1}
--   seq.to_sequence_order(x, C, layout)   x holds the C parts in rank order
--   seq.to_rank_order(x, C, layout)       the inverse
-- thd (x [t, h, d]; cu_seqlens_padded i32 [b+1], every padded length a
-- multiple of 2C; a rank's part puts sequence i at rows (p[i] - p[1]) / C,
-- so its own cu_seqlens_padded is (p - p[1]) / C):
--   seq.thd_pad(cu_seqlens, C)                    -> cu_seqlens_padded (starts at 0)
--   seq.thd_pad_rows(x, cu_seqlens, cu_padded)    -> rows moved to padded offsets, zeros between
--   seq.thd_unpad_rows(x, cu_seqlens, cu_padded)  -> the packed rows again
--   seq.thd_dual_chunk(x, cu_padded, rank, C)     -> rank's part, (p[b+1] - p[1]) / C rows
--   seq.thd_dual_unchunk(parts, cu_padded, C)     -> p[b+1] - p[1] rows, sequence i at p[i] - p[1]
--   seq.thd_to_sequence_order(x, cu_padded, C), seq.thd_to_rank_order(x, cu_padded, C)
--   seq.thd_partition_indices(cu_padded, rank, C) -> i32 rows of the full tensor that rank holds
--   seq.thd_local_seqlens(cu_seqlens, cu_padded, rank, C) -> cu_seqlens, cu_seqlens_padded of
--                                                  rank's part (valid tokens stay a prefix)
-- The split itself, on Lua numbers (p: padded offsets as a Lua table, p[1]
-- need not be 0; bshd/sbhd are one sequence, {0, s}), which all of the
-- above are built on, and which dl.cp's plans call (no argument checks):
--   seq.chunk_sizes(p, C)          -> c, at: c[i] rows per chunk of sequence i,
--                                     at[i] = (p[i] - p[1]) / C where it starts in
--                                     a part (b+1 entries: at[b+1] = the part's rows)
--   seq.chunk_segments(p, rank, C) -> {{sequence row, part row, rows}, ...}, 0-based:
--                                     chunks rank, 2C-1-rank of every sequence, in
--                                     the part's order; sequence rows as in p
--   seq.chunk_valid(len, c, j)     -> valid tokens in chunk j (of c rows) of a
--                                     sequence of len (valid tokens come first)
--   seq.copy_chunks(part, x, dim, segs, to_seq)  the copies of segs along dim:
--                                     x -> part, or part -> x with to_seq
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local create = require "distlab.create"

local fail = core.fail
local T = tensor.methods
local M = {}

local function want_int(op, name, x, lo)
  if type(x) ~= "number" or x ~= math.floor(x) or x < lo then
    fail("%s: %s must be an integer >= %d, got %s", op, name, lo, tostring(x))
  end
  return x
end

local function want_tensor(op, name, x)
  if not tensor.is_tensor(x) then fail("%s: %s must be a tensor, got %s", op, name, type(x)) end
  return x
end

local function rank_arg(op, rank, C)
  want_int(op, "C (the CP size)", C, 1)
  want_int(op, "rank", rank, 0)
  if rank >= C then fail("%s: rank %d is not below the CP size %d", op, rank, C) end
end

local function seq_dim(op, x, layout)
  layout = layout or "bshd"
  if layout ~= "bshd" and layout ~= "sbhd" then
    fail("%s: layout %s is not bshd or sbhd (thd has its own helpers)", op, tostring(layout))
  end
  local d = layout == "bshd" and 2 or 1
  if x.nd < d then fail("%s: a %d-dim tensor has no sequence dim %d", op, x.nd, d) end
  return d
end

-- Copies of segments {from, to, len} (0-based rows) along dim; adjacent
-- segments that stay adjacent are fused into one copy.
local function move(dst, src, dim, segs)
  local cur
  local function flush()
    if cur and cur[3] > 0 then
      local to, from = T.narrow(dst, dim, cur[2] + 1, cur[3]), T.narrow(src, dim, cur[1] + 1, cur[3])
      T.copy_(to, from)
      T.free(to)
      T.free(from)
    end
  end
  for _, s in ipairs(segs) do
    if cur and cur[1] + cur[3] == s[1] and cur[2] + cur[3] == s[2] then
      cur[3] = cur[3] + s[3]
    else
      flush()
      cur = { s[1], s[2], s[3] }
    end
  end
  flush()
  return dst
end

local function inverse(segs)
  local r = {}
  for i, s in ipairs(segs) do r[i] = { s[2], s[1], s[3] } end
  return r
end

local function empty_with(x, dim, n, zero)
  local shape = x.shape
  shape[dim] = n
  local t = tensor.empty(shape, { dtype = x.dtype, device = x.device })
  return zero and T.zero_(t) or t
end

-- ---- the split, on Lua numbers -------------------------------------------------

function M.chunk_sizes(p, C)
  local c, at = {}, {}
  for i = 1, #p - 1 do
    c[i] = (p[i + 1] - p[i]) / (2 * C)
    at[i] = (p[i] - p[1]) / C
  end
  at[#p] = (p[#p] - p[1]) / C
  return c, at
end

function M.chunk_segments(p, rank, C)
  local c, at = M.chunk_sizes(p, C)
  local segs = {}
  for i = 1, #p - 1 do
    segs[#segs + 1] = { p[i] + rank * c[i], at[i], c[i] }
    segs[#segs + 1] = { p[i] + (2 * C - 1 - rank) * c[i], at[i] + c[i], c[i] }
  end
  return segs
end

function M.chunk_valid(len, c, j)
  return math.max(0, math.min(c, len - j * c))
end

function M.copy_chunks(part, x, dim, segs, to_seq)
  if to_seq then return move(x, part, dim, inverse(segs)) end
  return move(part, x, dim, segs)
end

-- The segments of every rank, its part at its place in rank order, with
-- sequence rows from p[1].
local function rank_order_segs(p, C)
  local segs, total = {}, p[#p] - p[1]
  for r = 0, C - 1 do
    for _, s in ipairs(M.chunk_segments(p, r, C)) do
      segs[#segs + 1] = { s[1] - p[1], r * total / C + s[2], s[3] }
    end
  end
  return segs
end

-- ---- bshd / sbhd ---------------------------------------------------------------

-- The padded offsets of x's one sequence, {0, s}.
local function one_sequence(op, x, dim, C)
  local s = T.size(x, dim)
  if s % (2 * C) ~= 0 then
    fail("%s: sequence length %d is not divisible by 2C = %d", op, s, 2 * C)
  end
  return { 0, s }
end

function M.dual_chunk(x, rank, C, layout)
  local op = "seq.dual_chunk"
  want_tensor(op, "x", x)
  rank_arg(op, rank, C)
  local d = seq_dim(op, x, layout)
  local p = one_sequence(op, x, d, C)
  return M.copy_chunks(empty_with(x, d, p[2] / C), x, d, M.chunk_segments(p, rank, C))
end

function M.dual_unchunk(parts, C, layout)
  local op = "seq.dual_unchunk"
  want_int(op, "C (the CP size)", C, 1)
  if type(parts) ~= "table" or #parts ~= C then fail("%s: expected a list of C = %d parts", op, C) end
  local d = seq_dim(op, want_tensor(op, "parts[1]", parts[1]), layout)
  local n = T.size(parts[1], d)
  local out = empty_with(parts[1], d, n * C)
  for r = 0, C - 1 do
    local part = want_tensor(op, "parts[" .. r + 1 .. "]", parts[r + 1])
    if T.size(part, d) ~= n then fail("%s: parts differ in sequence length", op) end
    M.copy_chunks(part, out, d, M.chunk_segments({ 0, n * C }, r, C), true)
  end
  return out
end

function M.to_sequence_order(x, C, layout)
  local op = "seq.to_sequence_order"
  want_tensor(op, "x", x)
  want_int(op, "C (the CP size)", C, 1)
  local d = seq_dim(op, x, layout)
  local p = one_sequence(op, x, d, C)
  return move(empty_with(x, d, p[2]), x, d, inverse(rank_order_segs(p, C)))
end

function M.to_rank_order(x, C, layout)
  local op = "seq.to_rank_order"
  want_tensor(op, "x", x)
  want_int(op, "C (the CP size)", C, 1)
  local d = seq_dim(op, x, layout)
  local p = one_sequence(op, x, d, C)
  return move(empty_with(x, d, p[2]), x, d, rank_order_segs(p, C))
end

-- ---- thd -----------------------------------------------------------------------

local function cu_values(op, name, cu)
  want_tensor(op, name, cu)
  if cu.dtype ~= "i32" or cu.nd ~= 1 or T.numel(cu) < 1 then
    fail("%s: %s must be a 1-D i32 tensor with b+1 entries", op, name)
  end
  local v = T.tolist(cu)
  for i = 2, #v do
    if v[i] < v[i - 1] then fail("%s: %s decreases at entry %d (%d after %d)", op, name, i, v[i], v[i - 1]) end
  end
  return v
end

local function i32_on(values, device)
  return create.from_table(values, { dtype = "i32", device = device })
end

-- The padded offsets as a Lua table; every padded length a multiple of 2C.
local function padded_offsets(op, cu_padded, C)
  local p = cu_values(op, "cu_seqlens_padded", cu_padded)
  for i = 1, #p - 1 do
    local len = p[i + 1] - p[i]
    if len % (2 * C) ~= 0 then
      fail("%s: padded length %d of sequence %d is not a multiple of 2C = %d (use seq.thd_pad)",
        op, len, i, 2 * C)
    end
  end
  return p, p[#p] - p[1]
end

function M.thd_pad(cu_seqlens, C)
  local op = "seq.thd_pad"
  want_int(op, "C (the CP size)", C, 1)
  local v = cu_values(op, "cu_seqlens", cu_seqlens)
  local out, m = { 0 }, 2 * C
  for i = 2, #v do
    local len = v[i] - v[i - 1]
    out[i] = out[i - 1] + math.ceil(len / m) * m
  end
  return i32_on(out, cu_seqlens.device)
end

local function pad_segs(op, cu_seqlens, cu_padded)
  local v = cu_values(op, "cu_seqlens", cu_seqlens)
  local p = cu_values(op, "cu_seqlens_padded", cu_padded)
  if #v ~= #p then fail("%s: cu_seqlens and cu_seqlens_padded differ in length", op) end
  local segs = {}
  for i = 1, #v - 1 do
    local len = v[i + 1] - v[i]
    if len > p[i + 1] - p[i] then
      fail("%s: sequence %d has %d tokens but %d padded rows", op, i, len, p[i + 1] - p[i])
    end
    segs[i] = { v[i], p[i], len }
  end
  return segs, v[#v], p[#p]
end

function M.thd_pad_rows(x, cu_seqlens, cu_padded)
  local op = "seq.thd_pad_rows"
  want_tensor(op, "x", x)
  local segs, _, rows = pad_segs(op, cu_seqlens, cu_padded)
  return move(empty_with(x, 1, rows, true), x, 1, segs)
end

function M.thd_unpad_rows(x, cu_seqlens, cu_padded)
  local op = "seq.thd_unpad_rows"
  want_tensor(op, "x", x)
  local segs, rows = pad_segs(op, cu_seqlens, cu_padded)
  return move(empty_with(x, 1, rows), x, 1, inverse(segs))
end

function M.thd_dual_chunk(x, cu_padded, rank, C)
  local op = "seq.thd_dual_chunk"
  want_tensor(op, "x", x)
  rank_arg(op, rank, C)
  local p, total = padded_offsets(op, cu_padded, C)
  return M.copy_chunks(empty_with(x, 1, total / C), x, 1, M.chunk_segments(p, rank, C))
end

function M.thd_dual_unchunk(parts, cu_padded, C)
  local op = "seq.thd_dual_unchunk"
  want_int(op, "C (the CP size)", C, 1)
  if type(parts) ~= "table" or #parts ~= C then fail("%s: expected a list of C = %d parts", op, C) end
  local p, total = padded_offsets(op, cu_padded, C)
  local out = empty_with(want_tensor(op, "parts[1]", parts[1]), 1, total)
  for r = 0, C - 1 do
    local segs = M.chunk_segments(p, r, C)
    for _, s in ipairs(segs) do s[1] = s[1] - p[1] end
    M.copy_chunks(want_tensor(op, "parts[" .. r + 1 .. "]", parts[r + 1]), out, 1, segs, true)
  end
  return out
end

function M.thd_to_sequence_order(x, cu_padded, C)
  local op = "seq.thd_to_sequence_order"
  want_tensor(op, "x", x)
  want_int(op, "C (the CP size)", C, 1)
  local p, total = padded_offsets(op, cu_padded, C)
  return move(empty_with(x, 1, total), x, 1, inverse(rank_order_segs(p, C)))
end

function M.thd_to_rank_order(x, cu_padded, C)
  local op = "seq.thd_to_rank_order"
  want_tensor(op, "x", x)
  want_int(op, "C (the CP size)", C, 1)
  local p, total = padded_offsets(op, cu_padded, C)
  return move(empty_with(x, 1, total), x, 1, rank_order_segs(p, C))
end

-- Rows of the full tensor in rank's part, in the part's order: a copy of
-- base + 0..len-1 per chunk from one arange, no per-element Lua.
function M.thd_partition_indices(cu_padded, rank, C)
  local op = "seq.thd_partition_indices"
  rank_arg(op, rank, C)
  local p, total = padded_offsets(op, cu_padded, C)
  local dev = cu_padded.device
  local idx = tensor.empty({ total / C }, { dtype = "i32", device = dev })
  local longest = 0
  for _, c in ipairs((M.chunk_sizes(p, C))) do longest = math.max(longest, c) end
  local ramp = create.arange(longest, { dtype = "i32", device = dev })
  for _, s in ipairs(M.chunk_segments(p, rank, C)) do
    if s[3] > 0 then
      local to, from = T.narrow(idx, 1, s[2] + 1, s[3]), T.narrow(ramp, 1, 1, s[3])
      T.add_(T.copy_(to, from), s[1])
      T.free(to)
      T.free(from)
    end
  end
  T.free(ramp)
  return idx
end

function M.thd_local_seqlens(cu_seqlens, cu_padded, rank, C)
  local op = "seq.thd_local_seqlens"
  rank_arg(op, rank, C)
  local v = cu_values(op, "cu_seqlens", cu_seqlens)
  local p = padded_offsets(op, cu_padded, C)
  if #v ~= #p then fail("%s: cu_seqlens and cu_seqlens_padded differ in length", op) end
  local c, at = M.chunk_sizes(p, C)
  local cu = { 0 }
  for i = 1, #p - 1 do
    local len = v[i + 1] - v[i]
    if len > 2 * C * c[i] then fail("%s: sequence %d has %d tokens but %d padded rows", op, i, len, 2 * C * c[i]) end
    cu[i + 1] = cu[i] + M.chunk_valid(len, c[i], rank) + M.chunk_valid(len, c[i], 2 * C - 1 - rank)
  end
  return i32_on(cu, cu_seqlens.device), i32_on(at, cu_padded.device)
end

return M
