-- Symmetric buffers: peer reads and writes, flag rounds back to back, the
-- barrier, counts wrapping past 2^32, views and no /dev/shm leftovers, on 2
-- and 4 cpu ranks and on 2 GPUs (CUDA IPC, #multigpu). Their failure (a flag
-- nobody sets) is in comm_spec.lua.
local H = require "helpers"

local comm_run = H.ranks("comm")
local function run(n, device) return comm_run(n, device, "symm.lua") end

describe("symmetric buffers on cpu", function()
  for _, n in ipairs { 2, 4 } do
    it(n .. " ranks", function()
      H.ranks_ok(n, "symm", run(n, "cpu"))
    end)
  end
end)

describe("symmetric buffers on GPUs #multigpu", function()
  it(H.gpu_ranks .. " ranks: peer reads and writes, flags, barrier", function()
    H.ranks_ok(H.gpu_ranks, "symm", run(H.gpu_ranks, "cuda"))
  end)
end)

describe("symmetric buffers that differ across ranks", function()
  local function mismatch(n, mode)
    return comm_run(n, "cpu", "mismatch.lua", mode)
  end
  it("in size: every rank fails at creation, naming both sizes (no SIGBUS)", function()
    for _, n in ipairs { 2, 3 } do
      local rc, out = mismatch(n, "symm_size")
      assert.equal(0, rc, out)
      assert.falsy(out:find("NOERR", 1, true), out)
      for r = 0, n - 1 do
        local theirs = r == 0 and "rank %d has 16384 bytes, f32%[4096%]" or "rank 0 has 64 bytes, f32%[16%]"
        assert.truthy(out:find("ERR: [^\n]*symm_alloc on rank " .. r .. " of " .. n .. ": mismatched symmetric buffers " ..
          "%(symm_alloc #0%) on comm 'w': rank " .. r .. " has [^\n]* but " .. theirs .. " %(differs: "), out)
      end
    end
  end)
  it("in dtype alone (same bytes): every rank fails, naming the dtypes", function()
    local rc, out = mismatch(2, "symm_dtype")
    assert.equal(0, rc, out)
    assert.truthy(out:find("ERR: [^\n]*rank 0 has 256 bytes, f32%[64%] but rank 1 has 256 bytes, bf16%[128%] %(differs: f32%[64%] vs bf16%[128%]%)"), out)
    assert.truthy(out:find("ERR: [^\n]*rank 1 has 256 bytes, bf16%[128%] but rank 0 has 256 bytes, f32%[64%] %(differs: bf16%[128%] vs f32%[64%]%)"), out)
  end)
end)
