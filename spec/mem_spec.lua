-- Allocator stats and tags: exact byte counts on meta and cpu, peaks, per-tag
-- current/peak/at-peak, reset, the trace, and the report in units.
local dl = require "distlab"

local function fresh(dev)
  collectgarbage("collect")
  collectgarbage("collect")
  dl.mem.reset_peak(dev)
  return dl.mem.stats(dev).allocated
end

for _, dev in ipairs({ "meta", "cpu" }) do
  describe("memory accounting on " .. dev, function()
    it("counts exact bytes and the peak", function()
      local base = fresh(dev)
      local a = dl.empty(1000, { dtype = "bf16", device = dev })  -- 2000 B
      local b = dl.empty(3, 7, { dtype = "f32", device = dev })   -- 84 B
      local s = dl.mem.stats(dev)
      assert.equal(base + 2084, s.allocated)
      assert.equal(base + 2084, s.allocated_peak)
      a:free()
      local v = b:view(21) -- views allocate nothing
      s = dl.mem.stats(dev)
      assert.equal(base + 84, s.allocated)
      assert.equal(base + 2084, s.allocated_peak)
      dl.mem.reset_peak(dev)
      assert.equal(base + 84, dl.mem.stats(dev).allocated_peak)
      b:free()
      assert.equal(base + 84, dl.mem.stats(dev).allocated) -- v still holds it
      v:free()
      assert.equal(base, dl.mem.stats(dev).allocated)
    end)

    it("charges allocations to the innermost tag and decomposes the peak", function()
      fresh(dev)
      local keep = {}
      dl.mem.tag("spec_outer", function()
        keep[1] = dl.empty(100, { dtype = "u8", device = dev })
        dl.mem.tag("spec_inner", function()
          keep[2] = dl.empty(50, { dtype = "u8", device = dev })
          local tmp = dl.empty(1000, { dtype = "u8", device = dev })
          tmp:free()
        end)
        keep[3] = dl.empty(10, { dtype = "u8", device = dev })
      end)
      local t = dl.mem.stats(dev).tags
      assert.same({ current = 110, peak = 110, at_peak = 100 }, t.spec_outer)
      assert.same({ current = 50, peak = 1050, at_peak = 1050 }, t.spec_inner)
      local rep = dl.mem.report { device = dev, unit = 50 }
      local inner
      for _, r in ipairs(rep.rows) do if r.tag == "spec_inner" then inner = r end end
      assert.equal(21, inner.peak_units)
      assert.equal(1, inner.current_units)
      assert.truthy(tostring(rep):find("spec_inner", 1, true))
      for _, k in ipairs(keep) do k:free() end
    end)

    it("pops the tag when the function fails", function()
      assert.has_error(function() dl.mem.tag("spec_fail", function() error("inside") end) end, "inside")
      dl.mem.trace_enable(1)
      dl.empty(8, { dtype = "u8", device = dev }):free()
      dl.empty(8, { dtype = "u8", device = dev })
      assert.equal("untagged", dl.mem.trace()[1].tag)
      dl.mem.trace_enable(0)
    end)

    it("records a bounded trace of allocations and frees", function()
      dl.mem.trace_enable(4)
      local a = dl.empty(10, { dtype = "u8", device = dev })
      dl.mem.tag("spec_trace", function() a:free() end)
      local b = dl.empty(20, { dtype = "u8", device = dev })
      b:free()
      local tr = dl.mem.trace()
      assert.equal(4, #tr)
      assert.same({ 10, -10, 20, -20 }, { tr[1].bytes, tr[2].bytes, tr[3].bytes, tr[4].bytes })
      assert.equal("untagged", tr[2].tag) -- freed bytes go back to the tag that allocated them
      assert.is_true(tr[4].t_us >= tr[1].t_us)
      local c = dl.empty(5, { dtype = "u8", device = dev })
      c:free()
      tr = dl.mem.trace()
      assert.same({ 20, -20, 5, -5 }, { tr[1].bytes, tr[2].bytes, tr[3].bytes, tr[4].bytes })
      dl.mem.trace_enable(0)
      assert.equal(0, #dl.mem.trace())
    end)
  end)
end

describe("memory accounting on meta at scale", function()
  it("accounts tensors far larger than this machine", function()
    local base = fresh("meta")
    local t = dl.empty(2, 262144, 16, 128, { dtype = "bf16", device = "meta" })
    assert.equal(base + 2 * 262144 * 16 * 128 * 2, dl.mem.stats("meta").allocated)
    t:free()
  end)
end)

describe("memory accounting on cuda #gpu", function()
  it("caches blocks, counts rounded bytes and reports untracked memory", function()
    local s0 = dl.mem.stats("cuda:0")
    local a = dl.empty(1000, { dtype = "u8", device = "cuda:0" })
    local s1 = dl.mem.stats("cuda:0")
    assert.equal(s0.allocated + 1024, s1.allocated)
    a:free()
    local b = dl.empty(1000, { dtype = "u8", device = "cuda:0" })
    local s2 = dl.mem.stats("cuda:0")
    assert.equal(s1.n_cache_hits + 1, s2.n_cache_hits)
    assert.equal(s1.reserved, s2.reserved)
    assert.is_true(s2.driver_total > 0 and s2.untracked >= 0)
    b:free()
    dl.mem.empty_cache("cuda:0")
    assert.is_true(dl.mem.stats("cuda:0").reserved <= s1.reserved)
  end)
end)
