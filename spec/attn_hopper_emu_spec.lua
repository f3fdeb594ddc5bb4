-- The Hopper attention kernels' own sources (kernels/attn/hopper/fwd_kernel.cuh
-- and bwd_kernel.cuh) on the CPU, with wgmma, TMA, mbarriers and bulk
-- reductions emulated (experiments/lab/emu/attn/hopper.h), so that a
-- kernel change is checked in CI where no GPU is: the forward and the
-- backward (dq, dk, dv) against fp64 on bshd, sbhd and thd (offsets, NaN
-- gaps, lengths 0 and 1), GQA/MQA, masks and windows, the fused merge, the
-- forward's 192-row CTAs at d 64 (M192, three consumer warpgroups),
-- accumulate_grads, the backward's loops also with one arrival a warp on
-- the consumers' releases (ELECT, lanes drifting apart within a warp), and
-- with the rows' lse log2(e) and D from the kernel's own prep by bulk copies
-- (BULK, the default at d 128 with a mask), 80 query rows an item (M80, the
-- default at d 128 without one) and 128 (M128, the default at d 64), the
-- backward's tail split (a key block's items in parts, their dK and dV added
-- up by the last part), each check also failing a planted 2% error (the --quick
-- subsets, and --split 3; `make -C experiments/lab/emu/attn hopper-emu hopper-emu-bwd` runs all).
-- The builds (g++, about 10 s each on 2 cores) go to a fresh directory.
local H = require "helpers"

local has = H.has_command

local function run(target, flags, args)
  local build = H.tmpname("_hopper_emu")
  local p = io.popen(string.format("cd %q/experiments/lab/emu/attn && make -s %s ARGS=%q BUILD=%q EMU_FLAGS=%q 2>&1; " ..
    "echo __rc=$?; rm -rf %q", H.root, target, args or "--quick", build, flags or "", build))
  local out = p:read("*a")
  p:close()
  return out
end

-- The run's output ends well, every check passed and at least `cases` of them ran.
local function all_ok(out, last, cases)
  assert.truthy(out:find("__rc=0", 1, true), out)
  assert.truthy(out:find(last, 1, true), out)
  assert.falsy(out:find("FAIL", 1, true), out)
  local _, n = out:gsub("caught %-> ok", "")
  assert.is_true(n >= cases, out)
end

describe("the Hopper attention kernels on the CPU emulator", function()
  local it_ = (has("g++") and has("make")) and it or pending
  it_("forward: every case under three masks, the four loops (PIPE 0-3), the merge into f32 and bf16, d 64, d 64's 192-row CTAs of three consumer warpgroups (M192), the lazy rescale (LAZY) and MLA's 192/128, against fp64", function()
    local out = run("hopper-emu")
    all_ok(out, "hopper emu: all ok", 40)
    local _, m192 = out:gsub("d=64/64 m192 ", "")
    assert.is_true(m192 >= 18, out)
    local _, lazy = out:gsub("d=%d+/%d+ [%w ]-lazy pipe", "")
    assert.is_true(lazy >= 20, out)
  end)
  it_("forward with HP_FWD_GROUP_BYTES small: masked calls' tiles heaviest first in groups of heads that do not divide the heads", function()
    all_ok(run("hopper-emu", "-DHP_FWD_GROUP_BYTES=400000"), "hopper emu: all ok", 40)
  end)
  it_("forward with HP_FWD_ELECT=1: K and V stages freed by one arrival a consumer warp (empty barriers of count 8, 12 with M192)", function()
    all_ok(run("hopper-emu", "-DHP_FWD_ELECT=1"), "hopper emu: all ok", 40)
  end)
  it_("forward with HP_FWD_TREE=1: the softmax's row max and sum in four chains a row (the sums' order changed), within the fp64 checks", function()
    all_ok(run("hopper-emu", "-DHP_FWD_TREE=1"), "hopper emu: all ok", 40)
  end)
  it_("backward: dq, dk, dv of every case under two masks at d 128 and one at d 64, with and without the turns, in the earlier GEMM order, with one arrival a warp, with lse2 and D by bulk copies, and with 80 (d 128) and 128 (d 64) query rows an item", function()
    local out = run("hopper-emu-bwd")
    all_ok(out, "hopper emu bwd: all ok", 20)
    local _, plain = out:gsub("bwd d=64 thd", "")
    local _, turns = out:gsub("bwd d=64 turns thd", "")
    local _, step = out:gsub("bwd d=128 step thd", "")
    local _, elect = out:gsub("bwd d=128 elect thd", "")
    local _, turns_elect = out:gsub("bwd d=64 turns elect thd", "")
    local _, bulk = out:gsub("bwd d=128 bulk thd", "")
    local _, turns_bulk = out:gsub("bwd d=64 turns elect bulk thd", "")
    local _, m80 = out:gsub("bwd d=128 m80 ", "")
    local _, m128 = out:gsub("bwd d=64 m128 ", "")
    assert.is_true(plain > 0 and turns > 0 and step > 0 and elect > 0 and turns_elect > 0 and bulk > 0 and turns_bulk > 0, out)
    assert.is_true(m80 > 0 and m128 > 0, out)
  end)
  it_("backward with the tail split (--split 3): the unmasked bshd, sbhd and thd cases (thd with empty, short and unequal sequences) at d 128 (80 query rows an item) and d 64 (128), with and without ELECT, half the key blocks in 3 parts each (fewer items than parts too), the grid run last CTA first, against fp64", function()
    local out = run("hopper-emu-bwd", nil, "--split 3")
    all_ok(out, "hopper emu bwd split: all ok", 24)
    local _, n = out:gsub("bwd d=%d+ split 3 ", "")
    assert.is_true(n >= 24, out)
    local _, t = out:gsub("bwd d=%d+ split 3 [^\n]*thd", "")
    assert.is_true(t >= 8, out)
  end)
  it_("backward with HP_BWD_GROUP_BYTES small: masked calls' key blocks heaviest first in groups of kv heads that do not divide them (a group of 3 of 4 at d 128, s 200)", function()
    all_ok(run("hopper-emu-bwd", "-DHP_BWD_GROUP_BYTES=700000"), "hopper emu bwd: all ok", 20)
  end)
end)
