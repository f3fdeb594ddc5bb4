-- The all-reduce kernels' own sources (kernels/allreduce/*.cu) on the CPU
-- emulator (experiments/lab/emu/allreduce: OS threads as CUDA threads, host
-- threads as ranks), so that a kernel change is checked in CI where no GPU
-- is: random calls of every algorithm checked bit-exactly, then the failure
-- paths (a peer that never comes, mismatched calls, a late peer, a dead
-- peer), then one_shot_lamport's tagged form around its size limit. The build (g++, about 20 s on 2 cores) goes
-- to a fresh directory (make's default one in /tmp may hold another checkout's build), shared by the cases.
local H = require "helpers"

local has = H.has_command

describe("allreduce kernels on the CPU emulator", function()
  local runnable = has("g++") and has("make")
  local build = H.tmpname("_allreduce_emu")
  teardown(function() os.execute(string.format("rm -rf %q", build)) end)
  for _, c in ipairs { { 2, 80, 3 }, { 3, 40, 4 } } do
    local it_ = runnable and it or pending
    it_(c[1] .. " ranks, " .. c[2] .. " random calls, then the failure paths", function()
      local p = io.popen(string.format("cd %q/experiments/lab/emu/allreduce && make -s run N=%d CALLS=%d SEED=%d BUILD=%q 2>&1; echo __rc=$?",
        H.root, c[1], c[2], c[3], build))
      local out = p:read("*a")
      p:close()
      assert.truthy(out:find("__rc=0", 1, true), out)
      assert.truthy(out:find(c[1] .. " ranks, " .. c[2] .. " calls: ok", 1, true), out)
      assert.falsy(out:find("FAILED", 1, true), out)
      local _, k = out:gsub("dead peer %(algo %d+%): [%d.]+ s[^\n]*: ok", "")
      assert.equal(3, k, out) -- two_shot, one_shot_lamport untagged and tagged
      assert.truthy(out:find("tagged sums %([^\n]*: ok"), out)
    end)
  end
end)
