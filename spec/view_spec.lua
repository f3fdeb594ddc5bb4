-- Views share storage with their base (1-based dims and indices), keep it
-- alive, and fail clearly when out of range.
local dl = require "distlab"

describe("views", function()
  local base
  before_each(function() base = dl.arange(24, { dtype = "f32" }):view(2, 3, 4) end)

  it("narrow selects a range of one dimension", function()
    local v = base:narrow(3, 2, 2)
    assert.same({ 2, 3, 2 }, v.shape)
    assert.same({ { 1, 2 }, { 5, 6 }, { 9, 10 } }, v:select(1, 1):tolist())
    assert.equal(1, v:storage_offset())
    assert.is_false(v:is_contiguous())
  end)

  it("select drops a dimension, negative indices count from the end", function()
    assert.same({ 20, 21, 22, 23 }, base:select(1, 2):select(1, -1):tolist())
    assert.same({ 3, 4 }, base:select(-3, 1).shape)
  end)

  it("view and reshape follow the strides", function()
    assert.same({ 6, 4 }, base:view(6, 4).shape)
    assert.same({ 4, 6 }, base:view(-1, 6).shape)
    assert.same({ 24 }, base:view({ 24 }).shape)
    local t = base:transpose(2, 3) -- 2x4x3, not viewable as 24
    assert.has_error(function() t:view(24) end)
    local r = t:reshape(24)
    assert.same({ 0, 4, 8, 1 }, { r:tolist()[1], r:tolist()[2], r:tolist()[3], r:tolist()[4] })
    -- a narrow along the first dim stays viewable
    assert.same({ 12 }, base:narrow(1, 2, 1):view(12).shape)
  end)

  it("transpose and permute reorder dimensions", function()
    local p = base:permute(3, 1, 2)
    assert.same({ 4, 2, 3 }, p.shape)
    assert.same({ 1, 12, 4 }, p:stride())
    assert.equal(base:tolist()[2][3][4], p:tolist()[4][2][3])
    assert.same(base:transpose(1, 3):tolist(), base:permute(3, 2, 1):tolist())
  end)

  it("writes through a view land in the base", function()
    base:select(2, 2):fill_(-1)
    assert.same({ -1, -1, -1, -1 }, base:tolist()[1][2])
    base:narrow(1, 2, 1):mul_(0)
    assert.same({ 0, 0, 0, 0 }, base:tolist()[2][3])
  end)

  it("a view keeps the storage alive after the base is gone", function()
    local v = dl.arange(10, { dtype = "f32" }):narrow(1, 5, 3)
    collectgarbage("collect")
    collectgarbage("collect")
    assert.same({ 4, 5, 6 }, v:tolist())
  end)

  it("free releases the memory now; views still hold theirs", function()
    dl.mem.reset_peak("meta")
    local before = dl.mem.stats("meta").allocated
    local t = dl.empty(1000, { device = "meta" })
    local v = t:narrow(1, 1, 10)
    t:free()
    assert.equal(before + 4000, dl.mem.stats("meta").allocated)
    v:free()
    assert.equal(before, dl.mem.stats("meta").allocated)
    assert.has_error(function() t:fill_(1) end)
    assert.truthy(tostring(t):find("freed", 1, true))
  end)

  it("rejects out-of-range views with clear messages", function()
    assert.has_error(function() base:narrow(3, 3, 3) end,
      "narrow: elements 3..5 out of range for dimension 3 of size 4")
    assert.has_error(function() base:narrow(4, 1, 1) end,
      "narrow: dimension 4 out of range for a 3-dimensional tensor")
    assert.has_error(function() base:select(2, 4) end,
      "select: index 4 out of range for dimension 2 of size 3")
    assert.has_error(function() base:view(5, 5) end,
      "view: shape [5, 5] has 25 elements but the tensor has 24")
    assert.has_error(function() base:view(-1, -1) end, "view: only one dimension can be -1")
    assert.has_error(function() base:permute(1, 1, 2) end, "permute: dimension 1 repeated")
    assert.error_matches(function() base:as_strided({ 5 }, { 6 }, 1) end,
      "view reaches element 25 of a storage of 24 elements", 1, true)
  end)
end)
