-- The named CP strategies (distlab.cp.presets): every one builds a schedule
-- on every layout it takes and refuses the others where the schedule does.
local dl = require "distlab"
local presets = require "distlab.cp.presets"

describe("cp presets", function()
  it("name each strategy once, in the benchmarks' order", function()
    local names, seen = {}, {}
    for i, st in ipairs(presets.list) do
      assert.is_nil(seen[st.name], st.name)
      seen[st.name] = true
      names[i] = st.name
    end
    assert.same({ "main", "double", "double+incremental", "fused", "fused, dkv local", "all_gather",
      "all_gather, overlap", "a2a", "a2a, overlap" }, names)
    assert.equal("fused", presets.get("fused").correction)
    assert.matches("no strategy named ring %(known: main; double", select(2, pcall(presets.get, "ring")))
  end)

  it("give dl.cp.attention options that build on the layouts they take", function()
    local comm = dl.comm.meta(4, 1)
    for _, st in ipairs(presets.list) do
      local o = presets.options(st)
      assert.is_nil(o.name)
      for _, layout in ipairs({ "bshd", "sbhd", "thd" }) do
        o.comm, o.layout, o.mask = comm, layout, "causal"
        local ok, e = pcall(dl.cp.attention, o)
        assert.equal(presets.applies(st, layout), ok, st.name .. " " .. layout .. ": " .. tostring(e))
      end
    end
    comm:free()
  end)
end)
