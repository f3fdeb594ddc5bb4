-- The MoE transformer block of experiments/block/ (issue 55): its math
-- (distlab.moe's SwiGLU and router gradients against central differences in
-- fp64; the whole block's gradients, on one rank, against the change of its
-- output along each of them), its real-shaped inputs (distlab.workload), and
-- on 4 cpu ranks (tp 2 x cp 2, EP over 4) its forward output and every
-- gradient against the same block on one rank for every schedule option of
-- configs.lua's table, other rank layouts, a routing and a sequence mix read
-- from files, a planted 2% error caught, and the timed run's trace: JSON that
-- Python's json parses, with spans of every rank on both streams.
local dl = require "distlab"
local H = require "helpers"
package.path = H.root .. "/?.lua;" .. package.path
local moe = require "distlab.moe"
local workload = require "distlab.workload"
local configs = require "experiments.block.configs"
local layer = require "experiments.block.layer"
local blockops = require "experiments.block.ops"

local function dot(a, b)
  local x, y = a:f64():contiguous():view(a:numel()):tolist(), b:f64():contiguous():view(b:numel()):tolist()
  local s = 0
  for i = 1, #x do s = s + x[i] * y[i] end
  return s
end

-- max over the elements of x of |central difference of L - grad|
local function fd_error(x, grad, L)
  local g, worst = grad:tolist(), 0
  local rows, cols = x.shape[1], x.shape[2]
  for i = 1, rows do
    for j = 1, cols do
      local eps = 1e-6
      local xp, xm = x:clone(), x:clone()
      xp:narrow(1, i, 1):narrow(2, j, 1):add_(eps)
      xm:narrow(1, i, 1):narrow(2, j, 1):add_(-eps)
      worst = math.max(worst, math.abs((L(xp) - L(xm)) / (2 * eps) - g[i][j]))
    end
  end
  return worst
end

describe("distlab.moe", function()
  it("swiglu_bwd and route_bwd are the derivatives (central differences in fp64)", function()
    local h = dl.randn({ 3, 8 }, { dtype = "f64", seed = 1 })
    local da = dl.randn({ 3, 4 }, { dtype = "f64", seed = 2 })
    assert.is_true(fd_error(h, moe.swiglu_bwd(da, h), function(x) return dot(moe.swiglu(x), da) end) < 1e-8)
    local logits = dl.randn({ 4, 6 }, { dtype = "f64", seed = 3 })
    local ids = dl.from_table({ { 1, 3 }, { 0, 5 }, { 2, 3 }, { 4, 0 } }, "i64")
    local dw = dl.randn({ 4, 2 }, { dtype = "f64", seed = 4 })
    local p, w = moe.route(logits, ids)
    local dlogits = moe.route_bwd(p, w, ids, dw)
    assert.is_true(fd_error(logits, dlogits, function(x) return dot(select(2, moe.route(x, ids)), dw) end) < 1e-8)
    -- top-k picks the same ids as given ones where they are the top-k
    local _, wk, idk = moe.route(logits, 2)
    local _, wg = moe.route(logits, idk)
    assert.tensor_near(wk, wg, 0)
  end)

  it("rowdot keeps ~16 bits of every product; plan orders rows by expert, then token", function()
    local a = dl.randn({ 5, 40 }, { dtype = "bf16", seed = 5 })
    local b = dl.randn({ 5, 40 }, { dtype = "bf16", seed = 6 })
    local got, al, bl = moe.rowdot(a, b):tolist(), a:f64():tolist(), b:f64():tolist()
    for i = 1, 5 do
      local s = 0
      for j = 1, 40 do s = s + al[i][j] * bl[i][j] end
      assert.is_true(math.abs(got[i][1] - s) <= 1e-4 * (1 + math.abs(s)), got[i][1] .. " vs " .. s)
    end
    local ids = dl.from_table({ { 1, 3 }, { -1, -1 }, { 2, 0 }, { 3, 1 } }, "i64")
    local pl = moe.plan(ids, dl.from_table({ { .1, .2 }, { .3, .4 }, { .5, .6 }, { .7, .8 } }, "f32"),
      { experts = 4, first = 2, count = 2 })
    assert.equal(3, pl.M)
    assert.same({ 1, 2 }, pl.counts)
    assert.same({ 4, 1, 6 }, pl.sel:tolist())
    assert.same({ 2, 0, 3 }, pl.token:tolist())
    assert.tensor_near(dl.from_table({ .5, .2, .7 }, "f32"), pl.weight, 1e-7)
    local em = dl.randn({ 2, 4, 3 }, { dtype = "bf16", seed = 7 })
    local back = moe.unpack(moe.pack(em, { 1, 3 }), { 1, 3 }, dl.zeros({ 2, 4, 3 }, "bf16"))
    assert.tensor_near(em:select(1, 2):narrow(1, 1, 3), back:select(1, 2):narrow(1, 1, 3), 0)
    assert.tensor_near(em:select(1, 1):narrow(1, 1, 1), back:select(1, 1):narrow(1, 1, 1), 0)
    assert.equal(0, dot(back:select(1, 1):narrow(1, 2, 3), back:select(1, 1):narrow(1, 2, 3)))
  end)
end)

describe("distlab.workload", function()
  it("draws K distinct experts a token, Zipf-skewed, hot experts per layer, the same on every rank", function()
    local E, K, T = 16, 4, 1000
    local ids = workload.routing { tokens = T, experts = E, topk = K, dist = "zipf", s = 1.2, seed = 3, layer = 1 }
    assert.same({ T, K }, ids.shape)
    for _, row in ipairs(ids:tolist()) do
      local seen = {}
      for _, e in ipairs(row) do
        assert.is_true(e >= 0 and e < E and not seen[e])
        seen[e] = true
      end
    end
    local function hottest(st)
      local best = 1
      for e, c in ipairs(st.counts) do if c > st.counts[best] then best = e end end
      return best
    end
    local z = workload.routing_stats(ids, E)
    local u = workload.routing_stats(workload.routing { tokens = T, experts = E, topk = K, dist = "uniform" }, E)
    assert.is_true(z.imbalance > 2 and u.imbalance < 1.3, z.imbalance .. " " .. u.imbalance)
    local other_rank = workload.routing { tokens = T, experts = E, topk = K, s = 1.2, seed = 3, layer = 1, rank = 1 }
    local other_layer = workload.routing { tokens = T, experts = E, topk = K, s = 1.2, seed = 3, layer = 2 }
    assert.equal(hottest(z), hottest(workload.routing_stats(other_rank, E)))
    assert.are_not.same(ids:tolist(), other_rank:tolist())
    assert.are_not.equal(hottest(z), hottest(workload.routing_stats(other_layer, E)))
  end)

  it("reads top-k ids and sequence lengths from .npy files; lengths pad to exactly the total", function()
    local ids_path, lens_path = H.tmpname(".npy"), H.tmpname(".npy")
    dl.save(ids_path, dl.from_table({ { { 0, 1 }, { 2, 3 }, { 1, 0 } }, { { 3, 2 }, { 0, 2 }, { 1, 3 } } }, "i32"))
    local got = workload.routing { file = ids_path, tokens = 4, experts = 4, topk = 2, layer = 1, rank = 1 }
    assert.same({ { 0, 2 }, { 1, 3 }, { 3, 2 }, { 0, 2 } }, got:tolist()) -- rows 4, 5, 6, 7 of 3: wrapping
    assert.has_error(function() workload.routing { file = ids_path, tokens = 2, experts = 3, topk = 2, layer = 0 } end)
    dl.save(lens_path, dl.from_table({ 100, 300, 7 }, "i64"))
    assert.same({ 100, 300, 7, 100, 300, 7, 100, 48 },
      workload.seqlens { file = lens_path, total = 1024, multiple = 16 })
    local lens = workload.seqlens { total = 4096, multiple = 8, dist = "lognormal", mean = 500, seed = 2 }
    local cu, cup = workload.cu_seqlens(lens, 8)
    assert.equal(4096, cup[#cup])
    assert.is_true(cu[#cu] <= 4096 and cu[#cu] > 4000)
    os.remove(ids_path)
    os.remove(lens_path)
  end)
end)

describe("the block on one rank", function()
  -- L = <out, D>; along each gradient G (scaled to 1% of its tensor), the
  -- central difference of L against <G, the bf16 step actually taken>
  it("its gradients are the derivatives of its output (x and every weight)", function()
    local S, Hd, heads, dh, E, K, F, Fs = 32, 32, 4, 16, 8, 2, 16, 32
    local g = { N = 1, P = 1, C = 1, rank = 0, t = 0, c = 0, T = S, m = S, S = S, H = Hd, heads = heads, hp = heads,
      dh = dh, E = E, L = E, K = K, F = F, Fs = Fs, layout = "bshd", cu = { 0, S }, cup = { 0, S },
      local_cu = { 0, S }, local_cup = { 0, S }, device = "cpu", attn_backend = "ours" }
    local function r(shape, seed, std) return dl.randn(shape, { dtype = "f32", seed = seed }):mul_(std):bf16() end
    local W = { qkv = r({ Hd, 3 * heads * dh }, 1, Hd ^ -0.5), o = r({ heads * dh, Hd }, 2, (heads * dh) ^ -0.5),
      r = r({ Hd, E }, 3, 1), e13 = r({ E, Hd, 2 * F }, 4, Hd ^ -0.5), e2 = r({ E, F, Hd }, 5, F ^ -0.5),
      s13 = r({ Hd, 2 * Fs }, 6, Hd ^ -0.5), s2 = r({ Fs, Hd }, 7, Fs ^ -0.5) }
    -- a given routing: a top-k's flips are not differentiable
    local ids = workload.routing { tokens = S, experts = E, topk = K, seed = 3 }
    local X, D = r({ S, Hd }, 10, 1), r({ S, Hd }, 11, 1)
    local function loss(Wt, x) return dot(layer.new(g, Wt, blockops.single(g), { ids = ids }):forward(x), D) end
    local blk = layer.new(g, W, blockops.single(g), { ids = ids })
    blk:forward(X)
    local dx, d = blk:backward(D)
    local function check(name, base, grad, set)
      local dir = grad:f64():mul_(0.01 * math.sqrt(dot(base, base) / dot(grad, grad)))
      local plus, minus = base:f64():add_(dir):bf16(), base:f64():sub_(dir):bf16()
      local step = plus:f64():sub_(minus:f64()):mul_(0.5)
      local fd, an = (loss(set(plus)) - loss(set(minus))) / 2, dot(grad, step)
      assert.is_true(math.abs(fd - an) <= 0.05 * math.abs(an),
        string.format("d%s: the output changed by %.6g along it, the gradient says %.6g", name, fd, an))
    end
    check("x", X, dx, function(v) return W, v end)
    for _, k in ipairs { "qkv", "o", "r", "e13", "e2", "s13", "s2" } do
      check(k, W[k], d[k], function(v)
        local W2 = {}
        for a, b in pairs(W) do W2[a] = b end
        W2[k] = v
        return W2, X
      end)
    end
  end)
end)

-- ---- 4 cpu ranks ----------------------------------------------------------------------------

local function block(args, env)
  return H.distlab("run -n 4 --device cpu experiments/block/block.lua --show-checks " .. args, env)
end

local function checks_ok(out)
  local _, n = out:gsub("data check on rank %d of %d+: [^\n]*: ok:", "")
  return n
end

describe("the block on 4 cpu ranks (tp 2 x cp 2, EP over 4)", function()
  local dir = H.tmpname("-block")

  it("matches the one-rank reference for every schedule option", function()
    local variants = configs.variants("axes")
    assert.is_true(#variants >= 15)
    local rc, out = block("--variants axes --time no --out " .. dir)
    assert.equal(0, rc, out)
    assert.equal(4 * #variants, checks_ok(out), out)
  end)

  it("matches it with other rank layouts, top-k routing and bshd", function()
    for _, a in ipairs { "--tp 1", "--tp 4", "--routing topk", "--layout bshd --routing uniform" } do
      local rc, out = block("--time no --out " .. dir .. " " .. a)
      assert.equal(0, rc, a .. ":\n" .. out)
      assert.equal(4, checks_ok(out), a .. ":\n" .. out)
    end
  end)

  it("replays a routing and a sequence mix from .npy files", function()
    local ids_path, lens_path = H.tmpname(".npy"), H.tmpname(".npy")
    dl.save(ids_path, workload.routing { tokens = 40, experts = 8, topk = 2, dist = "zipf", s = 2, seed = 9 })
    dl.save(lens_path, dl.from_table({ 5, 19, 2, 11 }, "i32"))
    local rc, out = block(string.format("--time no --out %s --routing %s --seqlens %s", dir, ids_path, lens_path))
    os.remove(ids_path)
    os.remove(lens_path)
    assert.equal(0, rc, out)
    assert.equal(4, checks_ok(out), out)
    assert.matches("routing " .. ids_path:gsub("%p", "%%%0"), out)
  end)

  it("fails a planted 2% error, and an output left unwritten", function()
    for _, plant in ipairs { "scale=0.02", "noop" } do
      local rc, out = block("--time no --out " .. dir .. " --plant " .. plant)
      assert.are_not.equal(0, rc, out)
      assert.matches("data check failed on rank", out)
    end
  end)

  it("times every stage and writes a trace with spans of every rank on both streams", function()
    local rc, out = block("--iters 2 --warmup 1 --png no --out " .. dir)
    assert.equal(0, rc, out)
    for _, stage in ipairs { "qkv.fwd", "attention.fwd", "dispatch.fwd", "experts.fwd", "combine.fwd", "shared.fwd",
      "attention.bwd", "grads.bwd" } do
      assert.matches("| " .. stage:gsub("%.", "%%.") .. " |", out)
    end
    assert.matches("step / compute", out)
    assert.matches("Peak memory by tag", out)
    local py = H.write(H.tmpname(".py"), [[
import json, sys
d = json.load(open(sys.argv[1]))
lanes = {}
for e in d["traceEvents"]:
    if e["ph"] == "X" and (e["name"].endswith((".fwd", ".bwd")) or e["name"].startswith("wgrad.")):
        lanes.setdefault(e["pid"], set()).add(e["tid"])
print("RANKS", len(d["otherData"]["ranks"]), "LANES", " ".join("%d:%d" % (p, len(t)) for p, t in sorted(lanes.items())))
]])
    local trace = dir .. "/block-cpux4-default.json"
    local p = io.popen(string.format("python3 %q %q 2>&1; echo __rc=$?", py, trace))
    local res = p:read("*a")
    p:close()
    os.remove(py)
    assert.truthy(res:find("__rc=0"), res)
    assert.matches("RANKS 4 LANES 0:2 1:2 2:2 3:2", res)
    local md = io.open(dir .. "/block-cpux4.md")
    assert.truthy(md, "no " .. dir .. "/block-cpux4.md")
    md:close()
    os.execute("rm -rf " .. dir)
  end)
end)

-- The same checks with the ranks on GPUs (scripts/gpu/suite.sh: 2 and 4 ranks sharing one
-- GPU under MPS): every schedule option against the one-rank reference (fp64 on the cpu), a
-- planted 2% error caught, and a timed run's trace with spans of every rank on both streams.
describe("the block on GPUs (DISTLAB_SPEC_RANKS ranks, sharing a GPU where there are fewer) #multigpu", function()
  local n, dir = H.gpu_ranks, H.tmpname("-block-gpu")
  local function gblock(args)
    return H.distlab(string.format("run -n %d --device cuda experiments/block/block.lua --show-checks --out %s %s",
      n, dir, args))
  end

  it(n .. " ranks: matches the one-rank reference for every schedule option", function()
    local variants = configs.variants("axes")
    local rc, out = gblock("--variants axes --time no")
    assert.equal(0, rc, out)
    assert.equal(n * #variants, checks_ok(out), out)
  end)

  it(n .. " ranks: fails a planted 2% error", function()
    local rc, out = gblock("--time no --plant scale=0.02")
    assert.are_not.equal(0, rc, out)
    assert.matches("data check failed on rank", out)
  end)

  it(n .. " ranks: times every stage and writes a trace with spans of every rank", function()
    local rc, out = gblock("--iters 3 --warmup 1 --png no --tag gpu")
    assert.equal(0, rc, out)
    assert.matches("| experts%.fwd |", out)
    local f = io.open(dir .. "/block-gpu-default.json")
    assert.truthy(f, "no trace in " .. dir)
    local trace = f:read("*a")
    f:close()
    for r = 0, n - 1 do assert.truthy(trace:find('"pid":%s*' .. r .. "[,}]"), "no span of rank " .. r) end
    os.execute("rm -rf " .. dir)
  end)
end)
