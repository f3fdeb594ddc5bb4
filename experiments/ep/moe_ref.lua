-- experiments/ep/moe_ref.lua — a MoE layer's reference written only with
-- distlab calls, against expert parallelism (dl.ep) on the same tokens.
--
--   ./distlab run -n 4 experiments/ep/moe_ref.lua [--tokens 16] [--hidden 128]
--       [--experts 8] [--topk 2]        (--device cuda: one GPU a rank)
--
-- Every rank makes every rank's tokens (x: bf16 [T, H], seeded by rank),
-- the router (bf16 [H, E]) and the experts (bf16 [H, H] each: expert e
-- computes x W_e), all from fixed seeds, so each can compute the whole
-- layer alone. The reference, over the N T tokens of all ranks:
--   router     logits = x Wr (dl.gemm, f32), probs = softmax(logits)
--   top-k      w, ids = probs:topk(K): weights (the top-k probabilities, not
--              renormalised) and expert ids, the highest first
--   dispatch   order = ids:view(-1):argsort() (stable: by expert, then by
--              token, i.e. by source rank, then token), counts =
--              dl.bincount(ids, E), rows = x:index_select(1, token of each
--              selection in that order): each expert's rows, contiguous
--   experts    y_e = dl.gemm(rows of expert e, W_e), bf16, as the ranks do
--   combine    out = zeros(N T, H, f64):index_add_(1, token, y * w) (a
--              scatter_add of the weighted rows onto their tokens), then bf16
-- Expert parallelism: each rank routes its own tokens the same way,
-- ep:dispatch(x, ids, w) (expert_major output), runs its local experts on
-- what it received (dl.gemm), ep:combine(y). Checks, per rank and for both
-- buffer layouts (per_rank, per_expert): the rows each local expert got and
-- their count exactly equal to the reference's rows of that expert (EP
-- orders them by source rank, then token, as the stable sort does); the
-- combined output within one bf16 ulp (2^-7 relative: EP sums in fp32 and
-- rounds, the reference sums in fp64 and rounds) of the reference's rows of
-- this rank's tokens, and normwise within 2^-9: h:verify's data check
-- (distlab.bench.harness: --plant noop | scale=X puts an error into the
-- combined output, which it must catch; --quick: T 4, H 64). Prints "moe ref
-- ok" per rank, or "data check failed" with what differs and exits 1.
local dl = require "distlab"

local w = dl.comm.world()
local N, me, dev = w.size, w.rank, w.device
local h = dl.bench.harness {
  name = "moe_ref", family = "ep", comm = w,
  usage = "./distlab run -n 4 experiments/ep/moe_ref.lua [options]",
  about = "a MoE reference in distlab calls (router softmax, top-k, gather dispatch, expert GEMMs, scatter_add "
    .. "combine) against dl.ep dispatch/combine; see the header",
  options = {
    { "tokens", "int", 16, "tokens per rank (T)" },
    { "hidden", "int", 128, "hidden size (H, a multiple of 8)" },
    { "experts", "int", 2 * N, "experts (E, a multiple of the ranks)" },
    { "topk", "int", 2, "experts a token picks (K)" },
  },
}
local T, H, E, K = h.opt.tokens, h.opt.hidden, h.opt.experts, h.opt.topk
if h.quick then T, H = 4, 64 end
local L = E / N

-- ---- the weights and every rank's tokens (fixed seeds) ---------------------------------

local function randn(shape, seed, std)
  return dl.randn(shape, { dtype = "f32", seed = seed, std = std, device = dev }):bf16()
end
local Wr = randn({ H, E }, 7, 1 / math.sqrt(H))
local Wx = {}
for e = 0, E - 1 do Wx[e] = randn({ H, H }, 1000 + e, 1 / math.sqrt(H)) end
local xs = {}
for s = 0, N - 1 do xs[s + 1] = randn({ T, H }, 100 + s) end

-- The router: top-K weights (f32 [n, K]) and expert ids (i64 [n, K]) of tokens x.
local function route(x)
  local probs = dl.gemm(x, Wr, { out_dtype = "f32" }):softmax(-1)
  return probs:topk(K)
end

-- ---- the reference, over all N T tokens -----------------------------------------------

local X = dl.cat(xs)                                   -- [N T, H]
local wts, ids = route(X)                              -- [N T, K]
local flat = ids:view(-1)                              -- [N T K], expert of each selection
local order = flat:argsort()                           -- selections grouped by expert, stable
local counts = dl.bincount(flat, E)                    -- rows per expert
local token = dl.arange(N * T, { device = dev }):view(N * T, 1):expand(N * T, K):contiguous():view(-1)
local tok = token:gather(1, order)                     -- the token of each sorted selection
local rows = X:index_select(1, tok)                    -- dispatch: [N T K, H]
local y = dl.empty({ N * T * K, H }, { dtype = "bf16", device = dev })
local offset, per_expert = {}, counts:tolist()
local at = 0
for e = 0, E - 1 do
  offset[e] = at
  local n = per_expert[e + 1]
  if n > 0 then dl.gemm(rows:narrow(1, at + 1, n), Wx[e], y:narrow(1, at + 1, n)) end
  at = at + n
end
local wsorted = wts:view(-1):gather(1, order)          -- each sorted selection's weight
local weighted = y:f64():mul_(wsorted:view(-1, 1):expand(N * T * K, H))
local ref = dl.zeros({ N * T, H }, { dtype = "f64", device = dev }):index_add_(1, tok, weighted):bf16()

-- ---- expert parallelism, checked against the reference ----------------------------------

local x = xs[me + 1]
local my_w, my_ids = route(x)
local want = ref:narrow(1, me * T + 1, T)
for _, layout in ipairs { "per_rank", "per_expert" } do
  local ep = dl.ep.buffer { comm = w, max_tokens = T, hidden = H, experts = E, topk = K, layout = layout,
    output = "expert_major" }
  local bad = {} -- what the dispatch got wrong
  -- dispatch, this rank's experts on what arrived, combine: the op checked (--plant goes into its output)
  local step = h:planted(function()
    local recv, handle = ep:dispatch(x, my_ids:i32(), my_w)
    local got = recv.counts:tolist()
    bad = {}
    local ey = dl.zeros(recv.x.shape, { dtype = "bf16", device = dev })
    for le = 0, L - 1 do
      local e, n = me * L + le, got[le + 1]
      if n ~= per_expert[e + 1] then
        bad[#bad + 1] = string.format("expert %d got %d rows, the reference %d", e, n, per_expert[e + 1])
      elseif n > 0 then
        local mine = recv.x:select(1, le + 1):narrow(1, 1, n)
        if mine:bytes() ~= rows:narrow(1, offset[e] + 1, n):bytes() then
          bad[#bad + 1] = string.format("expert %d's rows differ from the reference's (by source rank, then token)", e)
        end
        dl.gemm(mine, Wx[e], ey:select(1, le + 1):narrow(1, 1, n))
      end
    end
    local out = ep:combine(ey, handle)
    ep:check()
    return out
  end, { returns = true })
  h:verify {
    what = layout .. ": dispatch, experts, combine",
    fresh = function() end,
    run = step,
    keep = true, -- out is the buffer's own tensor
    check = function(out)
      local c = dl.compare(out, want, 1e-6, 2 ^ -7)
      local rel = dl.rel_err(out, want)
      local n = #bad + c.n_not_close + (rel <= 2 ^ -9 and 0 or 1)
      if c.n_not_close > 0 then bad[#bad + 1] = dl.mismatch_report(out, want, 1e-6, 2 ^ -7, 4) end
      if not (rel <= 2 ^ -9) then bad[#bad + 1] = string.format("combine: normwise error %.3g above 2^-9", rel) end
      return n, n > 0 and table.concat(bad, "; ") or string.format("rows exact, combine normwise %.3g", rel)
    end,
  }
  ep:free()
end

h:finish()
print(string.format("moe ref ok: rank %d of %d on %s, T %d, H %d, E %d, K %d: dispatch rows exact, combine within "
  .. "one bf16 ulp, per_rank and per_expert", me, N, dev, T, H, E, K))
