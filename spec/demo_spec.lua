-- `./distlab demo` shows the main job: seed 000's memory table, a CP
-- forward + backward checked against one rank, an all-reduce checked exactly.
local H = require "helpers"

describe("distlab demo", function()
  it("runs the three results on 2 cpu ranks, each checked", function()
    local rc, out = H.distlab("run -n 2 --device cpu experiments/demo.lua")
    assert.equal(0, rc, out)
    -- the table: fused flat at 5.02 units from C = 4 to 64, main growing
    assert.truthy(out:match("\nfused%s+3%.02%s+5%.02%s+5%.02%s+5%.02%s+5%.02%s+5%.02"), out)
    assert.truthy(out:match("\nmain%s+6%.03%s+12%.06%s+24%.13"), out)
    assert.truthy(out:find("(bound 1.0e-02): ok", 1, true), out)
    assert.truthy(out:match("\n   0 of 262144 elements differ"), out)
    assert.truthy(out:find("README.md", 1, true), out)
  end)
end)
