-- experiments/attn/hopper_small.lua — dl.attn's forward and backward at small
-- shapes beyond a tile (bshd causal and not, sbhd with a window, GQA, thd with
-- offsets and gaps; d 64 and 128, bf16), each against the cpu twin
-- (normwise relative error <= 1e-2 and TransformerEngine's bf16 tolerance),
-- after checking which kernels dl.attn.backends says run. Small enough for
-- compute-sanitizer (scripts/gpu/attn_hopper.sh runs it under memcheck and
-- racecheck). Exit code 1 on a mismatch.
--   ./distlab run -n 1 --device cuda experiments/attn/hopper_small.lua
local dl = require "distlab"

local dev = dl.default_device()
local bad = 0

local function input(shape, seed) return dl.randn(shape, { dtype = "bf16", seed = seed, device = "cpu" }) end

local function case(name, shape_q, shape_kv, opts, thd)
  local q, k, v = input(shape_q, 1), input(shape_kv, 2), input(shape_kv, 3)
  local o = {}
  for key, val in pairs(opts) do o[key] = val end
  local g = {}
  for key, val in pairs(o) do g[key] = dl.is_tensor(val) and val:to(dev) or val end
  local gq, gk, gv = q:to(dev), k:to(dev), v:to(dev)
  local b = dl.attn.backends(gq, gk, gv, g)
  local out, lse = dl.attn.fwd(gq, gk, gv, g)
  local dout = input(out.shape, 4)
  local dq, dk, dv = dl.attn.bwd(dout:to(dev), gq, gk, gv, out, lse, g)
  dl.synchronize()
  local ro, rl = dl.attn.fwd(q, k, v, o)
  local rq, rk, rv = dl.attn.bwd(dout, q, k, v, out:cpu(), lse:cpu(), o)
  local errs = {}
  for _, t in ipairs({ { "out", ro, out }, { "lse", rl, lse }, { "dq", rq, dq }, { "dk", rk, dk }, { "dv", rv, dv } }) do
    local ref, got = t[2], t[3]:cpu()
    local rep = dl.mismatch_report(got, ref, 2.5e-2, 2.5e-2, 2)
    local rel = dl.rel_err(got:f64(), ref:f64())
    if rep or not (rel <= 1e-2) then
      errs[#errs + 1] = string.format("%s: rel %.2e %s", t[1], rel, rep or "")
    end
  end
  print(string.format("%-44s fwd: %s | bwd: %s | %s", name, b.fwd_why:match("kernel: (.*)$") or b.fwd_why,
    b.bwd_why:match("kernel: (.*)$") or b.bwd_why, #errs == 0 and "ok" or ("WRONG " .. table.concat(errs, "; "))))
  if #errs > 0 then bad = bad + 1 end
end

for _, d in ipairs({ 128, 64 }) do
  case("bshd b=2 s=333 h=2 d=" .. d .. " causal", { 2, 333, 2, d }, { 2, 333, 2, d }, { mask = "causal" })
  case("bshd b=1 s=300/kv 200 h=4/2 d=" .. d .. " bottom-right", { 1, 300, 4, d }, { 1, 200, 2, d },
    { mask = "causal_bottom_right" })
  case("sbhd s=257 b=2 h=2 d=" .. d .. " window (64, 16)", { 257, 2, 2, d }, { 257, 2, 2, d },
    { layout = "sbhd", window = { 64, 16 } })
  local cu = dl.from_table({ 0, 130, 130, 207 }, { dtype = "i32", device = "cpu" })
  local pad = dl.from_table({ 5, 140, 141, 220 }, { dtype = "i32", device = "cpu" })
  case("thd 130,0,77 at 5,140,141 h=2 d=" .. d .. " causal", { 224, 2, d }, { 224, 2, d },
    { layout = "thd", mask = "causal", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = pad,
      cu_seqlens_kv_padded = pad, max_seqlen_q = 130, max_seqlen_kv = 130 })
end
print(bad == 0 and "hopper_small: all ok" or ("hopper_small: " .. bad .. " cases WRONG"))
os.exit(bad == 0 and 0 or 1)
