-- dl.load / dl.save / dl.from_bytes / t:bytes (distlab.io): .npy files
-- written by numpy and .safetensors written by hand from the format's spec
-- (spec/fixtures/io, made by make_fixtures.py there) load exactly, bit for
-- bit, for every dtype and shape, C and Fortran order, either byte order and
-- every format version; unsupported dtypes and broken files fail naming
-- what is wrong; what dl.save writes loads back exactly and numpy reads it
-- back exactly (skipped, saying so, where no Python with numpy is found:
-- python3, or $PYTHON); 1M f32 loads in under 20 ms on cpu.
local ffi = require "ffi"
local dl = require "distlab"
local H = require "helpers"

local FIX = H.root .. "/spec/fixtures/io/"

local function read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function u32(s, i)
  local a, b, c, d = s:byte(i, i + 3)
  return a + b * 256 + c * 65536 + d * 16777216
end

-- The data of an .npy file, from its own header length.
local function npy_data(path)
  local s = read_file(path)
  local major = s:byte(7)
  local start = major == 1 and 10 + s:byte(9) + 256 * s:byte(10) or 12 + u32(s, 9)
  return s:sub(start + 1)
end

-- value(i) of make_fixtures.py, by dtype
local function value(dtype, i)
  if dtype == "u8" then return (37 * i) % 251 end
  local v = (37 * i) % 101 - 50
  if dtype == "i32" or dtype == "i64" then return v end
  return v / 8
end

local function flat(x, out)
  out = out or {}
  if type(x) ~= "table" then out[#out + 1] = x return out end
  for _, y in ipairs(x) do flat(y, out) end
  return out
end

local CODES = { f2 = "f16", f4 = "f32", f8 = "f64", i4 = "i32", i8 = "i64", u1 = "u8", b1 = "u8", bf16 = "bf16" }
local SHAPES = { s0d = {}, s0 = { 0 }, s7 = { 7 }, s3x4 = { 3, 4 }, s2x3x4 = { 2, 3, 4 }, s2x1x3x2x2 = { 2, 1, 3, 2, 2 },
  s0x3 = { 0, 3 } }

local function err_of(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

describe(".npy written by numpy", function()
  local files = {}
  for code in pairs(CODES) do
    for sname in pairs(SHAPES) do
      local name = string.format("c_%s_%s.npy", code, sname)
      if io.open(FIX .. name) then files[#files + 1] = { name = name, code = code, shape = SHAPES[sname] } end
    end
  end
  table.sort(files, function(a, b) return a.name < b.name end)

  it("finds the fixtures (every dtype, 0-d to rank 5, empty)", function()
    assert.is_true(#files >= 42, "fixtures: " .. #files)
  end)

  for _, fx in ipairs(files) do
    it("loads " .. fx.name .. " exactly (dtype, shape, every bit, the values)", function()
      local t = dl.load(FIX .. fx.name)
      assert.equal(CODES[fx.code], t.dtype)
      assert.same(fx.shape, t.shape)
      assert.is_true(t:is_contiguous())
      assert.equal(npy_data(FIX .. fx.name), t:bytes())
      local got = flat(t:tolist())
      for i, v in ipairs(got) do
        local want = fx.code == "b1" and ((i - 1) % 3 == 0 and 1 or 0) or value(t.dtype, i - 1)
        if v ~= want then error(string.format("element %d: %s, expected %s", i - 1, v, want)) end
      end
    end)
  end

  it("loads Fortran order as the row-major tensor numpy means", function()
    for _, name in ipairs { "f_f2_s3x4", "f_f4_s3x4", "f_f8_s3x4", "f_i4_s3x4", "f_i8_s3x4", "f_u1_s3x4", "f_b1_s3x4",
      "f_bf16_s3x4", "f_f4_s2x3x4", "f_bf16_s2x3x4" } do
      local t = dl.load(FIX .. name .. ".npy")
      local c = dl.load(FIX .. name:gsub("^f_", "c_") .. ".npy")
      assert.same(c.shape, t.shape, name)
      assert.is_true(t:is_contiguous(), name)
      assert.equal(c:bytes(), t:bytes(), name)
    end
  end)

  it("loads big-endian files, swapped to the same values", function()
    for _, code in ipairs { "f2", "f4", "f8", "i4", "i8" } do
      local t = dl.load(FIX .. "be_" .. code .. "_s3x4.npy")
      assert.equal(dl.load(FIX .. "c_" .. code .. "_s3x4.npy"):bytes(), t:bytes(), code)
    end
  end)

  it("reads format versions 2.0 and 3.0", function()
    local want = dl.load(FIX .. "c_f4_s3x4.npy"):bytes()
    assert.equal(want, dl.load(FIX .. "v2_f4_s3x4.npy"):bytes())
    assert.equal(want, dl.load(FIX .. "v3_f4_s3x4.npy"):bytes())
  end)

  it("refuses the dtypes distlab has none for, naming them", function()
    for name, want in pairs { i1 = "'|i1' (int8)", i2 = "'<i2' (int16)", u2 = "'<u2' (uint16)",
      u4 = "'<u4' (uint32)", u8 = "'<u8' (uint64)", c8 = "'<c8' (complex64)", str = "'<U2'" } do
      local e = err_of(function() dl.load(FIX .. "bad_" .. name .. ".npy") end)
      assert.truthy(e:find("numpy dtype " .. want, 1, true), e)
      assert.truthy(e:find("no distlab dtype", 1, true), e)
    end
    local e = err_of(function() dl.load(FIX .. "bad_struct.npy") end)
    assert.truthy(e:find("structured dtype", 1, true), e)
  end)

  it("loads on meta: shapes and dtypes from the header, no data", function()
    local t = dl.load(FIX .. "c_bf16_s2x3x4.npy", { device = "meta" })
    assert.same({ 2, 3, 4 }, t.shape)
    assert.equal("bf16", t.dtype)
    assert.equal("meta", t.device)
  end)

  it("converts with dtype =", function()
    local t = dl.load(FIX .. "c_bf16_s3x4.npy", { dtype = "f32" })
    assert.equal("f32", t.dtype)
    assert.equal(value("f32", 5), t:tolist()[2][2])
  end)
end)

-- ---- safetensors --------------------------------------------------------------------------

-- A .safetensors file from a header (JSON text) and data, by hand.
local function write_st(path, header, data)
  local n = #header
  local len = string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256, 0, 0, 0, 0, 0)
  H.write(path, len .. header .. (data or ""))
  return path
end

describe(".safetensors written by hand from the format's spec", function()
  it("loads every dtype (BOOL as u8) with its shape, values and metadata", function()
    local ts, meta = dl.load(FIX .. "all.safetensors")
    assert.same({ format = "pt", who = "make_fixtures.py" }, meta)
    local want = { t_bf16 = { "bf16", { 3, 4 } }, t_f16 = { "f16", { 2, 3, 4 } }, t_f32 = { "f32", { 7 } },
      t_f64 = { "f64", {} }, t_i32 = { "i32", { 0, 3 } }, t_i64 = { "i64", { 3, 4 } }, t_u8 = { "u8", { 5, 2 } },
      t_bool = { "u8", { 6 } } }
    local n = 0
    for name, t in pairs(ts) do
      n = n + 1
      assert.equal(want[name][1], t.dtype, name)
      assert.same(want[name][2], t.shape, name)
      for i, v in ipairs(flat(t:tolist())) do
        local w = name == "t_bool" and ((i - 1) % 3 == 0 and 1 or 0) or value(t.dtype, i - 1)
        assert.equal(w, v, name .. " element " .. (i - 1))
      end
    end
    assert.equal(8, n)
  end)

  it("checks every entry and names what is wrong", function()
    local p = H.tmpname(".safetensors")
    local cases = {
      { '{"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}', "has dtype F8_E4M3, which has no distlab dtype" },
      { '{"a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}', "has dtype I16" },
      { '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', "hold 4 bytes, but F32 [2] needs 8" },
      { '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "reach past the data's 4 bytes", 4 },
      { '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}',
        'tensors "a" and "b" overlap', 4 },
      { '{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', "shape[1] is -1" },
      { '{"a":{"dtype":"F32","shape":[1]}}', "an entry needs dtype, shape and data_offsets" },
      { '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":1}', 'key "a" given twice' },
      { '{"a":{"dtype":"F32",', "expected a key" },
    }
    for _, c in ipairs(cases) do
      write_st(p, c[1], string.rep("\0", c[3] or 8))
      local e = err_of(function() dl.load(p) end)
      assert.truthy(e:find(c[2], 1, true), c[1] .. " -> " .. e)
    end
    H.write(p, "\255\255\0\0\0\0\0\0{}")
    assert.truthy(err_of(function() dl.load(p) end):find("the safetensors header says 65535 bytes", 1, true))
    H.write(p, "plain text, not a tensor file")
    assert.truthy(err_of(function() dl.load(p) end):find("neither .npy", 1, true))
    os.remove(p)
  end)
end)

-- ---- dl.save ------------------------------------------------------------------------------

local DTYPES = { "bf16", "f16", "f32", "f64", "i32", "i64", "u8" }
local SAVE_SHAPES = { {}, { 0 }, { 5 }, { 3, 4 }, { 2, 3, 2 }, { 1, 2, 1, 3, 2, 1, 1, 2 } }

-- value(i) of the fixtures as a tensor of dtype and shape
local function made(dtype, shape, device)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local host = dl.empty({ n }, { dtype = "f64", device = "cpu" })
  local p = ffi.cast("double*", host:data_ptr())
  for i = 0, n - 1 do p[i] = value(dtype, i) end
  return host:to(dtype):view(shape):to(device or "cpu")
end

describe("dl.save", function()
  it("writes .npy that dl.load reads back bit for bit, every dtype and shape", function()
    local p = H.tmpname(".npy")
    for _, dt in ipairs(DTYPES) do
      for _, shape in ipairs(SAVE_SHAPES) do
        local t = made(dt, shape)
        dl.save(p, t)
        local back = dl.load(p)
        assert.equal(dt, back.dtype)
        assert.same(shape, back.shape)
        assert.equal(t:bytes(), back:bytes())
        local f = read_file(p)
        assert.equal(0, (10 + f:byte(9) + 256 * f:byte(10)) % 64) -- the data 64-byte aligned, as numpy's
      end
    end
    local nc = made("f32", { 3, 4 }):transpose(1, 2)
    dl.save(p, nc) -- a transposed view: written row-major
    assert.equal(nc:contiguous():bytes(), dl.load(p):bytes())
    os.remove(p)
  end)

  it("writes .safetensors (names sorted, metadata) that dl.load reads back", function()
    local p = H.tmpname(".safetensors")
    local ts = {}
    for _, dt in ipairs(DTYPES) do ts["w_" .. dt] = made(dt, { 2, 3 }) end
    ts.scalar, ts.empty = made("f32", {}), made("i64", { 0, 4 })
    dl.save(p, ts, { metadata = { step = "12" } })
    local back, meta = dl.load(p)
    assert.same({ step = "12" }, meta)
    for name, t in pairs(ts) do
      assert.equal(t.dtype, back[name].dtype, name)
      assert.same(t.shape, back[name].shape, name)
      assert.equal(t:bytes(), back[name]:bytes(), name)
    end
    local s = read_file(p)
    assert.equal(0, (8 + u32(s, 1)) % 8)
    os.remove(p)
  end)

  it("refuses what it cannot write, listing known options", function()
    local e = err_of(function() dl.save(H.tmpname(".npy"), made("f32", { 2 }), { meta = {} }) end)
    assert.truthy(e:find("unknown option meta (known: metadata)", 1, true), e)
    e = err_of(function() dl.load(FIX .. "c_f4_s7.npy", { devcie = "cpu" }) end)
    assert.truthy(e:find("unknown option devcie (known: device, dtype)", 1, true), e)
    assert.truthy(err_of(function() dl.save(H.tmpname(), dl.empty(2, "meta")) end):find("meta tensor holds no values"))
    assert.truthy(err_of(function() dl.save(H.tmpname(), { a = 1 }) end):find('"a" is a number, not a tensor', 1, true))
  end)
end)

-- ---- numpy reads what dl.save wrote ------------------------------------------------------

local function find_numpy()
  for _, py in ipairs { os.getenv("PYTHON") or "", "python3" } do
    if py ~= "" and os.execute(py .. " -c 'import numpy' >/dev/null 2>&1") == 0 then return py end
  end
end

describe("numpy", function()
  local py = find_numpy()
  if not py then
    pending("reads back what dl.save writes: no Python with numpy here (python3, or $PYTHON)")
    return
  end
  it("reads back exactly what dl.save writes (.npy, and .safetensors by the spec, via numpy)", function()
    local dir = H.tmpname("-io")
    assert(os.execute("mkdir -p " .. dir) == 0)
    local names = {}
    for _, dt in ipairs(DTYPES) do
      for i, shape in ipairs(SAVE_SHAPES) do
        local name = string.format("%s_%d", dt, i)
        dl.save(dir .. "/" .. name .. ".npy", made(dt, shape))
        names[#names + 1] = string.format("(%q, %q, (%s))", name, dt, table.concat(shape, ",") .. (#shape == 1 and "," or ""))
      end
    end
    local ts = {}
    for _, dt in ipairs(DTYPES) do ts[dt] = made(dt, { 3, 2 }) end
    dl.save(dir .. "/all.safetensors", ts)
    local script = [==[
import json, struct, sys
import numpy as np
d = sys.argv[1]
def value(dt, n):
    i = np.arange(n, dtype=np.int64)
    if dt == "u8": return (37 * i) % 251
    v = (37 * i) % 101 - 50
    return v if dt in ("i32", "i64") else v / 8.0
NP = {"f16": "<f2", "f32": "<f4", "f64": "<f8", "i32": "<i4", "i64": "<i8", "u8": "|u1", "bf16": "<V2"}
def same(a, dt, shape, what):
    if dt == "bf16":
        assert a.dtype.kind == "V" and a.dtype.itemsize == 2, (what, a.dtype.str)
    else:
        assert a.dtype.str == NP[dt], (what, a.dtype.str)
    assert a.shape == shape, (what, a.shape, shape)
    n = int(np.prod(shape)) if shape else 1
    want = value(dt, n).reshape(shape)
    if dt == "bf16":  # the bits of the exact float32 values, upper half
        bits = want.astype("<f4").view("<u4") >> 16
        assert (a.view("<u2") == bits.astype("<u2")).all(), what
    else:
        assert (a == want.astype(NP[dt])).all(), what
for name, dt, shape in [ ]==] .. table.concat(names, ", ") .. [==[ ]:
    same(np.load(d + "/" + name + ".npy"), dt, shape, name)
raw = open(d + "/all.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
for name, e in h.items():
    b, en = e["data_offsets"]
    ST = {"BF16": "bf16", "F16": "f16", "F32": "f32", "F64": "f64", "I32": "i32", "I64": "i64", "U8": "u8"}
    dt = ST[e["dtype"]]
    a = np.frombuffer(raw[8 + n + b:8 + n + en], dtype=NP[dt]).reshape(e["shape"])
    same(a, dt, tuple(e["shape"]), name)
print("numpy ok", len(h))
]==]
    H.write(dir .. "/check.py", script)
    local p = io.popen(py .. " " .. dir .. "/check.py " .. dir .. " 2>&1")
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("numpy ok 7", 1, true), out)
    os.execute("rm -rf " .. dir)
  end)
end)

-- ---- bytes, from_table, speed ---------------------------------------------------------

describe("raw bytes", function()
  it("from_bytes and t:bytes round trip every dtype; sizes are checked", function()
    for _, dt in ipairs(DTYPES) do
      local t = made(dt, { 4, 3 })
      local s = t:bytes()
      assert.equal(t:nbytes(), #s)
      local back = dl.from_bytes(s, { 4, 3 }, dt)
      assert.equal(s, back:bytes())
      assert.equal(s, dl.from_bytes(s, { shape = { 12 }, dtype = dt }):bytes())
      -- a strided view gives its own elements, row-major
      local parts = {}
      for i = 1, 4 do parts[i] = t:narrow(1, i, 1):narrow(2, 2, 1):bytes() end
      assert.equal(table.concat(parts), t:select(2, 2):bytes())
    end
    assert.equal(string.char(0, 0, 128, 63), dl.from_table({ 1 }):bytes())
    local e = err_of(function() dl.from_bytes("abc", { 2 }, "f32") end)
    assert.truthy(e:find("3 bytes given, but f32 [2] takes 8", 1, true), e)
    e = err_of(function() dl.from_bytes("abcd", { shape = { 1 }, dtype = "f32", devce = "cpu" }) end)
    assert.truthy(e:find("unknown option devce (known: device, dtype, nbytes, shape)", 1, true), e)
    assert.truthy(err_of(function() dl.empty(2, "meta"):bytes() end):find("meta tensor holds no bytes", 1, true))
  end)

  it("from a cdata pointer with nbytes", function()
    local buf = ffi.new("int32_t[3]", { 7, -8, 9 })
    assert.same({ 7, -8, 9 }, dl.from_bytes(buf, { shape = { 3 }, dtype = "i32", nbytes = 12 }):tolist())
  end)
end)

describe("at memory speed on cpu", function()
  local N = 1048576
  local function best_ms(fn, reps)
    local best = math.huge
    for _ = 1, reps do
      local t0 = dl.now_us()
      fn()
      best = math.min(best, (dl.now_us() - t0) / 1000)
    end
    return best
  end

  it("loads 1M f32 from .npy in under 20 ms (and saves it)", function()
    local p = H.tmpname(".npy")
    local t = dl.randn(N, { seed = 3 })
    local save_ms = best_ms(function() dl.save(p, t) end, 3)
    local back
    local load_ms = best_ms(function() back = dl.load(p) end, 5)
    assert.equal(t:bytes(), back:bytes())
    print(string.format("\n  1M f32: dl.load %.2f ms, dl.save %.2f ms (best of 5 / 3)", load_ms, save_ms))
    assert.is_true(load_ms < 20, string.format("load took %.2f ms", load_ms))
    os.remove(p)
  end)

  it("from_table makes 1M f32 in tens of ms, not hundreds", function()
    local vals = {}
    for i = 1, N do vals[i] = i * 0.5 end
    local t
    local ms = best_ms(function() t = dl.from_table(vals) end, 3)
    print(string.format("\n  from_table, 1M f32: %.1f ms (best of 3)", ms))
    assert.equal(N, t:numel())
    assert.equal(0.5 * N, t:narrow(1, N, 1):item())
    assert.is_true(ms < 100, string.format("from_table took %.1f ms", ms))
    local e = err_of(function() dl.from_table({ { 1, 2 }, { 3 } }) end)
    assert.truthy(e:find("ragged at table[2] (expected 2 entries)", 1, true), e)
    e = err_of(function() dl.from_table({ { 1, 2 }, { 3, "x" } }) end)
    assert.truthy(e:find("table[2][2] is a string, not a number", 1, true), e)
  end)
end)

-- ---- cuda: through pinned buffers ------------------------------------------------------------

describe("on cuda #gpu", function()
  it("loads, saves and gives bytes through pinned buffers, exactly", function()
    local p = H.tmpname(".npy")
    for _, dt in ipairs(DTYPES) do
      local t = made(dt, { 3, 5, 7 })
      dl.save(p, t)
      local g = dl.load(p, { device = "cuda" })
      assert.equal("cuda:0", g.device)
      assert.equal(t:bytes(), g:bytes())
      dl.save(p, g)
      assert.equal(t:bytes(), dl.load(p):bytes())
      assert.equal(t:bytes(), dl.from_bytes(t:bytes(), { 3, 5, 7 }, dt, "cuda"):bytes())
    end
    local big = dl.randn(5 * 1048576, { seed = 4 }) -- 20 MiB: three 8 MiB chunks
    dl.save(p, big)
    assert.equal(big:bytes(), dl.load(p, { device = "cuda" }):cpu():bytes())
    dl.save(p, big:cuda())
    assert.equal(big:bytes(), dl.load(p):bytes())
    local ts = dl.load(FIX .. "all.safetensors", { device = "cuda" })
    assert.equal(dl.load(FIX .. "all.safetensors").t_bf16:bytes(), ts.t_bf16:bytes())
    os.remove(p)
  end)
end)
