-- spec/gemm/ep_moe.lua — run by spec/gemm_grouped_spec.lua under `distlab run -n N`: a MoE
-- expert layer over ep's dispatch and combine with the grouped GEMMs between them, as the
-- block will run it: dispatch (expert-major receive, counts as the dispatch leaves them,
-- on the device where it runs), Y = grouped(recv, W_up), Z = grouped(Y, W_down), combine;
-- then the backward GEMMs of the down projection on the same rows (dY = grouped_dx(dZ, W_down),
-- dW_down = grouped_dw(Y, dZ)). Every rank checks its tokens' outputs against the layer
-- computed on the host in fp64 from every expert's weights (drawn from the global expert id,
-- so every rank can make them), and its local experts' dW_down against fp64 sums over the
-- rows it received. Prints "ep_moe ok" per rank, or the first error.
local dl = require "distlab"
local R = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/../gemm_ref.lua")

local world = dl.comm.world()
local N, me, dev = world.size, world.rank, world.device
local B, H, F, K = 12, 64, 48, 2
local E = 2 * N
local L = E / N

local function lcg(seed)
  local s = (seed * 7919 + 17) % 2147483647
  return function(n)
    s = (s * 48271) % 2147483647
    return s % n
  end
end

-- rank s's tokens: T rows of x, K distinct experts each (one in five with a -1), weights
local function inputs(s)
  local rnd = lcg(s + 3)
  local T = B - s % 3
  local idx, wts = {}, {}
  for t = 1, T do
    local row, taken = {}, {}
    for k = 1, K do
      local e
      if k == 2 and rnd(5) == 0 then
        e = -1
      else
        repeat e = rnd(E) until not taken[e]
        taken[e] = true
      end
      row[k] = e
    end
    idx[t], wts[t] = row, { (rnd(100) + 1) / 101, (rnd(100) + 1) / 101 }
  end
  local x = dl.randn({ T, H }, { dtype = "bf16", device = "cpu", seed = 1000 + s })
  return x, idx, wts
end

local function w_up(e) return dl.randn({ H, F }, { dtype = "bf16", device = "cpu", seed = 5000 + e }):mul_(0.125) end
local function w_down(e) return dl.randn({ F, H }, { dtype = "bf16", device = "cpu", seed = 7000 + e }):mul_(0.125) end

local ok, err = pcall(function()
  local ep = dl.ep.buffer { comm = world, max_tokens = B, hidden = H, experts = E, topk = K, layout = "per_rank",
    output = "expert_major" }
  local xh, idx, wts = inputs(me)
  local recv, handle = ep:dispatch(xh:to(dev), dl.from_table(idx, { dtype = "i32", device = dev }),
    dl.from_table(wts, { dtype = "f32", device = dev }))
  -- this rank's experts' weights [L, H, F] and [L, F, H]
  local up, down = dl.empty({ L, H, F }, { dtype = "bf16", device = dev }), dl.empty({ L, F, H }, { dtype = "bf16", device = dev })
  for l = 1, L do
    up:select(1, l):copy_(w_up(me * L + l - 1))
    down:select(1, l):copy_(w_down(me * L + l - 1))
  end
  local y = dl.gemm.grouped(recv, up)                              -- [L, N*B, F]
  local z = dl.gemm.grouped(y, down, recv.counts)                   -- [L, N*B, H]
  local out = ep:combine(z, handle):to("cpu")
  -- the layer in fp64 on the host, token by token (the GEMMs' bf16 roundings within the bound)
  local T = xh:size(1)
  local ref = dl.zeros({ T, H }, { dtype = "f64", device = "cpu" })
  for t = 1, T do
    for k = 1, K do
      local e = idx[t][k]
      if e >= 0 then
        local ye = R.matmul(xh:narrow(1, t, 1), w_up(e))
        local ze = R.matmul(ye, w_down(e))
        ref:narrow(1, t, 1):add_(ze:mul_(wts[t][k]))
      end
    end
  end
  local rel = dl.rel_err(out:f64(), ref)
  if not (rel < 2 ^ -6) then error(string.format("rank %d: the layer's output is off by %.3g normwise", me, rel), 0) end
  -- the down projection's backward on the rows received: dY and dW_down against fp64
  local counts = recv.counts:to("cpu"):tolist()
  local dz = dl.randn(z.shape, { dtype = "bf16", device = dev, seed = 9000 + me })
  local dy = dl.gemm.grouped_dx(dz, down, recv.counts)
  local dw = dl.gemm.grouped_dw(y, dz, recv.counts, { out_dtype = "f32" })
  for l = 1, L do
    local c = counts[l]
    if c > 0 then
      local yl, dzl = y:select(1, l):narrow(1, 1, c), dz:select(1, l):narrow(1, 1, c)
      local ref_dw, abs_dw = R.matmul(yl:transpose(1, 2), dzl)
      local msg = R.check(dw:select(1, l), ref_dw, abs_dw, R.u.f32, R.sum_bound(c, R.u.f32), "dW_down of expert " .. l)
      if msg then error(string.format("rank %d: %s", me, msg), 0) end
      local ref_dy, abs_dy = R.matmul(dzl, down:select(1, l):transpose(1, 2))
      msg = R.check(dy:select(1, l):narrow(1, 1, c), ref_dy, abs_dy, R.u.bf16, R.sum_bound(H, R.u.bf16), "dY of expert " .. l)
      if msg then error(string.format("rank %d: %s", me, msg), 0) end
    elseif dl.max_abs_diff(dw:select(1, l), dl.zeros({ F, H }, "f32", dev)) ~= 0 then
      error(string.format("rank %d: dW_down of expert %d got no rows but is not zero", me, l), 0)
    end
  end
  ep:free()
end)
world:barrier()
print(ok and string.format("ep_moe ok (rank %d)", me) or ("ep_moe FAILED: " .. tostring(err)))
