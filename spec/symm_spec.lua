-- Symmetric buffers: peer reads and writes, flag rounds back to back, the
-- barrier, counts wrapping past 2^32, views and no /dev/shm leftovers, on 2
-- and 4 cpu ranks and on 2 GPUs (CUDA IPC, #multigpu). Their failure (a flag
-- nobody sets) is in comm_spec.lua.
local H = require "helpers"

local function run(n, device)
  return H.distlab(string.format("run -n %d --device %s spec/comm/symm.lua", n, device))
end

describe("symmetric buffers on cpu", function()
  for _, n in ipairs { 2, 4 } do
    it(n .. " ranks", function()
      local rc, out = run(n, "cpu")
      assert.equal(0, rc, out)
      local _, k = out:gsub("symm ok", "")
      assert.equal(n, k, out)
    end)
  end
end)

describe("symmetric buffers on GPUs #multigpu", function()
  it(H.gpu_ranks .. " ranks: peer reads and writes, flags, barrier", function()
    local rc, out = run(H.gpu_ranks, "cuda")
    assert.equal(0, rc, out)
    local _, k = out:gsub("symm ok", "")
    assert.equal(H.gpu_ranks, k, out)
  end)
end)
