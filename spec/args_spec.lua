-- Issue 24's bad numbers, options and arguments: each ends in a message at
-- the caller's line that says what was wrong (distlab.args, the one checker
-- the bindings share), never a crash, a silent acceptance, a truncation or
-- an FFI conversion error; and the accounting cases that were silently
-- wrong give the right numbers.
local dl = require "distlab"
local H = require "helpers"

local function fails(fn, msg) return H.failed(msg, "args_spec.lua", pcall(fn)) end

describe("sizes, integers and options", function()
  it("sizes must be integers that fit an int64_t", function()
    fails(function() dl.zeros(2 ^ 63) end, "zeros: size in dimension 1 is 9.2233720368547758e+18, outside 0..2^63 - 1")
    fails(function() dl.zeros(2 ^ 64, "meta") end, "zeros: size in dimension 1 is 1.8446744073709552e+19, outside")
    fails(function() dl.zeros({ 2, "3" }) end, 'zeros: size in dimension 2 is "3" (a string), not an integer')
    fails(function() dl.empty(2, 2.5) end, "empty: size in dimension 2 is 2.5, not an integer")
    fails(function() dl.ones(0 / 0) end, "ones: size in dimension 1 is nan, not an integer")
    fails(function() dl.zeros(-1) end, "zeros: size in dimension 1 is -1, outside 0..2^63 - 1")
  end)

  it("the byte count, not the element count, is capped (2^61 bytes), whatever the dtype", function()
    fails(function() dl.empty({ 2 ^ 59 }, { dtype = "f64", device = "meta" }) end,
      "a tensor of shape [576460752303423488] with 8-byte elements would take 2^61 bytes or more")
    fails(function() dl.empty({ 2 ^ 30, 2 ^ 30, 4 }, { dtype = "bf16", device = "meta" }) end, "2-byte elements")
    local t = dl.empty({ 2 ^ 60 }, { dtype = "u8", device = "meta" }) -- 2^60 bytes: allowed
    assert.equal(2 ^ 60, t:numel())
  end)

  it("unknown option keys are refused, listing the known ones", function()
    fails(function() dl.zeros(2, { dtyp = "bf16" }) end, "zeros: unknown option dtyp (known: device, dtype)")
    fails(function() dl.randn(2, { sed = 1 }) end, "randn: unknown option sed (known: device, dtype, mean, seed, std)")
    fails(function() dl.mem.report { units = 4 } end, "mem.report: unknown option units (known: device, title, unit, unit_name)")
    fails(function() dl.allreduce.run(dl.ones(4), { algorithm = "one_shot" }) end,
      "allreduce.run: unknown option algorithm (known: algo, blocks, comm, out)")
    fails(function() dl.attn.fwd(dl.zeros(1, 4, 2, 8, "bf16"), dl.zeros(1, 4, 2, 8, "bf16"), dl.zeros(1, 4, 2, 8, "bf16"),
      { windows = { 1, 0 } }) end, "attn.fwd: unknown option windows (known: accumulate, align,")
  end)

  it("a dtype or device given twice, or sizes after the options, are refused", function()
    fails(function() dl.zeros(2, "cpu", "meta") end, "zeros: device given twice (cpu and meta)")
    fails(function() dl.ones(2, "f32", { dtype = "bf16" }) end, "ones: dtype given twice (f32 and bf16)")
    fails(function() dl.empty({ 2 }, "f32", 3) end, "empty: sizes after the options (argument #3)")
  end)

  it("arange of a huge count fails or works at once (no table of its values)", function()
    local t0 = os.clock()
    local t = dl.arange(0, 1e10, "meta")
    assert.equal(1e10, t:numel())
    fails(function() dl.arange(0, 2 ^ 70) end, "arange: the number of elements is 1.1805916207174113e+21, outside")
    fails(function() dl.arange(0, 1 / 0) end, "arange: inf is not a finite number")
    assert.is_true(os.clock() - t0 < 1)
    assert.same({ 0, 2, 4 }, dl.arange(0, 6, 2):tolist())
  end)

  it("windows and max_seqlen are int32 for the kernels: larger ones are refused, not truncated", function()
    local x = dl.zeros(1, 4, 2, 8, "bf16")
    fails(function() dl.attn.fwd(x, x, x, { window = { 2 ^ 31, 0 } }) end, "attn.fwd: window[1] is 2147483648, outside -1..2^31 - 1")
    local t = dl.zeros(8, 2, 8, "bf16")
    local cu = dl.from_table({ 0, 8 }, "i32")
    fails(function() dl.attn.fwd(t, t, t, { layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, max_seqlen_q = 2 ^ 32 }) end,
      "attn.fwd: max_seqlen_q is 4294967296, outside 1..2^31 - 1")
  end)

  it("thd sequences whose padded offsets leave less room than their valid rows are refused", function()
    local t = dl.zeros(12, 2, 8, "bf16")
    local cu = dl.from_table({ 0, 6, 10 }, "i32")
    local padded = dl.from_table({ 0, 4, 8 }, "i32") -- sequence 0 has 6 valid rows but 4 padded ones
    fails(function()
      dl.attn.fwd(t, t, t, { layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = padded,
        cu_seqlens_kv_padded = padded })
    end, "attn.fwd: sequence 0 (rows 0..5 by cu_seqlens_q_padded) overlaps sequence 1, which starts at row 4")
  end)

  it("a stream argument must be a stream", function()
    fails(function() dl.zeros(2):record_stream("s") end, 'record_stream: expected a stream (dl.stream()) or nil, got "s"')
    dl.zeros(2):record_stream(dl.stream("cpu"))
  end)
end)

describe("accounting", function()
  it("mem.report(device) reports that device", function()
    local r = tostring(dl.mem.report("meta"))
    assert.truthy(r:find("memory on meta", 1, true), r)
  end)

  it("a zero-sized tensor is one allocation and one free", function()
    local s0 = dl.mem.stats("cpu")
    local t = dl.empty(0)
    local s1 = dl.mem.stats("cpu")
    t:free()
    local s2 = dl.mem.stats("cpu")
    assert.same({ 1, 0 }, { s1.n_allocs - s0.n_allocs, s1.n_frees - s0.n_frees })
    assert.same({ 1, 1 }, { s2.n_allocs - s0.n_allocs, s2.n_frees - s0.n_frees })
  end)
end)

describe("arguments of the multi-rank objects (one rank)", function()
  local w = dl.comm.world()
  it("are checked before the FFI converts them", function()
    local t = dl.ones(4)
    fails(function() w:broadcast(t, "0") end, 'broadcast: root is "0" (a string), not an integer')
    fails(function() w:send(t, 0.5) end, "send: peer is 0.5, not an integer")
    fails(function() w:all_reduce("x") end, "all_reduce: the tensor must be a tensor, got string")
    fails(function() w:all_to_allv(t, { "4" }, t, { 4 }) end, 'recv_counts[1] is "4" (a string), not an integer')
    fails(function() w:split("red") end, 'split: color is "red" (a string), not an integer')
    local buf = dl.symm.alloc(w, { 4 })
    fails(function() buf:peer(nil) end, "symm view: rank is nil (a nil), not an integer")
    fails(function() buf:set_flag(0, 1, -1) end, "set_flag: value is -1, outside 0..4294967295")
    buf:free()
    fails(function() dl.allreduce.run(nil) end, "allreduce.run: the first argument must be a tensor, got nil")
    fails(function() dl.allreduce.run(t, { algo = "one_shot", blocks = "many" }) end,
      'allreduce.run: blocks is "many" (a string), not an integer')
    fails(function() dl.cp.attention { comm = "world" } end, 'cp.attention: comm must be a communicator (dl.comm.world(), a split), got "world"')
    local cp = dl.cp.attention { comm = w }
    fails(function() cp:forward(nil, t, t) end, "cp:forward: q must be a tensor")
    fails(function() cp.forward(t, t, t) end, "cp:forward: call it as cp:forward(q, k, v[, seq]) (a colon, not a dot)")
    fails(function() dl.overlap.copy(t, "x") end, "overlap.copy: src must be a tensor, got string")
  end)
end)
