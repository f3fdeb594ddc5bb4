-- distlab.overlap.rs_p2p — GEMM + reduce-scatter, point to point (the mirror
-- of ag_p2p): at step i rank r computes its partial of the rows of
-- p = (r + i + 1) mod d (a's rows of p @ b, our k/d columns), on stream
-- i mod s, and it travels to p while the next step's GEMM runs; our own
-- rows come last (step d - 1). At the end each rank sums the d partials of
-- its rows (fp32, rounded once) into c.
--
-- Buffers: stage[0..d-1] (our partial for each rank) and recv[0..d-1] (each
-- rank's partial for us), [m/d, n] each: 2 x m x n elements a rank. Flags,
-- on the rank that waits: READY(q) "q's partial for us is there", FREE(p)
-- "p is done with what we gave it" (FREE starts at 1).
local M = {}

function M.regions(X)
  local shape = { X.sh.rows, X.sh.n }
  return { { "stage", shape, X.out }, { "recv", shape, X.out } }
end

local function partials(X)
  local r, list = X.rank, { X:slot("stage", X.rank) }
  for q = 0, X.size - 1 do
    if q ~= r then list[#list + 1] = X:slot("recv", q) end
  end
  return list
end

-- get: p pulls our partial from our stage slot p.
function M.get(X, a, b, c)
  local r, d = X.rank, X.size
  for i = 0, d - 1 do
    local p, q = (r + i + 1) % d, (r - i - 1) % d -- we make p's partial; q makes ours now
    X:on(i, function()
      if p == r then return X:gemm(X:rows(a, r), b, X:slot("stage", r)) end
      X:wait(X:FREE(p), p, i, "free")             -- p finished pulling stage slot p last call
      X:gemm(X:rows(a, p), b, X:slot("stage", p))
      X:signal(p, X:READY(r))
      X:wait(X:READY(q), q, i, "ready")           -- q's partial of our rows is in its stage slot r
      X:move(X:slot("recv", q), X:slot("stage", r, q))
      X:signal(q, X:FREE(r))
    end)
  end
end

-- put: we push our partial into p's recv slot r.
function M.put(X, a, b, c)
  local r, d = X.rank, X.size
  for i = 0, d - 1 do
    local p = (r + i + 1) % d
    X:on(i, function()
      X:gemm(X:rows(a, p), b, X:slot("stage", p))
      if p == r then return end
      X:wait(X:FREE(p), p, i, "free")             -- p's recv slot r is free: p summed it last call
      X:move(X:slot("recv", r, p), X:slot("stage", p))
      X:signal(p, X:READY(r))
    end)
  end
end

-- After the steps joined, on the calling stream: c = the sum of the partials.
M.finish = {
  get = function(X, a, b, c) X:reduce(c, partials(X)) end,
  put = function(X, a, b, c)
    local r, d = X.rank, X.size
    for q = 0, d - 1 do
      if q ~= r then X:wait(X:READY(q), q, d, "ready") end -- q pushed its partial of our rows
    end
    X:reduce(c, partials(X))
    for q = 0, d - 1 do
      if q ~= r then X:signal(q, X:FREE(r)) end            -- q may push into our recv slot again
    end
  end,
}

return M
