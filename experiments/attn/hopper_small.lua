-- experiments/attn/hopper_small.lua — dl.attn's forward and backward at small
-- shapes beyond a tile (bshd causal and not (GQA 4:1), sbhd with a window, GQA, thd with
-- offsets and gaps, causal and not; d 64 and 128, bf16), each checked in full against fp64
-- on the host (distlab.bench.attn_rows with all rows: out, lse, dq, dk, dv
-- over every row, normwise <= 8e-3 (lse 1e-5), bias 2^-10 and
-- TransformerEngine's bf16 tolerance element-wise; thd rows outside the sequences must be 0), after
-- printing which kernels dl.attn.backends says run; and the fused merge into fp32 and bf16 running rows
-- (bshd and thd causal; merge_case below); on cuda no-mask cases that the backward's tail split splits (bshd, and
-- thd of equal packed lengths).
-- Nothing is timed: each
-- case runs once, on fresh inputs, through h:planted (--plant noop |
-- scale=X must fail it). Small enough for compute-sanitizer
-- (scripts/gpu/attn_hopper.sh runs it under memcheck and racecheck).
-- --quick: the d 64 cases only; --case TEXT: the cases whose names hold TEXT (a slower sanitizer's run of one
-- case; a TEXT that names none is an error). Exit code 1 on a mismatch.
--   ./distlab run -n 1 --device cuda experiments/attn/hopper_small.lua [--quick] [--case TEXT]
local dl = require "distlab"
local rows_ref = require "distlab.bench.attn_rows"

local h = dl.bench.harness {
  name = "hopper_small", family = "attn", writes = false,
  usage = "./distlab run -n 1 --device cuda experiments/attn/hopper_small.lua [--quick] [--case TEXT]",
  options = { { "case", "string", nil, "only the cases whose names hold this text (plain text, not a pattern)" } },
  about = "dl.attn fwd + bwd at small shapes (d 64, 128) against fp64 in full; see the file's header",
}
-- a line at a time, also into a file: where a run hangs or is killed (a sanitizer's limit), its log ends
-- at the last case that finished
io.stdout:setvbuf("line")
local dev = dl.default_device()
local failed, ncase, nrun = 0, 0, 0
-- whether --case leaves the case out (its seed is drawn either way, so a case's inputs do not depend on it)
local function left_out(name) return h.opt.case ~= nil and not name:find(h.opt.case, 1, true) end

local function input(shape, seed) return dl.randn(shape, { dtype = "bf16", seed = seed, device = "cpu" }):to(dev) end

-- opts with its tensors (thd's offsets) on the device
local function on_dev(opts)
  local g = {}
  for key, val in pairs(opts) do g[key] = dl.is_tensor(val) and val:to(dev) or val end
  return g
end
-- a case's line: what dl.attn.backends says runs (bwd_why where the case runs the backward), the verdict
local function report(name, b, wrong, bwd)
  print(string.format("%-44s fwd: %s%s | %s", name, b.fwd_why:match("kernel: (.*)$") or b.fwd_why,
    bwd and (" | bwd: " .. (b.bwd_why:match("kernel: (.*)$") or b.bwd_why)) or "",
    wrong == 0 and "ok" or string.format("WRONG (%d)", wrong)))
  if wrong > 0 then failed = failed + 1 end
end

local function case(name, shape_q, shape_kv, opts)
  ncase = ncase + 1
  local seed = ncase
  if left_out(name) then return end
  nrun = nrun + 1
  local g = on_dev(opts)
  local x = {}
  local run = h:planted(function()
    local out, lse = dl.attn.fwd(x.q, x.k, x.v, g)
    local dq, dk, dv = dl.attn.bwd(x.dout, x.q, x.k, x.v, out, lse, g)
    return out, lse, dq, dk, dv
  end, { returns = true })
  local function draw(base)
    x.q, x.k, x.v = input(shape_q, base + 1), input(shape_kv, base + 2), input(shape_kv, base + 3)
    local dv_shape = { unpack(shape_q) }
    dv_shape[#dv_shape] = shape_kv[#shape_kv]
    x.dout = input(dv_shape, base + 4)
  end
  draw(seed * 8)
  local b = dl.attn.backends(x.q, x.k, x.v, g)
  local wrong = h:verify {
    what = name,
    fresh = function() draw(seed * 8 + 4) end,
    run = run,
    check = function(out, lse, dq, dk, dv)
      local R = rows_ref.prepare { q = x.q, k = x.k, v = x.v, dout = x.dout, opts = g, all = true }
      return R:check { out = out, lse = lse, dq = dq, dk = dk, dv = dv }
    end,
  }
  report(name, b, wrong, true)
end

-- The fused merge (opts.accumulate) into an fp32 or a bf16 running (out, lse): the running rows emptied (lse
-- -inf) over an out of 7.0 before each run, so that the merged rows must equal the step's own, checked in full
-- against fp64 as above (a merge that kept the old rows, or left a row unwritten, leaves 7.0). The bf16 one
-- takes the running rows in and out by TMA in the default loops (TMA_M), the fp32 one the copy warps'.
local function merge_case(name, shape_q, shape_kv, opts, adt)
  ncase = ncase + 1
  local seed = ncase
  if left_out(name) then return end
  nrun = nrun + 1
  local g = on_dev(opts)
  local x = {}
  local function draw(base) x.q, x.k, x.v = input(shape_q, base + 1), input(shape_kv, base + 2), input(shape_kv, base + 3) end
  draw(seed * 8)
  local acc = dl.attn.accumulator(x.q, x.v, { layout = g.layout, dtype = adt })
  local m = { accumulate = acc }
  for key, val in pairs(g) do m[key] = val end
  local run = h:planted(function() dl.attn.fwd(x.q, x.k, x.v, m) end, { writes = { acc.out, acc.lse } })
  local b = dl.attn.backends(x.q, x.k, x.v, m)
  local wrong = h:verify {
    what = name,
    fresh = function()
      draw(seed * 8 + 4)
      acc.out:fill_(7)
      acc.lse:fill_(-math.huge)
    end,
    run = run,
    check = function()
      local R = rows_ref.prepare { q = x.q, k = x.k, v = x.v, opts = g, all = true }
      return R:check { out = acc.out, lse = acc.lse }
    end,
  }
  report(name, b, wrong, false)
end

for _, d in ipairs(h.quick and { 64 } or { 128, 64 }) do
  case("bshd b=2 s=333 h=2 d=" .. d .. " causal", { 2, 333, 2, d }, { 2, 333, 2, d }, { mask = "causal" })
  case("bshd b=1 s=300/kv 200 h=4/2 d=" .. d .. " bottom-right", { 1, 300, 4, d }, { 1, 200, 2, d },
    { mask = "causal_bottom_right" })
  case("bshd b=1 s=211/kv 333 h=4/1 d=" .. d .. " no mask", { 1, 211, 4, d }, { 1, 333, 1, d }, {})
  case("sbhd s=257 b=2 h=2 d=" .. d .. " window (64, 16)", { 257, 2, 2, d }, { 257, 2, 2, d },
    { layout = "sbhd", window = { 64, 16 } })
  if tostring(dev):find("cuda") then
    -- the backward's tail split (tile_scheduler.cuh): 134 key blocks, 2 past 132 SMs, each in parts (16 at
    -- d 128, 8 at d 64), whose dK and dV the last part writes; small grids do not split (their split slots
    -- live in the workspace's lse log2(e) rows), so this case is about the smallest that does on an H200.
    -- On cuda only (the split is the Hopper kernel's): on the cpu it adds ~30 s of checks to CI's --quick run
    -- (there it passed, and failed --plant scale=1.02)
    case("bshd b=1 s=256 h=268/67 d=" .. d .. " no mask, split", { 1, 256, 268, d }, { 1, 256, 67, d }, {})
    -- thd of equal packed lengths splits too (attn_hopper.cu's bwd_uniform): 2 sequences of 192, each 2 key
    -- blocks (the second partial) a kv head, 136 key blocks, 4 past 132 SMs
    local cs = dl.from_table({ 0, 192, 384 }, { dtype = "i32", device = "cpu" })
    case("thd 192,192 h=136/34 d=" .. d .. " no mask, split", { 384, 136, d }, { 384, 34, d },
      { layout = "thd", cu_seqlens_q = cs, cu_seqlens_kv = cs, max_seqlen_q = 192, max_seqlen_kv = 192 })
  end
  local cu = dl.from_table({ 0, 130, 130, 207 }, { dtype = "i32", device = "cpu" })
  local pad = dl.from_table({ 5, 140, 141, 220 }, { dtype = "i32", device = "cpu" })
  case("thd 130,0,77 at 5,140,141 h=2 d=" .. d .. " causal", { 224, 2, d }, { 224, 2, d },
    { layout = "thd", mask = "causal", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = pad,
      cu_seqlens_kv_padded = pad, max_seqlen_q = 130, max_seqlen_kv = 130 })
  case("thd 130,0,77 at 5,140,141 h=2 d=" .. d .. " no mask", { 224, 2, d }, { 224, 2, d },
    { layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = pad,
      cu_seqlens_kv_padded = pad, max_seqlen_q = 130, max_seqlen_kv = 130 })
  local cm = dl.from_table({ 0, 130, 207 }, { dtype = "i32", device = "cpu" })
  for _, adt in ipairs({ "f32", "bf16" }) do
    merge_case("merge into " .. adt .. ": bshd b=2 s=333 h=2 d=" .. d .. " causal", { 2, 333, 2, d }, { 2, 333, 2, d },
      { mask = "causal" }, adt)
    merge_case("merge into " .. adt .. ": thd 130,77 h=2 d=" .. d .. " causal", { 207, 2, d }, { 207, 2, d },
      { layout = "thd", mask = "causal", cu_seqlens_q = cm, cu_seqlens_kv = cm, max_seqlen_q = 130, max_seqlen_kv = 130 },
      adt)
  end
end
if nrun == 0 then dl.fail("hopper_small: --case %q names none of the %d cases", h.opt.case, ncase) end
print(failed == 0 and "hopper_small: all ok" or ("hopper_small: " .. failed .. " cases WRONG"))
h:finish()
