-- distlab.overlap.ag_p2p_merge — all-gather + GEMM, point to point, with the
-- local shard's GEMM split and its larger part merged into the GEMM of the
-- neighbour's shard (dl.overlap.ag_gemm{algo = "p2p", merge = true | rows}).
--
-- Why: ag_p2p at 2 ranks runs two GEMMs of m/2 rows, and each ends in its own
-- last, partly filled wave (at m = 32k, n = 8k and 128 x 256 tiles on 132 SMs:
-- 4096 tiles = 31.03 waves each, 64 waves where the one GEMM of the gathered A
-- needs 63), and each m/2 GEMM measured 2% less efficient than the full one.
-- Here step 0 multiplies only a head of h rows of our shard, long enough to
-- hide the first transfer (default: see head_rows), and the step that takes
-- the neighbour's shard multiplies our other rows and the neighbour's shard in
-- one GEMM of 2 m/d - h rows, which are adjacent rows of the gathered A and of
-- c. At 2 ranks that is a GEMM of the gathered A bar its first (or last) h
-- rows: one quantized tail, as the GEMM alone. At d > 2 the other shards
-- follow one GEMM each, as in ag_p2p.
--
-- The neighbour n is r + 1 (r - 1 for the last rank); our head is the end of
-- our shard away from it: rows 0 .. h of it below n, rows m/d - h .. above.
-- The merged GEMM reads our other rows from our own slot r, which sits next
-- to slot n: the slots of this schedule are packed (no padding between them).
-- get publishes our shard there anyway (a local copy, on the op's aux stream
-- here, so that the head GEMM starts at once); put copies the rows it needs
-- there (a local copy on the aux stream, beside the push over the link).
--
-- Buffer: slots a[0..d-1] of [m/d, k], packed, in every rank's symmetric
-- buffer, d x m/d x k elements a rank (as ag_p2p). Flags as ag_p2p's:
-- READY(p) "p's shard for us is there", FREE(q) "q is done with what it took
-- from us", FREE starting at 1. Results: the merged GEMM has another m than
-- ag_p2p's, so cuBLASLt may choose another kernel for it: not bit-identical
-- to ag_p2p, equal within fp32 accumulation.
local stream = require "distlab.stream"
local p2p = require "distlab.overlap.ag_p2p"

local M = {}

function M.regions(X) return { { "a", { X.sh.rows, X.sh.k }, X.dtype, packed = true } } end

-- Tiles of a GEMM of x rows (x a multiple of 256, n of 256: 128 x 256 tiles
-- either way round give the same count), and waves of them on sms SMs.
local function tiles(x, n) return math.ceil(x / 256) * 256 * n / (128 * 256) end
local function waves(x, n, sms) return math.ceil(tiles(x, n) / sms) end

-- The head's rows: X.merge if given; else, among multiples of 256 of at least
-- a third of the shard (a transfer over NVLink at ~400 GB/s takes ~0.21 of
-- the time the GEMM of as many rows takes at ~680 TFLOP/s with n = 8k), the
-- smallest that fills whole waves (8448 rows at m = 32k, d = 2, n = 8k: 16
-- waves, then 46.06 for the merged GEMM, 63 in all as the GEMM alone), else
-- the smallest whose waves and the merged GEMM's add up to no more than the
-- two together need (its last wave's gap is then the merged GEMM's to fill),
-- else the whole shard.
function M.head_rows(merge, rows, n, sms)
  if merge ~= "auto" then return merge end
  sms = sms > 0 and sms or 132
  local from = math.ceil(rows / 3 / 256) * 256
  for h = from, rows - 1, 256 do
    if tiles(h, n) % sms == 0 then return h end
  end
  local best = waves(2 * rows, n, sms)
  for h = from, rows - 1, 256 do
    if waves(h, n, sms) + waves(2 * rows - h, n, sms) <= best then return h end
  end
  return rows
end

function M.setup(X)
  X.head = M.head_rows(X.merge, X.sh.rows, X.sh.n, X:info().sms)
  X.aux, X.aux_done = stream.stream(X.device), stream.event(X.device)
end

-- The neighbour's shard and ours around it: (n, our head's first row within
-- our shard, our other rows' first row within it and count, the merged
-- GEMM's first row of the gathered A).
local function layout(X)
  local r, d, rows, h = X.rank, X.size, X.sh.rows, X.head
  if r < d - 1 then return r + 1, 0, h, rows - h, r * rows + h end
  return r - 1, rows - h, 0, rows - h, (r - 1) * rows
end

-- our head, on step 0's stream
local function head(X, a, b, c, lo)
  if X.head > 0 then
    X:gemm(a:narrow(1, lo + 1, X.head), b, c:narrow(1, X.rank * X.sh.rows + lo + 1, X.head))
  end
end

-- our other rows and the neighbour's shard, once aux has put ours in place
local function merged(X, b, c, first)
  X.side[X.cur]:wait(X.aux_done)
  local count = 2 * X.sh.rows - X.head
  X:gemm(X:span("a", first, count), b, c:narrow(1, first + 1, count))
end

-- aux's work, forked from the run's start; every step that needs it waits for aux_done
local function on_aux(X, fn)
  X.aux:wait(X.fork)
  stream.with_stream(X.aux, fn)
  X.aux_done:record(X.aux)
end

-- get: the owner publishes its shard in its own slot (on aux); readers pull it.
function M.get(X, a, b, c)
  local r, d = X.rank, X.size
  if d == 1 then return X:on(0, function() X:gemm(a, b, c) end) end
  local nb, lo, _, _, first = layout(X)
  on_aux(X, function() p2p.publish(X, a) end)
  for i = 0, d - 1 do
    local p = (r + i) % d
    X:on(i, function()
      if p == r then return head(X, a, b, c, lo) end
      X:wait(X:READY(p), p, i, "ready")           -- p's shard sits in p's slot p
      X:move(X:slot("a", p), X:slot("a", p, p))   -- pull it into ours
      X:signal(p, X:FREE(r))                      -- p may overwrite its slot next call
      if p == nb then return merged(X, b, c, first) end
      X:gemm(X:slot("a", p), b, X:rows(c, p))
    end)
  end
end

-- put: at step i we push our shard to q = (r - i) mod d and take the one p
-- pushed to us; aux copies our other rows into our slot r meanwhile.
function M.put(X, a, b, c)
  local r, d, rows = X.rank, X.size, X.sh.rows
  if d == 1 then return X:on(0, function() X:gemm(a, b, c) end) end
  local nb, lo, rest, count, first = layout(X)
  on_aux(X, function()
    if count > 0 then X:move(X:span("a", r * rows + rest, count), a:narrow(1, rest + 1, count)) end
  end)
  for i = 0, d - 1 do
    local p, q = (r + i) % d, (r - i) % d
    X:on(i, function()
      if i == 0 then return head(X, a, b, c, lo) end
      X:wait(X:FREE(q), q, i, "free")             -- q's slot r is free: its GEMM on it (last call) ended
      X:move(X:slot("a", r, q), a)                -- push our shard into it
      X:signal(q, X:READY(r))
      X:wait(X:READY(p), p, i, "ready")           -- p pushed its shard into our slot p
      if p == nb then merged(X, b, c, first) else X:gemm(X:slot("a", p), b, X:rows(c, p)) end
      X:signal(p, X:FREE(r))                      -- p may push into it again
    end)
  end
end

return M
