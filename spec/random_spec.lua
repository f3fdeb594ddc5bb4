-- Philox random numbers: reproducible for a seed, independent of the device,
-- and distributed as asked.
local dl = require "distlab"
local H = require "helpers"

describe("random", function()
  it("is reproducible for the same seed and differs across seeds", function()
    dl.manual_seed(42)
    local a = dl.randn(100)
    dl.manual_seed(42)
    local b = dl.randn(100)
    assert.tensor_near(a, b, 0, 0)
    local c = dl.randn(100)
    assert.is_true(dl.max_abs_diff(a, c) > 0.1)
    assert.tensor_near(dl.rand(50, { seed = 7 }), dl.rand(50, { seed = 7 }), 0, 0)
  end)

  it("element i depends only on (seed, i): a larger draw extends a smaller one", function()
    local small = dl.randn(10, { seed = 5 })
    local big = dl.randn(4, 10, { seed = 5 })
    assert.tensor_near(small, big:select(1, 1), 0, 0)
  end)

  it("has the right moments", function()
    local n = 200000
    local x = dl.randn(n, { seed = 1, dtype = "f64" }):tolist()
    local s, s2 = 0, 0
    for i = 1, n do s, s2 = s + x[i], s2 + x[i] * x[i] end
    assert.near(0, s / n, 0.01)
    assert.near(1, s2 / n, 0.01)
    local u = dl.rand(n, { seed = 2, dtype = "f64" }):tolist()
    local mn, mx, su = 1, 0, 0
    for i = 1, n do mn, mx, su = math.min(mn, u[i]), math.max(mx, u[i]), su + u[i] end
    assert.is_true(mn >= 0 and mx < 1)
    assert.near(0.5, su / n, 0.01)
    local r = dl.randn(1000, { seed = 3, mean = 5, std = 0.1, dtype = "f64" }):tolist()
    local m = 0
    for i = 1, #r do m = m + r[i] end
    assert.near(5, m / #r, 0.02)
  end)

  it("rejects integer tensors", function()
    assert.error_matches(function() dl.randn(4, "i32") end,
      "random values need a floating-point tensor, got i32", 1, true)
  end)
end)

describe("random on cuda #gpu", function()
  it("gives the same values as the cpu for the same seed and shape", function()
    for _, dt in ipairs({ "f32", "bf16", "f16", "f64" }) do
      local c = dl.randn(3, 1000, { seed = 99, dtype = dt })
      local g = dl.randn(3, 1000, { seed = 99, dtype = dt, device = "cuda:0" })
      assert.is_true(dl.max_abs_diff(c, g:to("cpu")) <= (dt == "f64" and 1e-12 or 1e-6), dt)
      local cu = dl.rand(777, { seed = 4, dtype = dt })
      local gu = dl.rand(777, { seed = 4, dtype = dt, device = "cuda:0" })
      assert.is_true(dl.max_abs_diff(cu, gu:to("cpu")) <= 1e-12, dt)
    end
    local strided = dl.zeros(8, 8, { device = "cuda:0" }):transpose(1, 2)
    strided:normal_(0, 1, 12)
    local ref = dl.zeros(8, 8):transpose(1, 2):normal_(0, 1, 12)
    assert.is_true(dl.max_abs_diff(ref, strided:to("cpu")) <= 1e-6)
  end)
end)
