-- Context-parallel attention (dl.cp): every schedule x layout x mask x
-- strategy against the single-rank reference on 1, 2 and 4 cpu ranks
-- (spec/cp/check.lua, many configs per launched job); the peak memory of
-- every schedule on meta equal to the formula written in its file, for CP
-- sizes up to 64; the errors that unsupported configurations give; and
-- the same rank scripts on 2 GPUs under #multigpu.
local dl = require "distlab"
local H = require "helpers"

local groups = { "p2p", "all_gather", "a2a", "extras" }

local run, comm_run = H.ranks("cp"), H.ranks("comm")
local function run_check(n, device, group) return run(n, device, "check.lua", group) end

local function count(out, pat)
  local _, k = out:gsub(pat, "")
  return k
end

describe("cp schedules on cpu against the single-rank reference", function()
  for _, n in ipairs({ 1, 2, 4 }) do
    for _, g in ipairs(groups) do
      it(string.format("%d rank%s: %s", n, n > 1 and "s" or "", g), function()
        H.ranks_ok(n, "cp check", run_check(n, "cpu", g))
      end)
    end
  end
end)

describe("cp schedules that differ across ranks", function()
  it("fail at creation on every rank, naming what differs (2 and 3 ranks)", function()
    for _, c in ipairs { { 2, "cp_mask", "causal=true vs causal=false" }, { 3, "cp_correction", "correction=fused vs correction=post_loop" } } do
      local rc, out = comm_run(c[1], "cpu", "mismatch.lua", c[2])
      assert.equal(0, rc, out)
      assert.falsy(out:find("NOERR", 1, true), out)
      assert.equal(c[1], count(out, "ERR: [^\n]*mismatched cp.attention options on comm 'w': rank %d has algo=p2p, [^\n]* but rank %d has algo=p2p"), out)
      local diff = c[3]:gsub("%p", "%%%0")
      assert.truthy(out:find("ERR: [^\n]*%(differs: " .. diff .. "%)"), out)
    end
  end)
end)

describe("cp schedules on GPUs #multigpu", function()
  for _, g in ipairs(groups) do
    it(H.gpu_ranks .. " ranks: " .. g, function()
      local out = H.ranks_ok(H.gpu_ranks, "cp check", run_check(H.gpu_ranks, "cuda", g))
      -- which backend ran (DISTLAB_CP_BACKEND) and what cuDNN refused, in the log
      for l in out:gmatch("[^\n]*cp check ok[^\n]*") do print(l) end
      for l in out:gmatch("refused by cudnn[^\n]*") do print(l) end
    end)
  end
end)

-- ---- memory on meta ---------------------------------------------------------------------

local shapes = H.cp_shapes

-- The named strategies (distlab.cp.presets), then the p2p combinations of
-- comm_buffers and every correction of p2p.lua's table that no preset names.
-- a2a overlap needs the heads per rank even: twice the heads.
local presets = require "distlab.cp.presets"
local strategies = {}
local function same(a, b)
  return a.algo == b.algo and a.comm_buffers == b.comm_buffers and a.correction == b.correction and a.dkv == b.dkv
    and a.overlap == b.overlap
end
for _, st in ipairs(presets.list) do
  local o = presets.options(st)
  if o.algo == "a2a" and o.overlap then o.heads = 2 end
  strategies[#strategies + 1] = o
end
for _, cb in ipairs({ "per_step", 2 }) do
  for _, corr in ipairs(dl.cp.corrections.library) do
    local o, named = { algo = "p2p", comm_buffers = cb, correction = corr }, false
    for _, st in ipairs(strategies) do named = named or same(st, o) end
    if not named then strategies[#strategies + 1] = o end
  end
end

local function label(st)
  return st.algo == "p2p" and string.format("p2p buffers=%s correction=%s dkv=%s", st.comm_buffers, st.correction,
    st.dkv or "travel") or st.algo .. (st.overlap and " overlap" or "")
end

-- Every (C, rank, layout, mask, heads) of one strategy; returns the mismatches.
local function sweep(st, what)
  local bad = {}
  for _, C in ipairs({ 1, 2, 3, 4, 8, 64 }) do
    local ranks = C <= 2 and { 0, C - 1 } or { 0, math.floor(C / 2), C - 1 }
    for ri, r in ipairs(ranks) do
      local comm = dl.comm.meta(C, r)
      local layouts = st.overlap and { "bshd", "sbhd" } or { "bshd", "sbhd", "thd" }
      for _, layout in ipairs(ri > 1 and r == ranks[ri - 1] and {} or layouts) do
        for _, mask in ipairs({ "causal", "none" }) do
          local hm = st.heads or 1
          for _, heads in ipairs({ { 2 * C * hm, 2 * C * hm }, { 2 * C * hm, C * hm } }) do
            local o = { comm = comm, layout = layout, mask = mask, return_max_logit = mask == "causal" }
            for k, v in pairs(st) do if k ~= "heads" then o[k] = v end end
            local cp = dl.cp.attention(o)
            local qs, kvs, seq = shapes(layout, C, heads[1], heads[2])
            local m = cp:memory(qs, kvs, kvs, { seq = seq })
            if m[what].peak ~= m.formula[what] then
              bad[#bad + 1] = string.format("C=%d r=%d %s %s h=%d/%d: measured %d, formula %d", C, r, layout, mask,
                heads[1], heads[2], m[what].peak, m.formula[what])
            end
            local left = dl.mem.stats("meta").allocated
            if left ~= 0 then bad[#bad + 1] = string.format("C=%d r=%d %s: %d bytes left allocated", C, r, layout, left) end
          end
        end
      end
      comm:free()
    end
  end
  return bad
end

describe("cp peak memory on meta equals each schedule's formula", function()
  for _, st in ipairs(strategies) do
    it(label(st) .. ": forward, C = 1..64, every layout and mask, MHA and GQA, uneven thd lengths", function()
      local bad = sweep(st, "fwd")
      assert.equal(0, #bad, table.concat(bad, "\n"))
    end)
    it(label(st) .. ": backward, same sweep", function()
      local bad = sweep(st, "bwd")
      assert.equal(0, #bad, table.concat(bad, "\n"))
    end)
  end

  it("fused p2p stays constant in C and at most 6 units above the inputs; main grows 3 units per rank", function()
    local main, fused = {}, {}
    for _, C in ipairs({ 4, 8, 16, 64 }) do
      local comm = dl.comm.meta(C, C - 1)
      local function units(o)
        o.comm, o.mask = comm, "causal"
        local m = dl.cp.attention(o):memory({ 2, 64, 16, 128 }, { 2, 64, 16, 128 }, { 2, 64, 16, 128 })
        return m.fwd.peak_units - 3
      end
      main[C] = units { algo = "p2p", comm_buffers = "per_step", correction = "post_loop" }
      fused[C] = units { algo = "p2p", comm_buffers = 2, correction = "fused" }
      comm:free()
    end
    assert.is_true(fused[4] <= 6, "fused: " .. fused[4])
    assert.equal(fused[4], fused[64])
    assert.near(3 * 60, main[64] - main[4], 1)
  end)
end)

-- ---- unsupported configurations --------------------------------------------------------

describe("cp refuses what it does not support, with a clear error", function()
  local comm = dl.comm.meta(4, 1)
  local function err(fn)
    local ok, e = pcall(fn)
    assert.is_false(ok)
    return tostring(e)
  end
  local function t(shape) return dl.empty(shape, { dtype = "bf16", device = "meta" }) end

  it("options", function()
    assert.matches("unknown option bogus", err(function() dl.cp.attention { comm = comm, bogus = 1 } end))
    assert.matches("algo = ring is not one of p2p, all_gather, a2a", err(function() dl.cp.attention { comm = comm, algo = "ring" } end))
    assert.matches("comm_buffers is an option of algo p2p, not a2a",
      err(function() dl.cp.attention { comm = comm, algo = "a2a", comm_buffers = 2 } end))
    assert.matches("correction = online is not one of", err(function() dl.cp.attention { comm = comm, correction = "online" } end))
    assert.matches("sliding windows are supported by algo all_gather and a2a, not p2p",
      err(function() dl.cp.attention { comm = comm, window = { 8, 0 } } end))
    assert.matches("contradicts a causal mask", err(function() dl.cp.attention { comm = comm, algo = "a2a", mask = "causal", window = { 8, 4 } } end))
    assert.matches("all_gather with thd takes windows {left, 0}",
      err(function() dl.cp.attention { comm = comm, algo = "all_gather", layout = "thd", window = { 8, 4 } } end))
    assert.matches("overlap is an option of algo all_gather and a2a, not p2p",
      err(function() dl.cp.attention { comm = comm, algo = "p2p", overlap = true } end))
    assert.matches("all_gather overlap takes bshd or sbhd, not thd",
      err(function() dl.cp.attention { comm = comm, algo = "all_gather", layout = "thd", overlap = true } end))
    assert.matches("all_gather overlap takes no window",
      err(function() dl.cp.attention { comm = comm, algo = "all_gather", window = { 4, 0 }, overlap = true } end))
    assert.matches("overlap must be true or false, got yes",
      err(function() dl.cp.attention { comm = comm, algo = "all_gather", overlap = "yes" } end))
  end)

  it("shapes: heads for a2a, lengths for the dual-chunk split", function()
    local a2a = dl.cp.attention { comm = comm, algo = "a2a" }
    local e = err(function() a2a:forward(t { 2, 8, 6, 32 }, t { 2, 8, 6, 32 }, t { 2, 8, 6, 32 }) end)
    assert.matches("cp a2a: heads %(q 6, k/v 6%) must be divisible by the CP size 4", e)
    assert.matches("cp_spec.lua", e) -- the error points at the caller's line
    local a2a_o = dl.cp.attention { comm = comm, algo = "a2a", overlap = true }
    assert.matches("cp a2a overlap: heads per rank %(q 3, k/v 3%) must be divisible by its 2 sub%-groups",
      err(function() a2a_o:forward(t { 2, 8, 12, 32 }, t { 2, 8, 12, 32 }, t { 2, 8, 12, 32 }) end))
    local p2p = dl.cp.attention { comm = comm }
    assert.matches("full length must be divisible by 2C = 8", err(function() p2p:forward(t { 2, 7, 4, 32 }, t { 2, 7, 4, 32 }, t { 2, 7, 4, 32 }) end))
    local thd = dl.cp.attention { comm = comm, layout = "thd" }
    local x = t { 4, 4, 32 }
    assert.matches("not a multiple of 2C = 8", err(function() thd:forward(x, x, x, { cu_seqlens_q = { 0, 5, 12 }, cu_seqlens_q_padded = { 0, 6, 16 } }) end))
    assert.matches("layout thd needs cu_seqlens_q", err(function() thd:forward(x, x, x) end))
    assert.matches("on meta, pass cu_seqlens as Lua tables", err(function()
      thd:forward(x, x, x, { cu_seqlens_q = dl.empty({ 3 }, { dtype = "i32", device = "meta" }) })
    end))
    assert.matches("needs the same sequences for q and kv", err(function()
      thd:forward(x, x, x, { cu_seqlens_q = { 0, 8, 16 }, cu_seqlens_kv = { 0, 4, 16 } })
    end))
    assert.matches("call cp:forward first", err(function() p2p:backward(t { 2, 8, 4, 32 }) end))
  end)

  it("shard and unshard check their arguments", function()
    assert.matches("not divisible by 2C = 8", err(function() dl.cp.shard(dl.empty({ 2, 12, 2, 8 }), { comm = comm }) end))
    assert.matches("needs cu_seqlens_padded", err(function() dl.cp.shard(dl.empty({ 16, 2, 8 }), { comm = comm, layout = "thd" }) end))
  end)
end)
