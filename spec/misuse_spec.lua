-- Issue 53's unclear errors and bad values outside EP, on one process: each
-- is a Lua error at the caller's line naming what was wrong (distlab.args,
-- the one checker), never an FFI conversion error or a silent acceptance.
-- The multi-rank cases: spec/overlap_spec.lua (mismatch fields, a freed op,
-- a completed run whose peers exit), spec/comm_spec.lua (a rank that cannot
-- make a communicator, sends to self).
local dl = require "distlab"
local H = require "helpers"

local function fails(fn, msg) return H.failed(msg, "misuse_spec.lua", pcall(fn)) end

describe("numbers handed to C", function()
  local a = dl.randn({ 2, 3 }, { dtype = "bf16" })
  local b = dl.randn({ 3, 2 }, { dtype = "bf16" })

  it("gemm's alpha and beta must be numbers", function()
    fails(function() dl.gemm(a, b, { alpha = "2" }) end, 'gemm: alpha is "2" (a string), not a number')
    fails(function() dl.gemm(a, b, { beta = 0 / 0 }) end, "gemm: beta is nan, not a finite number")
    assert.equal(2, dl.gemm(a, b, { alpha = 2, out_dtype = "f32" }):size(1))
  end)

  it("out_dtype must agree with a given out", function()
    fails(function() dl.gemm(a, b, dl.empty({ 2, 2 }, { dtype = "bf16" }), { out_dtype = "f32" }) end,
      "gemm: out_dtype is f32 but the given out is bf16")
    dl.gemm(a, b, dl.empty({ 2, 2 }, { dtype = "f32" }), { out_dtype = "f32" })
    local x = dl.randn({ 2, 3, 4 }, { dtype = "bf16" })
    local w = dl.randn({ 2, 4, 5 }, { dtype = "bf16" })
    fails(function() dl.gemm.grouped(x, w, { 3, 3 }, dl.empty({ 2, 3, 5 }, { dtype = "bf16" }), { out_dtype = "f32" }) end,
      "gemm.grouped: out_dtype is f32 but the given out is bf16")
  end)

  it("element-wise scalars, random bounds and seeds must be numbers", function()
    local t = dl.zeros(4)
    fails(function() t:add_(t, {}) end, "add_: alpha is table")
    fails(function() t:sub_(1, "2") end, 'sub_: alpha is "2" (a string), not a number')
    fails(function() t:normal_("x") end, 'normal_: mean is "x" (a string), not a number')
    fails(function() dl.rand({ 4 }, { seed = "x" }) end, 'uniform_: seed is "x" (a string), not an integer')
  end)

  it("a table where a tensor goes is named, not converted", function()
    local ar = dl.allreduce.get(dl.comm.world())
    fails(function() ar:region_offset({}) end, "allreduce.region_offset: expected a tensor, got table")
  end)
end)

describe("bad values", function()
  it("a freed tensor answers nothing, not even its shape", function()
    local t = dl.randn({ 3, 2 })
    t:free()
    for _, f in ipairs { function() return t.shape end, function() return t.dtype end, function() return t:size(1) end,
      function() return t:dim() end, function() return t:stride() end } do
      fails(f, "use of a freed tensor")
    end
    assert.equal("tensor(<freed>)", tostring(t))
  end)

  it("cp with backend cudnn on cpu names the device; on meta it counts cuDNN's workspace (accepted)", function()
    fails(function() dl.cp.attention { backend = "cudnn", correction = "incremental" } end,
      'cp.attention: backend = "cudnn" needs a cuda device (cuDNN runs on cuda only)')
    fails(function() dl.cp.attention { backend = "cudnn" } end, "needs a cuda device")
    local cp = dl.cp.attention { comm = dl.comm.meta(2, 0), backend = "cudnn", correction = "incremental" }
    assert.equal("cudnn", cp.backend)
  end)

  it("sends and receives to self outside a group are errors", function()
    local w = dl.comm.world()
    fails(function() w:send(dl.ones(2), w.rank) end, "send: rank 0 to itself outside a group")
    fails(function() w:recv(dl.ones(2), w.rank) end, "recv: rank 0 to itself outside a group")
  end)
end)

describe("unknown option keys", function()
  it("are refused by every binding that takes options", function()
    fails(function() dl.bench(function() end, { iter = 3 }) end, "bench: unknown option iter")
    fails(function() dl.bench.timing.host(function() end, { batchs = 2 }) end, "bench.host: unknown option batchs")
    fails(function() dl.bench.timing.graph(function() end, { replay = 2 }) end, "bench.graph: unknown option replay")
    fails(function() dl.bench.timing.loop_once(function() end, 1, { timout = 2 }) end, "bench.loop_once: unknown option timout")
    fails(function() dl.graph.capture(function() end, { dev = "cpu" }) end, "graph.capture: unknown option dev")
    fails(function() dl.comm.world { timeoutt = 3 } end, "comm.world: unknown option timeoutt")
    fails(function() dl.allreduce.tune { size = { 1 } } end, "allreduce.tune: unknown option size")
    fails(function() dl.bench.table.new({ { "a" } }, { quit = true }) end, "bench.table: unknown option quit")
  end)
end)
