-- experiments/attn/attn_ab_report.py, the report of scripts/gpu/attn_ab.sh: on runs laid out as the script
-- lays them out (RUNS/d<D>-<variant>-r<round>/attn-distlab.csv and .md), the speed-ups over the first
-- variant in the same round, their ranges, and the failures: a missing run or a row whose check is not ok
-- makes it fail and is named, and no speed-up is read from such a row.
local dl = require "distlab"
local H = require "helpers"
local sh, run, read, write = H.sh, H.run, H.read, H.write

local HEAD = "impl,layout,mask,s,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,check,rel_err\n"

-- one run: rows {layout, mask, fwd_ms, bwd_ms, check}
local function put_run(dir, name, rows)
  os.execute("mkdir -p " .. sh(dir .. "/" .. name))
  local csv = HEAD
  for _, r in ipairs(rows) do
    csv = csv .. string.format("distlab,%s,%s,8192,%s,%s,1,1,1,1,%s,2.4e-03\n", r[1], r[2], r[3], r[4], r[5] or "ok")
  end
  write(dir .. "/" .. name .. "/attn-distlab.csv", csv)
  write(dir .. "/" .. name .. "/attn-distlab.md", "# x\n\n- date: d\n- commit: `" .. name .. "`\n- command: `c`\n")
end

describe("attn A/B report (experiments/attn/attn_ab_report.py)", function()
  local it_ = H.has_command("python3") and it or pending -- the report is Python
  local dir, script
  before_each(function()
    dir = H.tmpname("-ab")
    os.execute("mkdir -p " .. sh(dir))
    script = dl.root .. "/experiments/attn/attn_ab_report.py"
  end)
  after_each(function() os.execute("rm -rf " .. sh(dir)) end)

  local function report(variants)
    local rc, out = run("python3 " .. sh(script) .. " " .. sh(dir) .. " 128 " .. sh(variants) .. " " ..
      sh(dir .. "/ab.csv") .. " " .. sh(dir .. "/ab.md"))
    return rc, out, (io.open(dir .. "/ab.md") and read(dir .. "/ab.md") or "")
  end

  it_("sets each variant against the base of the same round and gives the ranges", function()
    for r = 1, 2 do
      put_run(dir, "d128-base-r" .. r, { { "bshd", "none", "2.0", "4.0" }, { "bshd", "causal", "1.0", "3.0" } })
      put_run(dir, "d128-fast-r" .. r, { { "bshd", "none", r == 1 and "1.6" or "1.0", "4.0" }, { "bshd", "causal", "1.0", "2.5" } })
    end
    local rc, out, md = report("base:main fast:lib:DISTLAB_X=1")
    assert.equal(0, rc, out)
    assert.truthy(md:find("| bshd | none | 8192 | 2.000, 2.000 | 4.000, 4.000 | 1.250, 1.000; 2.000, 1.000 |", 1, true), md)
    assert.truthy(md:find("| bshd | causal | 8192 | 1.000, 1.000 | 3.000, 3.000 | 1.000, 1.200; 1.000, 1.200 |", 1, true), md)
    assert.truthy(md:find("- fast: forward 1.000-2.000; backward without a mask 1.000-1.000, causal 1.200-1.200", 1, true), md)
    assert.truthy(md:find("8 of 8 rows ok", 1, true), md)
    assert.is_nil(md:find("## Failed", 1, true))
    local csv = read(dir .. "/ab.csv")
    assert.truthy(csv:find("^d,variant,round,impl,layout"), csv)
    assert.equal(8, select(2, csv:gsub("\n128,", "")))
  end)

  it_("fails on a missing run and on a row whose check is not ok, and reads no speed-up from either", function()
    put_run(dir, "d128-base-r1", { { "bshd", "none", "2.0", "4.0" } })
    put_run(dir, "d128-base-r2", { { "bshd", "none", "2.0", "4.0" } })
    put_run(dir, "d128-slow-r1", { { "bshd", "none", "1.0", "2.0", "FAIL" } }) -- a planted failure
    local rc, out, md = report("base:main slow:lib")
    assert.equal(1, rc, out)
    assert.truthy(md:find("- d128-slow-r2: no attn-distlab.csv", 1, true), md)
    assert.truthy(md:find("- d128-slow-r1 bshd none s 8192: check FAIL", 1, true), md)
    assert.truthy(md:find("| bshd | none | 8192 | 2.000, 2.000 | 4.000, 4.000 | —, —; —, — |", 1, true), md)
    assert.truthy(md:find("2 of 3 rows ok", 1, true), md)
  end)

  it_("refuses fewer than two variants or a name twice", function()
    local rc, out = report("base:main")
    assert.is_true(rc ~= 0)
    assert.truthy(out:find("two or more distinct names", 1, true), out)
    rc, out = report("a:x a:y")
    assert.truthy(out:find("two or more distinct names", 1, true), out)
  end)
end)
