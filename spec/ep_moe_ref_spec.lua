-- A MoE layer's reference written only with distlab calls
-- (experiments/ep/moe_ref.lua: router softmax, top-k, dispatch by gather,
-- expert GEMMs, scatter_add combine) against dl.ep's dispatch and combine
-- on 4 cpu ranks, both buffer layouts: each local expert's rows exact, the
-- combined output within one bf16 ulp; and on GPUs (#multigpu).
local H = require "helpers"

local function count(out, pat)
  local _, k = out:gsub(pat, "")
  return k
end

describe("the MoE reference in distlab calls against dl.ep", function()
  for _, c in ipairs { { 4, "" }, { 4, "--tokens 5 --experts 12 --topk 3 --hidden 64" }, { 2, "--topk 4" } } do
    it(string.format("%d cpu ranks %s", c[1], c[2]), function()
      local rc, out = H.distlab(string.format("run -n %d --device cpu experiments/ep/moe_ref.lua %s", c[1], c[2]))
      assert.equal(0, rc, out)
      assert.equal(c[1], count(out, "moe ref ok"), out)
    end)
  end
end)

describe("the MoE reference on GPUs #multigpu", function()
  it(H.gpu_ranks .. " ranks", function()
    -- ranks sharing a GPU write no results where they belong: a folder of the spec's own
    local dir = H.tmpname("-moeref")
    local rc, out = H.distlab(string.format("run -n %d --device cuda experiments/ep/moe_ref.lua --out %s", H.gpu_ranks, dir))
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.equal(H.gpu_ranks, count(out, "moe ref ok"), out)
  end)
end)
