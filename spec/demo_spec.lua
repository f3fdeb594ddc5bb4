-- `./distlab demo` shows the main job: seed 000's memory table, a CP
-- forward + backward checked against one rank, an all-reduce checked exactly;
-- where it runs (demo_plan in scripts/distlab) from the GPU count, faked here
-- with an nvidia-smi that lists N GPUs.
local H = require "helpers"

-- A folder holding an nvidia-smi whose `-L` lists n GPUs.
local function fake_gpus(n)
  local dir = H.tmpname("-bin")
  os.execute("mkdir -p " .. dir)
  local lines = {}
  for i = 0, n - 1 do lines[#lines + 1] = string.format("GPU %d: NVIDIA H200 (UUID: GPU-fake-%d)", i, i) end
  H.write(dir .. "/nvidia-smi", "#!/bin/sh\n" .. (n > 0 and "printf '%s\\n' '" .. table.concat(lines, "' '") .. "'\n" or ""))
  os.execute("chmod +x " .. dir .. "/nvidia-smi")
  return dir
end

describe("distlab demo", function()
  it("runs the three results on 2 cpu ranks, each checked", function()
    local rc, out = H.distlab("run -n 2 --device cpu experiments/demo.lua")
    assert.equal(0, rc, out)
    -- the table: fused flat at 5.02 units from C = 4 to 64, main growing
    assert.truthy(out:match("\nfused%s+3%.02%s+5%.02%s+5%.02%s+5%.02%s+5%.02%s+5%.02"), out)
    assert.truthy(out:match("\nmain%s+6%.03%s+12%.06%s+24%.13"), out)
    assert.truthy(out:find("(bound 1.0e-02): ok", 1, true), out)
    assert.truthy(out:match("\n   0 of 262144 elements differ"), out)
    assert.falsy(out:find("share each GPU", 1, true), out)
    -- the pages it names exist
    for page in out:gmatch("(docs/[%w_-]+%.md)") do
      assert.truthy(io.open(H.root .. "/" .. page), page .. " does not exist")
    end
    assert.truthy(out:find("README.md", 1, true), out)
  end)

  it("places its ranks: 4 on cpu without a GPU, 2 sharing one GPU, a rank a GPU on several", function()
    for _, case in ipairs {
      { gpus = 0, want = "-n 4 --device cpu" },
      { gpus = 1, want = "-n 2 --device cuda" },
      { gpus = 2, want = "-n 2 --device cuda" },
      { gpus = 8, want = "-n 8 --device cuda" },
      { gpus = 1, env = "DEMO_RANKS=4", want = "-n 4 --device cuda" },
    } do
      local dir = fake_gpus(case.gpus)
      local rc, out = H.distlab("demo --plan", string.format("PATH=%q:$PATH %s", dir, case.env or ""))
      os.execute("rm -rf " .. dir)
      assert.equal(0, rc, out)
      assert.equal("distlab run " .. case.want .. " experiments/demo.lua\n", out, case.gpus .. " GPU(s)")
    end
  end)
end)
