-- distlab.overlap.rs_ring — GEMM + reduce-scatter over a relay ring (the
-- mirror of ag_ring, TransformerEngine's ring reduce-scatter): at step i
-- rank r computes its partial of chunk k = (r - 1 - i) mod d (the rows of
-- rank k) and adds it, inside the GEMM (beta = 1), to the running sum that
-- came from its left neighbour, then hands the sum on to its right
-- neighbour. At step d - 1 the chunk is r's own and the sum, complete, is c.
-- The sums travel in c's dtype (each hop rounds once; the GEMM adds in fp32).
--
-- Buffer: stage[0..d-1] of [m/d, n] in every rank's symmetric buffer (slot
-- k: the running sum of chunk k), m x n elements a rank. Flags, on the rank
-- that waits: READY(k) "the sum of chunk k is there for us" (from the left),
-- FREE(k) "the right neighbour is done with chunk k's slot" (starts at 1).
local M = {}

function M.regions(X) return { { "stage", { X.sh.rows, X.sh.n }, X.out } } end

-- get: the right neighbour pulls the sum of chunk k from our stage slot k.
function M.get(X, a, b, c)
  local r, d = X.rank, X.size
  local left, right = (r - 1) % d, (r + 1) % d
  for i = 0, d - 1 do
    local k = (r - 1 - i) % d
    local last = i == d - 1
    X:on(i, function()
      local sum = last and c or X:slot("stage", k)
      if not last then X:wait(X:FREE(k), right, i, "free") end -- it finished pulling slot k last call
      if i == 0 then
        X:gemm(X:rows(a, k), b, sum)
      else
        X:wait(X:READY(k), left, i, "ready")             -- the left neighbour's sum of chunk k
        X:move(sum, X:slot("stage", k, left))
        X:signal(left, X:FREE(k))
        X:gemm(X:rows(a, k), b, sum, { beta = 1 })       -- add our partial in place
      end
      if not last then X:signal(right, X:READY(k)) end
    end)
  end
end

-- put: we push the sum of chunk k into the right neighbour's stage slot k.
function M.put(X, a, b, c)
  local r, d = X.rank, X.size
  local left, right = (r - 1) % d, (r + 1) % d
  for i = 0, d - 1 do
    local k = (r - 1 - i) % d
    local last = i == d - 1
    X:on(i, function()
      local slot = X:slot("stage", k)
      if i == 0 then
        X:gemm(X:rows(a, k), b, last and c or slot)
      else
        X:wait(X:READY(k), left, i, "ready")             -- the left neighbour pushed its sum into slot k
        X:gemm(X:rows(a, k), b, last and c or slot, { beta = 1, c = slot })
      end
      if not last then
        X:wait(X:FREE(k), right, i, "free")              -- the right neighbour's slot k is free
        X:move(X:slot("stage", k, right), slot)
        X:signal(right, X:READY(k))
      end
      if i > 0 then X:signal(left, X:FREE(k)) end        -- our slot k may take chunk k again
    end)
  end
end

return M
