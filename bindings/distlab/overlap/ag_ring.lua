-- distlab.overlap.ag_ring — all-gather + GEMM over a relay ring
-- (TransformerEngine's ring exchange): at step i rank r multiplies chunk
-- k = (r - i) mod d (rank k's shard), which came from its left neighbour,
-- and hands it on to its right neighbour, who multiplies it at step i + 1.
-- Every transfer crosses one link; d - 1 hops bring each shard everywhere.
--
-- Buffer: slots a[0..d-1] of [m/d, k] in every rank's symmetric buffer
-- (slot k holds chunk k), d x m/d x k elements a rank. Flags, on the rank
-- that waits: READY(k) "chunk k is there for us" (from the left), FREE(k)
-- "the right neighbour is done with chunk k's slot" (FREE starts at 1).
local M = {}

function M.regions(X) return { { "a", { X.sh.rows, X.sh.k }, X.dtype } } end

-- get: the right neighbour pulls chunk k from our slot k once we signal it.
function M.get(X, a, b, c)
  local r, d = X.rank, X.size
  local left, right = (r - 1) % d, (r + 1) % d
  for i = 0, d - 1 do
    local k = (r - i) % d
    local forward = i < d - 1 -- the right neighbour needs chunk k at its step i + 1
    X:on(i, function()
      if forward then X:wait(X:FREE(k), right, i, "free") end -- it finished pulling slot k last call
      if i == 0 then
        if forward then X:move(X:slot("a", k), a) end
      else
        X:wait(X:READY(k), left, i, "ready")           -- the left neighbour has chunk k in its slot k
        X:move(X:slot("a", k), X:slot("a", k, left))
        X:signal(left, X:FREE(k))
      end
      if forward then X:signal(right, X:READY(k)) end
      X:gemm(i == 0 and a or X:slot("a", k), b, X:rows(c, k))
    end)
  end
end

-- put: we push chunk k into the right neighbour's slot k once it is free.
function M.put(X, a, b, c)
  local r, d = X.rank, X.size
  local left, right = (r - 1) % d, (r + 1) % d
  for i = 0, d - 1 do
    local k = (r - i) % d
    X:on(i, function()
      local chunk = i == 0 and a or X:slot("a", k)
      if i > 0 then X:wait(X:READY(k), left, i, "ready") end -- the left neighbour pushed chunk k to us
      if i < d - 1 then
        X:wait(X:FREE(k), right, i, "free")            -- the right neighbour's slot k is free
        X:move(X:slot("a", k, right), chunk)
        X:signal(right, X:READY(k))
      end
      X:gemm(chunk, b, X:rows(c, k))
      if i > 0 then X:signal(left, X:FREE(k)) end      -- our slot k may take chunk k again
    end)
  end
end

return M
