-- The math a reference needs (distlab.tensor_math): softmax, log_softmax,
-- topk, sort, argsort, gather, scatter_add, index_select, index_add_,
-- expand, cat and bincount on cpu against fp64 references written here in
-- plain Lua, on strided views and every dtype they take, with their errors;
-- on meta (shapes, nothing run); and on cuda against the cpu twins (#gpu).
local dl = require "distlab"
local H = require "helpers"

local function err_of(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

-- A deterministic 2-D table of numbers: small integers (ties) or fractions.
local function grid(rows, cols, ties, seed)
  local s, t = seed or 1, {}
  for i = 1, rows do
    t[i] = {}
    for j = 1, cols do
      s = (s * 48271) % 2147483647
      t[i][j] = ties and (s % 5) - 2 or (s % 20011) / 1000 - 10
    end
  end
  return t
end

-- rows of t along dim 2 (dim = 2) or columns (dim = 1) as lists
local function lines(t, dim)
  if dim == 2 then return t end
  local out = {}
  for j = 1, #t[1] do
    out[j] = {}
    for i = 1, #t do out[j][i] = t[i][j] end
  end
  return out
end

local function unlines(ls, dim)
  if dim == 2 then return ls end
  return lines(ls, 1)
end

-- The stable sorting permutation of a list (1-based), NaN above +inf.
local function stable_order(list, descending)
  local function k(v)
    if v ~= v then return 2, 0 elseif v == math.huge then return 1, 0 elseif v == -math.huge then return -1, 0 end
    return 0, v
  end
  local idx = {}
  for i = 1, #list do idx[i] = i end
  table.sort(idx, function(a, b)
    local ca, va = k(list[a])
    local cb, vb = k(list[b])
    if ca ~= cb then if descending then return ca > cb end return ca < cb end
    if va ~= vb then if descending then return va > vb end return va < vb end
    return a < b
  end)
  return idx
end

local function near(a, b, tol)
  if a ~= a or b ~= b then return a ~= a and b ~= b end
  if a == b then return true end
  return math.abs(a - b) <= tol * math.max(1, math.abs(b))
end

describe("softmax and log_softmax (cpu, against fp64 in Lua)", function()
  it("along either dim, f32 and bf16 in, any float out, strided input", function()
    local t = grid(6, 9)
    for _, dim in ipairs { 1, 2 } do
      for _, log in ipairs { false, true } do
        local want = {}
        for li, l in ipairs(lines(t, dim)) do
          local m, s = -math.huge, 0
          for _, v in ipairs(l) do m = math.max(m, v) end
          for _, v in ipairs(l) do s = s + math.exp(v - m) end
          want[li] = {}
          for j, v in ipairs(l) do want[li][j] = log and (v - m - math.log(s)) or math.exp(v - m) / s end
        end
        want = unlines(want, dim)
        for _, src in ipairs { dl.from_table(t, "f64"), dl.from_table(t):transpose(1, 2):contiguous():transpose(1, 2) } do
          local y = log and src:log_softmax(dim, { dtype = "f64" }) or src:softmax(dim, { dtype = "f64" })
          local got = y:tolist()
          local tol = src.dtype == "f64" and 1e-14 or 1e-6
          for i = 1, 6 do
            for j = 1, 9 do
              if not near(got[i][j], want[i][j], tol) then
                error(string.format("dim %d log %s %s [%d][%d]: %.17g, expected %.17g", dim, tostring(log), src.dtype,
                  i, j, got[i][j], want[i][j]))
              end
            end
          end
        end
      end
    end
    local b = dl.from_table(t):bf16():softmax(-1)
    assert.equal("bf16", b.dtype)
    assert.equal("f32", dl.from_table(t):bf16():softmax(-1, { dtype = "f32" }).dtype)
  end)

  it("rows with NaN, only -inf, or +inf give NaN, as torch", function()
    local y = dl.from_table({ { 1, 0 / 0, 2 }, { -math.huge, -math.huge, -math.huge }, { 0, math.huge, 1 } }, "f64")
      :softmax(2):tolist()
    for i = 1, 2 do for j = 1, 3 do assert.is_true(y[i][j] ~= y[i][j]) end end
    assert.is_true(y[3][1] ~= y[3][1]) -- inf - inf
  end)
end)

describe("sort, argsort and topk (cpu)", function()
  local dtypes = { "f64", "f32", "bf16", "f16", "i32", "i64", "u8" }
  it("are stable, in both directions, along either dim, for every dtype", function()
    for _, ties in ipairs { true, false } do
      local t = grid(7, 11, ties, ties and 3 or 4)
      for _, dt in ipairs(dtypes) do
        local x = dl.from_table(t, "f64"):add_(dt == "u8" and 2 or 0):to(dt)
        local vals = x:to("f64"):tolist()
        for _, dim in ipairs { 1, 2 } do
          for _, desc in ipairs { false, true } do
            local idx = x:argsort({ dim = dim, descending = desc }):tolist()
            local sorted = x:sort({ dim = dim, descending = desc }):to("f64"):tolist()
            local want = {}
            for li, l in ipairs(lines(vals, dim)) do want[li] = stable_order(l, desc) end
            local got, gs = lines(idx, dim), lines(sorted, dim)
            for li, w in ipairs(want) do
              for j = 1, #w do
                if got[li][j] ~= w[j] - 1 then
                  error(string.format("%s dim %d desc %s line %d pos %d: index %d, expected %d", dt, dim, tostring(desc),
                    li, j, got[li][j], w[j] - 1))
                end
                assert.equal(lines(vals, dim)[li][w[j]], gs[li][j])
              end
            end
          end
        end
      end
    end
  end)

  it("order NaN above +inf, -0 equal to +0, and int64 beyond 2^53 exactly", function()
    local x = dl.from_table({ 0 / 0, math.huge, -0.0, 0, -math.huge, 1 }, "f32")
    assert.same({ 4, 2, 3, 5, 1, 0 }, x:argsort():tolist())
    assert.same({ 0, 1, 5, 2, 3, 4 }, x:argsort({ descending = true }):tolist())
    local ffi = require "ffi"
    local a = ffi.new("int64_t[3]")
    a[0], a[1], a[2] = 1152921504606846977LL, 1152921504606846976LL, -4611686018427387904LL -- 2^60 + 1, 2^60, -2^62
    local big = dl.from_bytes(ffi.string(a, 24), { 3 }, "i64")
    assert.same({ 2, 1, 0 }, big:argsort():tolist())
  end)

  it("topk: the k largest or smallest in order, ties to the lower index, any k", function()
    local t = grid(5, 8, true, 9)
    local x = dl.from_table(t)
    for _, largest in ipairs { true, false } do
      for _, k in ipairs { 0, 1, 3, 8 } do
        local v, i = x:topk(k, { largest = largest })
        assert.same({ 5, k }, v.shape)
        assert.equal("i64", i.dtype)
        local iv, vv = i:tolist(), v:tolist()
        for r = 1, 5 do
          local order = stable_order(t[r], largest)
          for j = 1, k do
            assert.equal(order[j] - 1, iv[r][j])
            assert.equal(t[r][order[j]], vv[r][j])
          end
        end
      end
    end
    local _, i = x:topk(2, { dim = 1, dtype = "i32" })
    assert.equal("i32", i.dtype)
    assert.same({ 2, 8 }, i.shape)
    assert.truthy(err_of(function() x:topk(9) end):find("k = 9, but dimension 2 has 8 elements", 1, true))
    local e = err_of(function() x:topk(2, { dmi = 1 }) end)
    assert.truthy(e:find("unknown option dmi (known: dim, dtype, largest)", 1, true), e)
    e = err_of(function() x:argsort({ dim = 3 }) end)
    assert.truthy(e:find("dimension 3 out of range for a 2-dimensional tensor", 1, true), e)
  end)
end)

describe("gather, scatter_add, index_select, index_add_ (cpu)", function()
  it("gather follows torch.gather, also with a smaller index and a strided x", function()
    local t = grid(4, 6)
    local x = dl.from_table(t, "f64")
    local index = { { 5, 0, 2 }, { 1, 1, 1 }, { 0, 3, 5 } }
    local y = x:gather(2, dl.from_table(index, "i64")):tolist()
    for i = 1, 3 do for j = 1, 3 do assert.equal(t[i][index[i][j] + 1], y[i][j]) end end
    local idx1 = { { 3, 0, 1, 2, 2, 0 }, { 0, 0, 0, 0, 0, 0 } }
    local y1 = x:gather(1, dl.from_table(idx1, "i32")):tolist()
    for i = 1, 2 do for j = 1, 6 do assert.equal(t[idx1[i][j] + 1][j], y1[i][j]) end end
    local xt = x:transpose(1, 2) -- [6, 4], strided
    local y2 = xt:gather(2, dl.from_table({ { 3 }, { 0 } }, "i64")):tolist()
    assert.same({ { t[4][1] }, { t[1][2] } }, y2)
    local e = err_of(function() x:gather(2, dl.from_table({ { 0, 6 } }, "i64")) end)
    assert.truthy(e:find("index 6 at position 1 (row-major) of index is out of range for dimension 2 of size 6", 1, true), e)
    e = err_of(function() x:gather(2, dl.from_table({ { -1 } }, "i64")) end)
    assert.truthy(e:find("index -1 at position 0", 1, true), e)
    e = err_of(function() x:gather(2, dl.from_table({ { 0 } })) end)
    assert.truthy(e:find("index must be i64 or i32, got f32", 1, true), e)
  end)

  it("scatter_add adds every source element (repeats too), rounding each add to the dtype", function()
    local src = grid(3, 5)
    local index = { { 0, 1, 2, 0, 0 }, { 2, 2, 2, 1, 0 }, { 1, 0, 1, 3, 3 } }
    local x = dl.zeros({ 4, 5 }, "f64")
    x:scatter_add_(1, dl.from_table(index, "i64"), dl.from_table(src, "f64"))
    local want = {}
    for i = 1, 4 do want[i] = { 0, 0, 0, 0, 0 } end
    for i = 1, 3 do for j = 1, 5 do want[index[i][j] + 1][j] = want[index[i][j] + 1][j] + src[i][j] end end
    local got = x:tolist()
    for i = 1, 4 do for j = 1, 5 do assert.is_true(near(got[i][j], want[i][j], 1e-15)) end end
    -- bf16: 256 + 1 + 1 stays 256 when each add rounds (two adds of 1), 258 if summed first
    local b = dl.full({ 1 }, 256, "bf16")
    b:scatter_add_(1, dl.from_table({ 0, 0 }, "i64"), dl.ones(2, "bf16"))
    assert.equal(256, b:item())
    -- int64 wraps as two's complement, as the GPU's atomics
    local ffi = require "ffi"
    local m = dl.from_bytes(ffi.string(ffi.new("int64_t[1]", { 2 ^ 63 - 1 }), 8), { 1 }, "i64")
    m:scatter_add_(1, dl.from_table({ 0 }, "i64"), dl.ones(1, "i64"))
    assert.equal(-2 ^ 63, m:item())
    local e = err_of(function() x:scatter_add_(1, dl.from_table({ { 4 } }, "i64"), dl.ones(1, 1, "f64")) end)
    assert.truthy(e:find("index 4 at position 0 (row-major) of index is out of range for dimension 1 of size 4", 1, true), e)
    e = err_of(function() x:scatter_add_(1, dl.from_table({ { 0 } }, "i64"), dl.ones(1, 1)) end)
    assert.truthy(e:find("src is f32 but dst f64", 1, true), e)
  end)

  it("index_select and index_add_ on rows (the dispatch and combine of a MoE)", function()
    local t = grid(5, 3)
    local x = dl.from_table(t, "f64")
    local rows = x:index_select(1, dl.from_table({ 4, 0, 4 }, "i64")):tolist()
    assert.same({ t[5], t[1], t[5] }, rows)
    local cols = x:index_select(2, dl.from_table({ 2 }, "i32")):tolist()
    for i = 1, 5 do assert.same({ t[i][3] }, cols[i]) end
    local acc = dl.zeros({ 2, 3 }, "f64")
    acc:index_add_(1, dl.from_table({ 1, 0, 1 }, "i64"), x:narrow(1, 1, 3))
    local got = acc:tolist()
    for j = 1, 3 do
      assert.is_true(near(got[1][j], t[2][j], 1e-15))
      assert.is_true(near(got[2][j], t[1][j] + t[3][j], 1e-15))
    end
    assert.truthy(err_of(function() acc:index_add_(1, dl.from_table({ 0 }, "i64"), x) end)
      :find("src has 5 elements along dimension 1 but the index 1", 1, true))
  end)
end)

describe("expand, cat, bincount (cpu)", function()
  it("expand repeats size-1 dims with stride 0 and adds leading dims", function()
    local x = dl.from_table({ { 1 }, { 2 } })
    local e = x:expand(3, 2, 4)
    assert.same({ 3, 2, 4 }, e.shape)
    assert.same({ 0, 1, 0 }, e:stride())
    assert.same({ { 1, 1, 1, 1 }, { 2, 2, 2, 2 } }, e:select(1, 3):tolist())
    assert.same({ 2, 5 }, x:expand(-1, 5).shape)
    assert.truthy(err_of(function() x:expand(3, 1) end):find("dimension 1 has size 2, which cannot become 3", 1, true))
  end)

  it("cat joins along any dim and checks the rest", function()
    local a, b = dl.from_table({ { 1, 2 }, { 3, 4 } }), dl.from_table({ { 5, 6 } })
    assert.same({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, dl.cat({ a, b }):tolist())
    assert.same({ { 1, 2, 1, 2 }, { 3, 4, 3, 4 } }, dl.cat({ a, a }, -1):tolist())
    assert.same({ { 1, 2 }, { 3, 4 } }, dl.cat({ a, dl.empty(0, 2) }):tolist())
    assert.truthy(err_of(function() dl.cat({ a, b }, 2) end):find("tensor 2 has size 1 in dimension 1, tensor 1 2", 1, true))
    assert.truthy(err_of(function() dl.cat({ a, b:f64() }) end):find("tensor 2 is f64 on cpu, tensor 1 f32 on cpu", 1, true))
  end)

  it("bincount counts values in [0, bins), skips the rest (-1: none), sums weights", function()
    local x = dl.from_table({ { 0, 3, 3 }, { -1, 1, 7 } }, "i32")
    assert.same({ 1, 1, 0, 2 }, dl.bincount(x, 4):tolist())
    assert.same({ 1, 1, 0, 2, 0, 0, 0, 1 }, x:bincount(8):tolist())
    local w = dl.from_table({ { 0.5, 1, 2 }, { 4, 8, 16 } })
    assert.same({ 0.5, 8, 0, 3 }, dl.bincount(x, 4, { weights = w }):tolist())
    assert.equal("f64", dl.bincount(x, 4, { weights = w, dtype = "f64" }).dtype)
    assert.same({ 2 }, dl.bincount(dl.from_table({ 0, 0 }, "u8"), 1):tolist())
    assert.truthy(err_of(function() dl.bincount(w, 4) end):find("x must be i64, i32 or u8, got f32", 1, true))
    assert.truthy(err_of(function() dl.bincount(x, 4, { wieghts = w }) end)
      :find("unknown option wieghts (known: dtype, weights)", 1, true))
  end)
end)

describe("on meta", function()
  it("gives shapes and runs nothing", function()
    local x = dl.empty({ 4, 8 }, { dtype = "bf16", device = "meta" })
    local v, i = x:topk(2)
    assert.same({ 4, 2 }, v.shape)
    assert.equal("meta", i.device)
    assert.same({ 4, 8 }, x:softmax().shape)
    assert.same({ 3, 8 }, x:index_select(1, dl.empty(3, { dtype = "i64", device = "meta" })).shape)
    assert.same({ 8, 8 }, dl.cat({ x, x }).shape)
  end)
end)

describe("on cuda, against the cpu twins #gpu", function()
  local function both(t, dt) local c = dl.from_table(t):to(dt) return c, c:to("cuda") end

  it("softmax and log_softmax", function()
    local t = grid(37, 300)
    for _, dt in ipairs { "f32", "bf16", "f64" } do
      local c, g = both(t, dt)
      for _, dim in ipairs { 1, 2 } do
        assert.tensor_near(c:softmax(dim, { dtype = "f32" }), g:softmax(dim, { dtype = "f32" }):cpu(), 1e-6, 1e-5)
        assert.tensor_near(c:log_softmax(dim, { dtype = "f32" }), g:log_softmax(dim, { dtype = "f32" }):cpu(), 1e-5, 1e-5)
      end
    end
  end)

  it("sort, argsort and topk: the same permutation, long rows and many rows", function()
    for _, shape in ipairs { { 3, 100000 }, { 4096, 8 }, { 1, 1 } } do
      local t = grid(shape[1], shape[2], true, 5)
      for _, dt in ipairs { "f32", "bf16", "i64", "u8" } do
        local c, g = both(t, dt)
        for _, desc in ipairs { false, true } do
          assert.same(c:argsort({ descending = desc }):tolist(), g:argsort({ descending = desc }):cpu():tolist())
        end
        local k = math.min(4, shape[2])
        local cv, ci = c:topk(k)
        local gv, gi = g:topk(k)
        assert.same(ci:tolist(), gi:cpu():tolist())
        assert.equal(cv:bytes(), gv:bytes())
        assert.same(c:argsort({ dim = 1 }):tolist(), g:argsort({ dim = 1 }):cpu():tolist())
      end
    end
  end)

  it("gather, scatter_add, bincount, and out-of-range indices", function()
    local t = grid(64, 33)
    local c, g = both(t, "f32")
    local idx = dl.from_table(grid(64, 33, true, 7), "i64"):add_(2)
    assert.equal(c:gather(2, idx):bytes(), g:gather(2, idx:cuda()):bytes())
    for _, dt in ipairs { "f32", "f64", "bf16", "i32", "i64", "u8" } do
      local src = dl.from_table(grid(64, 33, true, 8)):add_(3):to(dt)
      local a = dl.zeros({ 5, 33 }, dt):scatter_add_(1, idx, src)
      local b = dl.zeros({ 5, 33 }, { dtype = dt, device = "cuda" }):scatter_add_(1, idx:cuda(), src:cuda())
      assert.tensor_near(a, b:cpu(), dt == "bf16" and 2 or 0, dt == "bf16" and 2e-2 or 0)
    end
    assert.same(dl.bincount(idx, 5):tolist(), dl.bincount(idx:cuda(), 5):cpu():tolist())
    local e = err_of(function() g:gather(2, dl.from_table({ { 0, 40 } }, { dtype = "i64", device = "cuda" })) end)
    assert.truthy(e:find("index 40 at position 1", 1, true), e)
  end)
end)
