-- Every bench checks what it timed (distlab.bench.verify, issue 49): each
-- file under experiments/ runs on the cpu at its smallest case (--quick, into
-- a temporary --out) three ways: clean (exit code 0), --plant noop and
-- --plant scale=0.01 (the timed op writes nothing / 1% too much: the run must
-- end non-zero with a data check's message, not a crash). The benches are
-- found by a glob, so a new one is covered without a line here; what the
-- lists below say about a bench is all this spec knows of it. Before them,
-- the checking functions themselves.
local dl = require "distlab"
local H = require "helpers"
local R = require "gemm_ref"
local verify = require "distlab.bench.verify"

-- How a bench runs here, where not the default: 2 cpu ranks for a bench
-- that makes a communicator (dl.comm.world), else one cpu process.
local LAUNCH = {
  ["experiments/cp/cp_memory.lua"] = "--device meta",
  ["experiments/ep/ep_memory.lua"] = "--device meta",
  ["experiments/cp/cp_cudnn_memory.lua"] = "--device meta --world 2 --rank 0",
}

-- Benches that run no op where they run (a count of bytes on meta): no data
-- to check, nothing to plant into. Each must say so (h:unchecked(reason):
-- "NAME: checks no data: REASON") and exit 0 under --plant as well.
local EXEMPT = {
  ["experiments/cp/cp_memory.lua"] = "counts the schedules' bytes on meta: nothing runs",
  ["experiments/ep/ep_memory.lua"] = "counts the EP buffer's bytes on meta: nothing runs",
  ["experiments/cp/cp_cudnn_memory.lua"] = "counts cuDNN's workspace on meta by its formula: nothing runs",
  ["experiments/attn/cudnn_pick.lua"] = "times cuDNN, which runs on cuda only: on the cpu nothing is timed",
}

-- Further modes of a bench, each run the three ways too.
local MODES = {
  ["experiments/overlap/ag_gemm_bench.lua"] = { "--op gemm_rs" },
}

-- Files under experiments/ that are not benches (helpers a bench loads).
local NOT_BENCHES = {
  ["experiments/block/configs.lua"] = true, -- block.lua's shapes and options
  ["experiments/block/layer.lua"] = true, -- block.lua's algorithm
  ["experiments/block/ops.lua"] = true, -- block.lua's communication
  ["experiments/faults/soak_ops.lua"] = true, -- soak.lua's kinds of op
  ["experiments/faults/ep_death.lua"] = true, -- a fault trial's rank script (ep_deaths.sh): times nothing
  ["experiments/faults/overlap_exit.lua"] = true, -- a fault trial's rank script (overlap_exit.sh): times nothing
  ["experiments/lab/attn/bwd_trace.lua"] = true, -- the lab trace's driver: backward calls for a traced build's sums; times nothing
}

local sh = H.sh

local function benches()
  local p = io.popen("cd " .. sh(H.root) .. " && find experiments -name '*.lua' -type f | LC_ALL=C sort")
  local list = {}
  for path in p:read("*a"):gmatch("[^\n]+") do
    if not NOT_BENCHES[path] then list[#list + 1] = path end
  end
  p:close()
  return list
end

local function launch(path)
  if LAUNCH[path] then return LAUNCH[path] end
  local f = assert(io.open(H.root .. "/" .. path, "r"))
  local src = f:read("*a")
  f:close()
  return src:find("comm.world(", 1, true) and "-n 2 --device cpu" or "--device cpu"
end

-- rc, output of one run at --quick into a fresh folder
local function run(path, args)
  local dir = H.tmpname("-plant")
  local rc, out = H.distlab(string.format("run %s %s --quick --out %s %s", launch(path), path, sh(dir), args),
    "DISTLAB_JOB_TIMEOUT=120")
  os.execute("rm -rf " .. sh(dir))
  return rc, out
end

-- the last lines of a run's output, for a failure message
local function tail(out)
  local lines = {}
  for l in out:gmatch("[^\n]*") do lines[#lines + 1] = l end
  return table.concat(lines, "\n", math.max(1, #lines - 40))
end

describe("bench verify", function()
  it("close counts elements, the normwise error and the bias, and says what it found", function()
    local ref = dl.randn({ 4096 }, { dtype = "f64", device = "cpu", seed = 5 })
    local got = ref:clone()
    local n, msg, st = verify.close(got, ref, { norm = 1e-3, bias = 1e-3 })
    assert.equal(0, n, msg)
    assert.equal(0, st.norm)
    assert.matches("4096 elements", msg)
    -- 1% too much: every element (rtol 1e-3), the norm and the bias
    got:mul_(1.01)
    n, msg, st = verify.close(got, ref, { rtol = 1e-3, norm = 5e-3, bias = 1e-3 })
    assert.equal(4096 + 2, n, msg)
    assert.is_true(math.abs(st.bias - 0.01) < 1e-9, tostring(st.bias))
    assert.matches("normwise 0%.01 %(bound 0%.005%), bias 0%.01 %(bound 0%.001%)", msg)
    assert.matches("first at element 0", msg)
    -- unbiased noise of the same size passes the bias, not the norm
    got = ref:clone():add_(dl.randn({ 4096 }, { dtype = "f64", device = "cpu", seed = 6 }):mul_(0.01))
    n, msg, st = verify.close(got, ref, { atol = 1, norm = 5e-3, bias = 1e-3 })
    assert.equal(1, n, msg)
    assert.is_true(math.abs(st.bias) < 1e-3)
    -- NaN counts, and atol_rms is relative to the reference's rms
    got = ref:clone()
    got:narrow(1, 7, 3):fill_(0 / 0)
    n, msg = verify.close(got, ref, { atol_rms = 1 })
    assert.equal(3, n, msg)
    assert.matches("first at element 6: got nan", msg)
    -- per-element allowances
    got = ref:clone():add_(0.5)
    local allow = dl.full({ 4096 }, 0.25, { dtype = "f64", device = "cpu" })
    allow:narrow(1, 1, 100):fill_(1)
    n, msg = verify.close(got, ref, { allow = allow })
    assert.equal(3996, n, msg)
  end)

  it("checks the bias only from BIAS_MIN elements, where rounding's own is small", function()
    local ref = dl.full({ 8 }, 1, { dtype = "f64", device = "cpu" })
    local got = ref:clone():mul_(1.01)
    assert.equal(0, (verify.close(got, ref, { rtol = 0.02, bias = 1e-3 })))
    assert.equal(1024, verify.BIAS_MIN)
  end)

  it("judges the bias of rows (tol.rows) against the rows' own scatter, never below tol.bias", function()
    -- rows of 128 whose errors lie along the row: row g is ref_g * (1 + s_g), s_g = +-1%
    local function rows_case(nrows, scale)
      local ref = dl.randn({ nrows * 128 }, { dtype = "f64", device = "cpu", seed = 11 })
      local got = ref:clone()
      for g = 0, nrows - 1 do got:narrow(1, g * 128 + 1, 128):mul_((1 + (g % 2 == 0 and 0.01 or -0.01)) * scale) end
      return got, ref
    end
    local tol = { atol = 1, bias = 4e-3, rows = 128 }
    -- 8 rows: the per-row noise alone can show as a bias; the bound widens to 6 standard errors
    local got, ref = rows_case(8, 1)
    got:narrow(1, 1, 128):mul_(1.01) -- one row further off: a bias of about 1.2e-3 from 8 rows
    local n, msg, st = verify.close(got, ref, { atol = 1, bias = 1e-3, rows = 128 })
    assert.equal(0, n, msg)
    assert.is_true(st.bias > 1e-3 and st.bias_bound > st.bias, msg)
    assert.matches("bound [%d.e-]+ = max%(0%.001, 6 se over 8 rows%)", msg)
    -- the same rows as elements (no tol.rows): 1024 elements, bound 1e-3, fails
    assert.equal(1, (verify.close(got, ref, { atol = 1, bias = 1e-3 })))
    -- a 2% scale error moves every row alike and adds no scatter: beside rows +-1% apart it
    -- fails from 32 rows (at 8, 6 se of that scatter is 2.2%: too few to tell; the soak's CP
    -- check takes 32 a rank on cuda)
    for _, nrows in ipairs { 32, 256 } do
      got, ref = rows_case(nrows, 1.02)
      n, msg, st = verify.close(got, ref, tol)
      assert.equal(1, n, msg)
      assert.is_true(st.bias_bound < 0.02, msg)
    end
    -- many rows: se is small, the bound is tol.bias itself
    got, ref = rows_case(256, 1)
    n, msg, st = verify.close(got, ref, tol)
    assert.equal(0, n, msg)
    assert.equal(4e-3, st.bias_bound)
    -- fewer than BIAS_MIN_ROWS rows (of BIAS_MIN elements or more): reported, not judged
    ref = dl.randn({ 4 * 512 }, { dtype = "f64", device = "cpu", seed = 12 })
    n, msg = verify.close(ref:clone():mul_(1.02), ref, { atol = 1, bias = 4e-3, rows = 512 })
    assert.equal(0, n, msg)
    assert.matches("not judged: 4 rows", msg)
    assert.equal(8, verify.BIAS_MIN_ROWS)
    assert.has_error(function() verify.close(ref, ref, { bias = 1e-3, rows = 3 }) end, "verify.close: 2048 elements are not rows of 3")
  end)

  it("spreads indices and windows over all of a range, and takes them from a tensor", function()
    local idx = verify.spread(1000, 10, 3)
    assert.equal(10, #idx)
    for i, x in ipairs(idx) do assert.is_true(x >= (i - 1) * 100 and x < i * 100) end
    assert.same({ 0, 1, 2 }, verify.spread(3, 10))
    assert.same({ { 0, 50 } }, verify.windows(50, 100, 10))
    local wins = verify.windows(100000, 4096, 256, 7)
    assert.equal(16, #wins)
    for i, w in ipairs(wins) do
      assert.equal(256, w[2])
      assert.is_true(w[1] >= (i - 1) * 6250 and w[1] + w[2] <= i * 6250)
    end
    local t = dl.empty({ 100 }, { dtype = "bf16", device = "cpu" })
    t:normal_(0, 1, 77)
    local w2 = verify.windows(100, 20, 5, 1)
    local took = verify.take(t:view(10, 10), w2)
    assert.equal(20, took:numel())
    -- what normal_ put there, drawn again on the host
    for i, w in ipairs(w2) do
      assert.equal(0, (verify.close(took:narrow(1, (i - 1) * 5 + 1, 5), verify.normal("bf16", 77, w[1], w[2]))))
    end
    local s = dl.empty({ 100 }, { dtype = "bf16", device = "cpu" })
    s:normal_(0, 1, 78)
    local sum = verify.normal_sum("bf16", { 77, 78 }, { { 10, 4 } })
    assert.equal(0, (verify.close(sum, t:narrow(1, 11, 4):f64():add_(s:narrow(1, 11, 4):f64()))))
  end)

  it("matmul_rows is the fp64 product, its per-slice sums S and rms", function()
    local a = dl.randn({ 6, 12 }, { dtype = "bf16", device = "cpu", seed = 1 })
    local b = dl.randn({ 12, 5 }, { dtype = "bf16", device = "cpu", seed = 2 })
    local want = R.matmul(a, b)
    local ref = verify.matmul_rows(a, b, { 2, 6 })
    assert.tensor_near(want:narrow(1, 2, 1), ref:narrow(1, 1, 1), 1e-12)
    assert.tensor_near(want:narrow(1, 6, 1), ref:narrow(1, 2, 1), 1e-12)
    local ref3, S, rms = verify.matmul_rows(a, b, { 3 }, { parts = 3 })
    assert.tensor_near(want:narrow(1, 3, 1), ref3, 1e-12)
    local s, r = {}, 0
    for p = 0, 2 do
      local P = R.matmul(a:narrow(1, 3, 1):narrow(2, 4 * p + 1, 4), b:narrow(1, 4 * p + 1, 4)):tolist()[1]
      local sq = 0
      for j, x in ipairs(P) do
        s[j] = (s[j] or 0) + math.abs(x)
        sq = sq + x * x
      end
      r = r + math.sqrt(sq / #P)
    end
    assert.tensor_near(dl.from_table({ s }, { dtype = "f64" }), S, 1e-12)
    assert.is_true(math.abs(rms[1] - r) < 1e-12)
  end)

  it("a verification run poisons its output first and what it returned once checked", function()
    local out = dl.zeros({ 4 }, { device = "cpu" })
    local made
    local seen
    local n = verify.run({ fresh = function() end, poison = { out },
      run = function()
        seen = out:tolist()[1]
        made = dl.full({ 3 }, 2, { device = "cpu" })
        return made
      end,
      check = function(t) return t:tolist()[1] == 2 and 0 or 1 end })
    assert.equal(0, n)
    assert.is_true(seen ~= seen) -- NaN: poisoned before the run
    assert.is_true(made:tolist()[1] ~= made:tolist()[1]) -- and the returned tensor after its check
    verify.run({ fresh = function() end, keep = true, run = function()
      made = dl.full({ 3 }, 2, { device = "cpu" })
      return made
    end, check = function() return 0 end })
    assert.same({ 2, 2, 2 }, made:tolist())
  end)

  it("plants noop and scale into a callable that writes or returns its outputs", function()
    local out = dl.zeros({ 4 }, { device = "cpu" })
    local fn = function() out:fill_(2) end
    assert.equal(fn, verify.planted(fn, nil, { writes = { out } }))
    verify.planted(fn, verify.parse_plant("noop"), { writes = { out } })()
    assert.same({ 0, 0, 0, 0 }, out:tolist())
    verify.planted(fn, verify.parse_plant("scale=0.5"), { writes = { out } })()
    assert.same({ 3, 3, 3, 3 }, out:tolist())
    local ret = function() return dl.full({ 2 }, 4, { device = "cpu" }), 7 end
    local t, x = verify.planted(ret, verify.parse_plant("noop"), { returns = true })()
    assert.equal(7, x)
    assert.is_true(t:tolist()[1] ~= t:tolist()[1])
    t = verify.planted(ret, verify.parse_plant("scale=0.25"), { returns = true })()
    assert.same({ 5, 5 }, t:tolist())
    assert.has_error(function() verify.planted(fn, verify.parse_plant("noop")) end)
    assert.has_error(function() verify.parse_plant("scale=0") end)
    assert.has_error(function() verify.parse_plant("zero") end)
    for dtype, v in pairs { u8 = 255, i32 = -2147483648, f32 = 0 / 0 } do
      local p = verify.poison(dl.zeros({ 2 }, { dtype = dtype, device = "cpu" })):tolist()[1]
      if v == v then assert.equal(v, p) else assert.is_true(p ~= p) end
    end
  end)
end)

describe("every bench under experiments/ on the cpu at --quick", function()
  for _, path in ipairs(benches()) do
    for _, mode in ipairs({ "", unpack(MODES[path] or {}) }) do
      local name = path .. (mode ~= "" and (" " .. mode) or "")
      local exempt = EXEMPT[path]
      it(name .. ": clean, exit code 0", function()
        local rc, out = run(path, mode)
        assert.equal(0, rc, tail(out))
        if exempt then
          assert.truthy(out:find("checks no data", 1, true), "an exempt bench says so: h:unchecked(reason) " ..
            "(distlab.bench.harness) prints \"NAME: checks no data: REASON\"\n" .. tail(out))
        end
      end)
      for _, plant in ipairs({ "noop", "scale=0.01" }) do
        if exempt then
          it(name .. ": --plant " .. plant .. " has nothing to go into (" .. exempt .. ")", function()
            local rc, out = run(path, mode .. " --plant " .. plant)
            assert.equal(0, rc, tail(out))
            assert.truthy(out:find("has nothing to go into", 1, true), "an exempt bench says so: h:unchecked(reason) " ..
              "(distlab.bench.harness) says under --plant that it has nothing to go into\n" .. tail(out))
          end)
        else
          it(name .. ": --plant " .. plant .. " fails its data check", function()
            local rc, out = run(path, mode .. " --plant " .. plant)
            assert.is_nil(out:find("has nothing to go into", 1, true), "the bench says it checks no data here: " ..
              "list it in EXEMPT (spec/bench_plant_spec.lua) with the reason, or let it check its op\n" .. tail(out))
            assert.is_true(rc ~= 0 and rc ~= 2, "exit code " .. tostring(rc) .. "\n" .. tail(out))
            assert.truthy(out:find("data check failed", 1, true), tail(out))
            assert.is_nil(out:find("stack traceback", 1, true), tail(out))
          end)
        end
      end
    end
  end
end)
