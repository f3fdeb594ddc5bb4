-- distlab.overlap.ag_p2p — all-gather + GEMM, point to point (seed 003).
--
-- d steps; at step i rank r multiplies the shard of rank p = (r + i) mod d,
-- which it takes straight from p's symmetric buffer, into c's rows of p, on
-- stream i mod s. Step 0 is our own shard: its GEMM starts at once, and
-- with s >= 2 each step's transfer runs under the GEMM of the step before.
--
-- Buffer: slots a[0..d-1] of [m/d, k] in every rank's symmetric buffer (slot
-- p holds rank p's shard), d x m/d x k elements a rank. Flags, on the rank
-- that waits: READY(p) "p's shard for us is there", FREE(q) "q is done with
-- what it took from us"; FREE starts at 1, so the first call waits for no
-- one, and every wait is answered by exactly one signal per call.
local M = {}

function M.regions(X) return { { "a", { X.sh.rows, X.sh.k }, X.dtype } } end

-- get's publish: once the readers of our slot r finished their copies of
-- the last call, our shard a into it, and READY(r) to every reader (also
-- ag_p2p_merge's, on its aux stream).
function M.publish(X, a)
  local r, d = X.rank, X.size
  for q = 0, d - 1 do
    if q ~= r then X:wait(X:FREE(q), q, 0, "free") end
  end
  X:move(X:slot("a", r), a)
  for q = 0, d - 1 do
    if q ~= r then X:signal(q, X:READY(r)) end
  end
end

-- get: the owner publishes its shard in its own slot; readers pull it.
function M.get(X, a, b, c)
  local r, d = X.rank, X.size
  X:on(0, function()
    if d > 1 then M.publish(X, a) end
  end)
  for i = 0, d - 1 do
    local p = (r + i) % d
    X:on(i, function()
      if p == r then return X:gemm(a, b, X:rows(c, r)) end
      X:wait(X:READY(p), p, i, "ready")           -- p's shard sits in p's slot p
      X:move(X:slot("a", p), X:slot("a", p, p))   -- pull it into ours
      X:signal(p, X:FREE(r))                      -- p may overwrite its slot next call
      X:gemm(X:slot("a", p), b, X:rows(c, p))
    end)
  end
end

-- put: at step i we push our shard to q = (r - i) mod d, who multiplies it
-- at its step i, and take the one p pushed to us.
function M.put(X, a, b, c)
  local r, d = X.rank, X.size
  for i = 0, d - 1 do
    local p, q = (r + i) % d, (r - i) % d
    X:on(i, function()
      if i == 0 then return X:gemm(a, b, X:rows(c, r)) end
      X:wait(X:FREE(q), q, i, "free")             -- q's slot r is free: its GEMM on it (last call) ended
      X:move(X:slot("a", r, q), a)                -- push our shard into it
      X:signal(q, X:READY(r))
      X:wait(X:READY(p), p, i, "ready")           -- p pushed its shard into our slot p
      X:gemm(X:slot("a", p), b, X:rows(c, p))
      X:signal(p, X:FREE(r))                      -- p may push into it again
    end)
  end
end

return M
