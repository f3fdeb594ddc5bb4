-- spec/repl_spec.lua — the REPL (bindings/distlab/repl*.lua) and the world
-- rebuild it uses (dl.comm.world{new = true}).
local H = require "helpers"

describe("dl.comm.world{new = true}", function()
  for _, n in ipairs { 1, 2, 3 } do
    it(n .. " rank(s): a failed world is aborted and replaced under one agreed name, its keys deleted", function()
      local rc, out = H.distlab("run -n " .. n .. " --device cpu spec/repl/renew.lua")
      assert.equal(0, rc, out)
      local _, k = out:gsub("renew ok: rank %d, w %-> w%d", "")
      assert.equal(n, k, out)
    end)
  end
end)
