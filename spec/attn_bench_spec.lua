-- attn_bench's table against FlashAttention-4 and cuDNN, assembled from CSVs (--measured, --torch) on the cpu
-- device: issue 52's target is 1.0x the faster anchor at s >= 8k and 0.95x at 4k for d 128, 0.95x at every s
-- for other head dims (a d 64 table once held d 64 to d 128's rule and printed 0 of 8 for 3 shapes that met it).
local H = require "helpers"

local B, NH = 2, 16

-- our CSV and one anchor run's, fa4 only: at each s ours runs at `ratio` of FA4's speed, forward and backward;
-- hkv, tkv: the kv heads each CSV says (nil: no h_kv column, as the CSVs before --gqa)
local function write_csvs(dir, d, ratio, hkv, tkv)
  local ours = assert(io.open(dir .. "/attn-distlab.csv", "w"))
  local torch = assert(io.open(dir .. "/torch.csv", "w"))
  ours:write("impl,layout,mask,s,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,check,rel_err" ..
    (hkv and ",h_kv" or "") .. "\n")
  torch:write("impl,layout,mask,s,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,check," ..
    (tkv and "h_kv," or "") .. "torch\n")
  for _, s in ipairs { 4096, 8192 } do
    local flops = 4 * B * NH * s * s * d
    local fm, bm = 1.0, 2.0 -- FA4's ms
    local tf, tb = flops / fm / 1e9, 2.5 * flops / bm / 1e9
    torch:write(string.format("fa4,bshd,none,%d,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,ok,%s\"torch t\"\n", s, fm, bm, fm + bm,
      tf, tb, 3.5 * flops / (fm + bm) / 1e9, tkv and tkv .. "," or ""))
    ours:write(string.format("distlab,bshd,none,%d,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,ok,1.0e-03%s\n", s, fm / ratio,
      bm / ratio, (fm + bm) / ratio, tf * ratio, tb * ratio, 3.5 * flops / (fm + bm) / 1e9 * ratio,
      hkv and "," .. hkv or ""))
  end
  ours:close()
  torch:close()
end

local function table_rows(dir, d, ratio, gqa, hkv, tkv)
  write_csvs(dir, d, ratio, hkv, tkv)
  local rc, log = H.distlab(string.format("run -n 1 --device cpu experiments/attn/attn_bench.lua --s 4096,8192 " ..
    "--d %d --gqa %d --backends ours --measured %s/attn-distlab.csv --torch %s/torch.csv --out %s/out --tag t", d,
    gqa or 1, dir, dir, dir))
  assert.equal(0, rc, log)
  local md = assert(io.open(dir .. "/out/attn-t.md")):read("*a")
  local got = {}
  for s, target in md:gmatch("\n| bshd | none | (%d+) | [^\n]-| ([a-z]+) | [^|\n]* | [^|\n]* |") do got[tonumber(s)] = target end
  return got, md
end

describe("attn_bench's target against the faster anchor (issue 52)", function()
  it("d 128 needs 1.0x at 8k and 0.95x at 4k; d 64 needs 0.95x at every s", function()
    local dir = H.tmpname("")
    os.execute("mkdir -p " .. dir)
    local got, md = table_rows(dir, 128, 0.97)
    assert.same({ [4096] = "met", [8192] = "below" }, got, md)
    assert.truthy(md:find("target (issue 52): >= 1.0x the faster of FA4 and cuDNN forward and backward at s >= 8k", 1, true), md)
    got, md = table_rows(dir, 64, 0.97)
    assert.same({ [4096] = "met", [8192] = "met" }, got, md)
    assert.truthy(md:find("at every s (d 64)", 1, true), md)
    assert.truthy(md:find("Target (issue 52) met at 2 of 2 shapes.", 1, true), md)
    -- 2% under the line fails at either head dim
    got, md = table_rows(dir, 64, 0.93)
    assert.same({ [4096] = "below", [8192] = "below" }, got, md)
    got, md = table_rows(dir, 128, 0.93)
    assert.same({ [4096] = "below", [8192] = "below" }, got, md)
    os.execute("rm -rf " .. dir)
  end)
end)

describe("attn_bench --gqa", function()
  it("assembles GQA rows from CSVs of the same kv heads, and refuses CSVs of other kv heads", function()
    local dir = H.tmpname("")
    os.execute("mkdir -p " .. dir)
    local got, md = table_rows(dir, 128, 1.01, 4, 4, 4)
    assert.same({ [4096] = "met", [8192] = "met" }, got, md)
    assert.truthy(md:find("GQA 4:1 (16 query heads, 4 kv heads) on every side", 1, true), md)
    -- MHA CSVs (h_kv 16 in the column, or no column at all, as written before --gqa) under --gqa 4: refused
    for _, case in ipairs { { 4, 16 }, { 4, false }, { 16, 4 } } do
      write_csvs(dir, 128, 1.01, case[1], case[2] or nil)
      local rc, log = H.distlab(string.format("run -n 1 --device cpu experiments/attn/attn_bench.lua --s 4096,8192 " ..
        "--d 128 --gqa 4 --backends ours --measured %s/attn-distlab.csv --torch %s/torch.csv --out %s/out --tag t",
        dir, dir, dir))
      assert.are_not.equal(0, rc, log)
      assert.truthy(log:find("kv heads, this run has 4 (--gqa 4)", 1, true), log)
    end
    -- and the MHA table still takes the CSVs without the column
    got = table_rows(dir, 128, 1.01)
    assert.same({ [4096] = "met", [8192] = "met" }, got)
    os.execute("rm -rf " .. dir)
  end)
end)

describe("attn_bench with an erratic anchor run", function()
  -- a second anchor run whose FA4 times are those of torch.csv over `slow` (runs: torch.csv, torch2.csv)
  local function second_run(dir, slow)
    local out = {}
    for line in io.lines(dir .. "/torch.csv") do
      local impl, lay, mask, s, fm, bm, rest = line:match("^(fa4),([^,]+),([^,]+),(%d+),([^,]+),([^,]+),[^,]+,(.*)$")
      if impl then
        fm, bm = tonumber(fm) * slow, tonumber(bm) * slow
        local flops = 4 * B * NH * tonumber(s) * tonumber(s) * 64
        local tf, tb, tt = flops / fm / 1e9, 2.5 * flops / bm / 1e9, 3.5 * flops / (fm + bm) / 1e9
        rest = rest:gsub("^[^,]+,[^,]+,[^,]+", string.format("%.2f,%.2f,%.2f", tf, tb, tt))
        line = string.format("%s,%s,%s,%s,%.4f,%.4f,%.4f,%s", impl, lay, mask, s, fm, bm, fm + bm, rest)
      end
      out[#out + 1] = line
    end
    local f = assert(io.open(dir .. "/torch2.csv", "w"))
    f:write(table.concat(out, "\n") .. "\n")
    f:close()
  end
  local function assemble(dir)
    local rc, log = H.distlab(string.format("run -n 1 --device cpu experiments/attn/attn_bench.lua --s 4096,8192 " ..
      "--d 64 --backends ours --measured %s/attn-distlab.csv --torch %s/torch.csv,%s/torch2.csv --out %s/out --tag t",
      dir, dir, dir, dir))
    assert.equal(0, rc, log)
    local md = assert(io.open(dir .. "/out/attn-t.md")):read("*a")
    local got = {}
    for s, f4, target in md:gmatch("\n| bshd | none | (%d+) | [^|]+ | [^|]+ | ([^|]+) | [^\n]-| ([a-z]+) | [^|\n]* | [^|\n]* |") do
      got[tonumber(s)] = { f4, target }
    end
    return got, md
  end
  it("takes the anchor's faster run where its runs differ by more than 5%, marked, and its mean otherwise", function()
    local dir = H.tmpname("")
    os.execute("mkdir -p " .. dir)
    -- ours at 0.94x FA4's faster run, whose other run is 1.3x slower: the mean (0.82x the faster) would read ours at
    -- 1.08x and "met"; the faster run reads 0.94x, below d 64's 0.95
    write_csvs(dir, 64, 0.94)
    second_run(dir, 1.3)
    local got, md = assemble(dir)
    assert.same("below", got[4096][2], md)
    assert.same("below", got[8192][2], md)
    assert.truthy(got[4096][1]:find("%*$"), md)
    assert.truthy(md:find("* 4 anchor figures above from the fastest of the call's runs, not their mean", 1, true), md)
    -- runs 3% apart: the mean, unmarked (ours 0.97x the faster run, ~0.985x the mean: met)
    write_csvs(dir, 64, 0.97)
    second_run(dir, 1.03)
    got, md = assemble(dir)
    assert.same("met", got[4096][2], md)
    assert.falsy(got[4096][1]:find("*", 1, true), md)
    assert.falsy(md:find("from the fastest of the call's runs", 1, true), md)
    os.execute("rm -rf " .. dir)
  end)
end)
