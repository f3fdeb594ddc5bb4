-- NVIDIA's NCCL EP as the EP buffer's second backend (distlab.ep_nccl): on the
-- cpu and meta devices backend = "nccl_ep" is a clear error, and so is every
-- option that has no counterpart there, naming the nearest, at the caller's
-- line; nccl_ep's high-throughput outputs, made here from ours, come back in
-- our shape (distlab.bench.ep_nccl_ref) and pass ours' checks. Tagged
-- #multigpu, on 2 GPUs: ours and nccl_ep deliver the same rows to the same
-- experts and combine to the same output (spec/ep/nccl_equiv.lua), pending
-- with the reason where the GPUs, an NCCL communicator or NCCL EP (and an
-- NCCL new enough for it) are missing.
local ffi = require "ffi"
local dl = require "distlab"
local H = require "helpers"
local ep_ref = require "distlab.bench.ep_ref"
local nref = require "distlab.bench.ep_nccl_ref"

local function fails(o, msg) return H.failed(msg, "ep_nccl_spec.lua", pcall(dl.ep.buffer, o)) end

local function opts(t)
  local o = { max_tokens = 4, hidden = 128, experts = 4, topk = 2 }
  for k, v in pairs(t) do o[k] = v end
  return o
end

describe("ep backend nccl_ep where NCCL EP cannot run", function()
  it("on the cpu device: an error saying it runs on cuda only and what to use", function()
    fails(opts { backend = "nccl_ep", comm = dl.comm.world() },
      "nccl_ep: comm 'w' is on cpu; NCCL EP is GPU code and runs on cuda only (on cpu and meta: backend = \"ours\")")
  end)

  it("on the meta device too", function()
    local m = dl.comm.meta(2, 1)
    fails(opts { backend = "nccl_ep", comm = m }, "is on meta; NCCL EP is GPU code and runs on cuda only")
    m:free()
  end)

  it("an option with no counterpart is an error naming the nearest", function()
    local w = dl.comm.world()
    for _, c in ipairs {
      { { layout = "per_expert" }, "nccl_ep low_latency has no layout per_expert: its buffer is per source rank, as our per_rank" },
      { { algorithm = "high_throughput", layout = "per_rank" }, "give no layout (the nearest of ours: per_rank)" },
      { { algorithm = "high_throughput", output = "rank_major" }, "has no output rank_major; the nearest is flat" },
      { { output = "flat" }, "output flat is nccl_ep high_throughput's; low_latency's nearest is rank_major" },
      { { algorithm = "high_throughput", dtype = "fp8" }, "nccl_ep high_throughput has no fp8 dispatch" },
      { { algorithm = "fastest" }, "ep.buffer: algorithm fastest (expected one of high_throughput, low_latency)" },
      { { ranks = 2 }, "ranks is dl.ep.formula's" },
    } do
      local o = opts(c[1])
      o.backend, o.comm = "nccl_ep", w
      fails(o, c[2])
    end
    fails(opts { comm = w, algorithm = "low_latency" }, "ep.buffer: algorithm is nccl_ep's (low_latency, high_throughput)")
    fails(opts { comm = w, output = "flat" }, "ep.buffer: output flat is nccl_ep high_throughput's; ours:")
    fails(opts { comm = w, backend = "nccl" }, "ep.buffer: backend nccl (expected one of nccl_ep, ours)")
  end)
end)

describe("nccl_ep's outputs in our shape (distlab.bench.ep_nccl_ref)", function()
  local B, Hd, E, K = 6, 128, 4, 2
  local o = { N = 1, me = 0, E = E, B = B, H = Hd, K = K, dtype = "bf16" }
  local function inputs()
    local idx = dl.from_table({ { 0, 1 }, { 2, -1 }, { 3, 0 }, { -1, -1 }, { 1, 2 }, { 3, 2 } }, { dtype = "i32" })
    local w = dl.from_table({ { 0.5, 0.25 }, { 1, 0.75 }, { 2, 0.5 }, { 1, 1 }, { 0.125, 1.5 }, { 3, 0.5 } }, { dtype = "f32" })
    return { x = dl.randn({ B, Hd }, { dtype = "bf16", seed = 5 }), idx = idx, w = w, s = 0 }
  end

  -- ours' recv of output `output` for inp, on one cpu rank
  local function ours(output, inp)
    local b = dl.ep.buffer { comm = dl.comm.world(), max_tokens = B, hidden = Hd, experts = E, topk = K, output = output }
    local recv = b:dispatch(inp.x, inp.idx, inp.w)
    local copy = {}
    for k, t in pairs(recv) do copy[k] = t:clone() end
    b:free()
    return copy
  end

  it("high throughput expert_major (rows packed per expert, offsets) unpacks to ours and passes its checks", function()
    local inp = inputs()
    local r = ours("expert_major", inp)
    local counts = r.counts:tolist()
    local S = B * math.min(K, E)
    local x = dl.full({ S, Hd }, 0 / 0, { dtype = "bf16" })
    local offsets, at = {}, 0
    for e = 1, E do
      offsets[e] = at
      -- each expert's rows in reverse (order within an expert is free)
      for j = 1, counts[e] do x:narrow(1, at + j, 1):copy_(r.x:select(1, e):narrow(1, counts[e] - j + 1, 1)) end
      at = at + counts[e]
    end
    local fake = { x = x, counts = r.counts, offsets = dl.from_table(offsets, { dtype = "i32" }),
      weights = dl.ones({ S }, { dtype = "f32" }) }
    local on = { N = 1, me = 0, E = E, B = B, H = Hd, K = K, dtype = "bf16", output = "expert_major",
      algorithm = "high_throughput" }
    o.output = nref.ours_output(on)
    local bad, msg = ep_ref.check_dispatch(o, nref.as_ours(on, fake, { inp }), { inp })
    assert.equal(0, bad, msg)
    -- the experts' outputs: each row times its weight and coef(e), in place
    local y = nref.expert_outputs(on, fake)
    assert.same({ S, Hd }, y:size())
    local v = ep_ref.bf16_value(ffi.cast("uint16_t*", x:data_ptr())[0])
    assert.equal(ep_ref.bf16_value(ep_ref.bf16_bits(v * ep_ref.coef(0))), ep_ref.bf16_value(ffi.cast("uint16_t*", y:data_ptr())[0]))
  end)

  it("high throughput flat (a row per token, sources unmarked) sorts into ours' rank_major and passes its checks", function()
    local inp = inputs()
    local r = ours("rank_major", inp)
    local n = r.counts:tolist()[1]
    local x = dl.full({ B, Hd }, 0 / 0, { dtype = "bf16" })
    local ids, w = dl.full({ B, K }, -7, { dtype = "i64" }), dl.full({ B, K }, 0 / 0, { dtype = "f32" })
    local pi, pw = ffi.cast("int32_t*", r.expert_ids:data_ptr()), ffi.cast("float*", r.weights:data_ptr())
    local qi, qw = ffi.cast("int64_t*", ids:data_ptr()), ffi.cast("float*", w:data_ptr())
    for j = 0, n - 1 do -- as NCCL EP leaves them: rows reversed, 64-bit ids, a row's selections here packed
      local d = n - 1 - j -- first (in reverse), the rest -1 with weights not 0
      x:narrow(1, d + 1, 1):copy_(r.x:select(1, 1):narrow(1, j + 1, 1))
      local at = 0
      for k = K - 1, 0, -1 do
        if pi[j * K + k] >= 0 then
          qi[d * K + at], qw[d * K + at] = pi[j * K + k], pw[j * K + k]
          at = at + 1
        end
      end
      for k = at, K - 1 do qi[d * K + k], qw[d * K + k] = -1, 9 end
    end
    local fake = { x = x, counts = dl.from_table({ n }, { dtype = "i32" }), expert_ids = ids, weights = w }
    local on = { N = 1, me = 0, E = E, B = B, H = Hd, K = K, dtype = "bf16", output = "flat", algorithm = "high_throughput" }
    o.output = nref.ours_output(on)
    assert.equal("rank_major", o.output)
    local bad, msg = ep_ref.check_dispatch(o, nref.as_ours(on, fake, { inp }), { inp })
    assert.equal(0, bad, msg)
  end)
end)

describe("fp8 rows of another recipe (distlab.bench.ep_ref, fp8_scales = \"own\")", function()
  local B, Hd, E, K = 6, 256, 4, 2
  local function case()
    local idx = dl.from_table({ { 0, 1 }, { 2, -1 }, { 3, 0 }, { -1, -1 }, { 1, 2 }, { 3, 2 } }, { dtype = "i32" })
    local inp = { x = dl.randn({ B, Hd }, { dtype = "bf16", seed = 9 }), idx = idx, w = dl.ones({ B, K }, { dtype = "f32" }),
      s = 0 }
    local b = dl.ep.buffer { comm = dl.comm.world(), max_tokens = B, hidden = Hd, experts = E, topk = K, dtype = "fp8" }
    local r = b:dispatch(inp.x, inp.idx, inp.w)
    local recv = {}
    for k, t in pairs(r) do recv[k] = t:clone() end
    b:free()
    return inp, recv
  end
  -- recv with each expert's rows reversed and every scale times f (the codes kept)
  local function other(recv, f)
    local out = { counts = recv.counts, x = recv.x:clone(), scales = recv.scales:clone() }
    local counts = recv.counts:tolist()
    for e = 1, E do
      for j = 1, counts[e] do
        out.x:select(1, e):narrow(1, j, 1):copy_(recv.x:select(1, e):narrow(1, counts[e] - j + 1, 1))
        out.scales:select(1, e):narrow(1, j, 1):copy_(recv.scales:select(1, e):narrow(1, counts[e] - j + 1, 1))
      end
    end
    out.scales:mul_(f)
    return out
  end
  local o = { N = 1, me = 0, E = E, B = B, H = Hd, K = K, dtype = "fp8", output = "expert_major" }

  it("rows in another order with scales an ulp off pass as own, not as ours'", function()
    local inp, recv = case()
    local o_own = setmetatable({ fp8_scales = "own" }, { __index = o })
    local near = other(recv, 1 + 2 ^ -23)
    assert.equal(0, (ep_ref.check_dispatch(o_own, near, { inp })))
    assert.is_true(ep_ref.check_dispatch(o, near, { inp }) > 0)
  end)

  it("a 2% scale error fails as own", function()
    local inp, recv = case()
    local o_own = setmetatable({ fp8_scales = "own" }, { __index = o })
    local bad, msg = ep_ref.check_dispatch(o_own, other(recv, 1.02), { inp })
    assert.is_true(bad > 0)
    assert.truthy(msg:find("fp8 values off their x", 1, true), msg)
  end)
end)

describe("ours and nccl_ep on GPUs #multigpu", function()
  it("2 ranks: the same rows to the same experts, the same combined output; 1000 alternating calls", function()
    local gpus = dl.cuda_device_count()
    if gpus < 2 then return pending("nccl_ep needs 2 GPUs (one rank a GPU: NCCL refuses two ranks on one); this host has " .. gpus) end
    local rc, out = H.distlab("run -n 2 --device cuda spec/ep/nccl_equiv.lua")
    local why = out:match("nccl_equiv skipped: ([^\n]*)")
    if rc == 0 and why then return pending(why) end
    H.ranks_ok(2, "nccl_equiv", rc, out)
  end)
end)
