-- The C ABI header is the single source of the Lua cdefs: it must stay plain
-- C that ffi.cdef parses, with no macros that need expanding.
local core = require "distlab.core"

describe("core/include/distlab.h", function()
  local f = assert(io.open(core.root .. "/core/include/distlab.h"))
  local text = f:read("*a")
  f:close()

  it("has no function-like or value macros besides the include guard", function()
    for line in text:gmatch("[^\n]+") do
      local m = line:match("^%s*#%s*define%s+([%w_]+)")
      if m then assert.equal("DISTLAB_H", m, "macro in the ABI header: " .. line) end
    end
  end)

  it("matches the library's ABI version", function()
    assert.equal(core.C.DL_ABI_VERSION, core.C.dl_abi_version())
    local info = require("distlab").build_info() -- it once said "abi 1" whatever the version
    assert.truthy(info:find("distlab abi " .. tonumber(core.C.DL_ABI_VERSION) .. ",", 1, true), info)
  end)

  it("is exactly what the library exports", function()
    local p = io.popen("nm -D --defined-only " .. core.libpath .. " | awk '{print $3}' | grep '^dl_'")
    local exported, declared = {}, {}
    for name in p:read("*a"):gmatch("[%w_]+") do exported[name] = true end
    p:close()
    for name in core.cdef_text(text):gmatch("[%s%*](dl_[%w_]+)%s*%(") do declared[name] = true end
    local extra, missing = {}, {}
    for name in pairs(exported) do if not declared[name] then extra[#extra + 1] = name end end
    for name in pairs(declared) do if not exported[name] then missing[#missing + 1] = name end end
    table.sort(extra)
    table.sort(missing)
    assert.same({}, extra, "exported but not in the header (internal symbols must stay hidden)")
    assert.same({}, missing, "declared in the header but not in the library")
  end)
end)
