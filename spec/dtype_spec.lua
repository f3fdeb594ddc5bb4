-- Conversions round to nearest even, keep fp16 subnormals, saturate integers;
-- checked against a reference written here from the IEEE definitions.
local ffi = require "ffi"
local dl = require "distlab"
local H = require "helpers"

local bit = require "bit"

-- Reference: the value of a bf16 / fp16 bit pattern.
local function bf16_value(b)
  local u = ffi.new("uint32_t[1]", bit.lshift(b, 16))
  return tonumber(ffi.cast("float*", u)[0])
end
local function f16_value(h)
  local s = bit.band(h, 0x8000) ~= 0 and -1 or 1
  local e = bit.band(bit.rshift(h, 10), 0x1f)
  local m = bit.band(h, 0x3ff)
  if e == 0 then return s * m * 2 ^ -24 end
  if e == 31 then return m == 0 and s * math.huge or 0 / 0 end
  return s * (1 + m / 1024) * 2 ^ (e - 15)
end

-- Reference rounding: the nearest representable value, ties to the even pattern.
local function round_ref(x, values)
  local best, bd = nil, math.huge
  for _, v in ipairs(values) do
    local d = math.abs(v.value - x)
    if d < bd or (d == bd and v.bits % 2 == 0) then best, bd = v, d end
  end
  return best.value
end

local function as_f32_tensor(list)
  return dl.from_table(list, { dtype = "f32" })
end

for _, dev in ipairs(H.devices) do
  describe("dtype conversions on " .. dev.name .. dev.tag, function()
    it("round-trips every fp16 pattern through f32", function()
      local vals = {}
      for h = 0, 65535 do
        local v = f16_value(h)
        if v == v then vals[#vals + 1] = v end
      end
      local t = as_f32_tensor(vals):to(dev.name)
      local back = t:to("f16"):to("f32")
      assert.tensor_near(t, back, 0, 0)
      assert.equal(65536 - 2 * 1023, t:numel()) -- every pattern but the NaNs
    end)

    it("rounds f32 to bf16 to nearest, ties to even", function()
      local xs = { 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, 1 + 2 ^ -8 + 2 ^ -20, -(1 + 2 ^ -8),
        3.14159265, 1e-40, -0.0, 65504.7, 3.3895313892515355e38 }
      local got = as_f32_tensor(xs):to(dev.name):to("bf16"):to("f64"):tolist()
      for i, x in ipairs(xs) do
        local f = tonumber(ffi.new("float", x))
        -- candidates: the two bf16 neighbours of f
        local u = ffi.new("float[1]", f)
        local b = bit.rshift(ffi.cast("uint32_t*", u)[0], 16)
        local cands = { { bits = b, value = bf16_value(b) }, { bits = b + 1, value = bf16_value(b + 1) } }
        assert.equal(round_ref(f, cands), got[i], "x = " .. x)
      end
      assert.equal(1, got[1])           -- tie -> even (1.0)
      assert.equal(1 + 2 ^ -6, got[2])  -- tie -> even (up)
      assert.equal(1 + 2 ^ -7, got[3])  -- above the tie -> up
    end)

    it("rounds f32 to f16 to nearest even, with subnormals and overflow", function()
      local xs = { 1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 2 ^ -24, 2 ^ -25, 3 * 2 ^ -26, 2 ^ -26, 5.96e-8 * 1.5,
        65504, 65519.9, 65520, -1e6, 6.1e-5, 0.1 }
      local got = as_f32_tensor(xs):to(dev.name):to("f16"):to("f64"):tolist()
      local all = {}
      for h = 0, 0x7bff do all[#all + 1] = { bits = h, value = f16_value(h) } end
      for i, x in ipairs(xs) do
        local f = tonumber(ffi.new("float", x))
        local expect
        if math.abs(f) >= 65520 then expect = f > 0 and math.huge or -math.huge
        else
          local a = math.abs(f)
          expect = round_ref(a, all)
          if f < 0 then expect = -expect end
        end
        assert.equal(expect, got[i], "x = " .. x)
      end
      assert.equal(1, got[1])
      assert.equal(2 ^ -24, got[3])
      assert.equal(0, got[4])        -- exactly half the smallest subnormal: ties to even (0)
      assert.equal(2 ^ -24, got[5])  -- 0.75 of it rounds up
    end)

    it("keeps NaN and Inf through every float dtype", function()
      local t = as_f32_tensor({ 0 / 0, math.huge, -math.huge }):to(dev.name)
      for _, dt in ipairs({ "f16", "bf16", "f64" }) do
        local v = t:to(dt):to("f64"):tolist()
        assert.is_true(v[1] ~= v[1])
        assert.equal(math.huge, v[2])
        assert.equal(-math.huge, v[3])
      end
      assert.same({ 0, 2147483647, -2147483648 }, t:to("i32"):tolist())
    end)
  end)
end
