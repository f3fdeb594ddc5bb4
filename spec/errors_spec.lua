-- Bad input gives a Lua error with a clear message at the caller's line —
-- never a crash.
local ffi = require "ffi"
local dl = require "distlab"

local function err_of(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

describe("errors", function()
  it("name the wrong dtype", function()
    assert.truthy(err_of(function() dl.empty(2, { dtype = "f8" }) end):find("unknown dtype f8", 1, true))
  end)

  it("name the shape mismatch", function()
    local e = err_of(function() dl.zeros(2, 3):add_(dl.zeros(3, 2)) end)
    assert.truthy(e:find("add: shape mismatch, [2, 3] vs [3, 2]", 1, true))
    e = err_of(function() dl.zeros(4):copy_(dl.zeros(5)) end)
    assert.truthy(e:find("copy: shape mismatch, [4] vs [5]", 1, true))
  end)

  it("point at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local e = err_of(function() dl.zeros(2):narrow(1, 2, 2) end)
    assert.truthy(e:find("errors_spec.lua:" .. line .. ":", 1, true), e)
  end)

  it("refuse an unknown device", function()
    assert.truthy(err_of(function() dl.zeros(2, { device = "tpu" }) end):find("unknown device tpu", 1, true))
    assert.truthy(err_of(function() dl.zeros(2, { device = "cuda:99" }) end):find("cuda:99 requested", 1, true))
  end)

  it("refuse bad sizes and arguments", function()
    assert.truthy(err_of(function() dl.zeros(-1) end):find("zeros: size in dimension 1 is -1, outside 0..2^63 - 1", 1, true))
    assert.truthy(err_of(function() dl.zeros(1.5) end):find("zeros: size in dimension 1 is 1.5, not an integer", 1, true))
    assert.truthy(err_of(function() dl.zeros(1, 1, 1, 1, 1, 1, 1, 1, 1) end):find("at most 8 dimensions", 1, true))
    assert.truthy(err_of(function() dl.zeros(2):fill_("x") end):find("fill_: value must be a number", 1, true))
    assert.truthy(err_of(function() dl.zeros(2):copy_(3) end):find("copy_: source is a number", 1, true))
    assert.truthy(err_of(function() dl.zeros(2):item() end):find("item: tensor has 2 elements", 1, true))
    assert.truthy(err_of(function() dl.from_table({ { 1, 2 }, { 3 } }) end):find("ragged", 1, true))
    assert.truthy(err_of(function() dl.mem.report { unit = -1 } end):find("unit must be a positive", 1, true))
  end)

  it("refuse mixing devices", function()
    local e = err_of(function() dl.zeros(2):add_(dl.zeros(2, { device = "meta" })) end)
    assert.truthy(e:find("tensors on different devices, cpu:0 and meta:0", 1, true))
    e = err_of(function() dl.zeros(2, "meta"):copy_(dl.zeros(2)) end)
    assert.truthy(e:find("meta tensors hold no data", 1, true))
  end)

  it("catch use of a freed tensor and of an ill-formed object", function()
    local t = dl.zeros(3)
    t:free()
    assert.truthy(err_of(function() t:fill_(1) end):find("use of a freed tensor", 1, true))
    assert.truthy(err_of(function() t:free() end):find("use of a freed tensor", 1, true))
    assert.truthy(err_of(function() dl.zeros(3):copy_(t) end):find("use of a freed tensor", 1, true))
    local fake = ffi.cast("dl_tensor_t*", ffi.new("char[256]"))
    assert.truthy(err_of(function() fake:fill_(0) end):find("not a distlab tensor", 1, true))
    local null = ffi.cast("dl_tensor_t*", nil)
    assert.truthy(err_of(function() dl.C.dl_tensor_fill(null, 0, nil); dl.check(-1) end) ~= nil)
    assert.equal(dl.C.DL_EINVAL, dl.C.dl_tensor_fill(null, 0, nil))
  end)

  it("refuse overlapping element-wise operands", function()
    local t = dl.arange(6, "f32")
    assert.truthy(err_of(function() t:narrow(1, 1, 5):add_(t:narrow(1, 2, 5)) end):find("overlap", 1, true))
    -- a copy between overlapping views is well defined: it goes through a temporary
    t:narrow(1, 2, 5):copy_(t:narrow(1, 1, 5))
    assert.same({ 0, 0, 1, 2, 3, 4 }, t:tolist())
  end)

  it("return nil, message through try for expected failures", function()
    local ok, msg = dl.try(dl.C.dl_mem_tag_pop())
    assert.is_nil(ok)
    assert.truthy(msg:find("pop without a push", 1, true))
  end)
end)
