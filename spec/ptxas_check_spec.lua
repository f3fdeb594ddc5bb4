-- scripts/ptxas-check.sh: the Hopper kernels compiled for sm_90a with ptxas -v, failing on any spill and on
-- any note of ptxas that it serialised the wgmmas or injected a wait (C75xx), which a kernel can compile and
-- run correctly with and still lose a fifth of its speed (experiments/lab/attn/FA4-GAP.md section 28). The
-- real compile (about a minute) where nvcc is; the parser on planted logs everywhere.
local H = require "helpers"
local unpack = table.unpack or unpack

local function check(args, env)
  local p = io.popen(string.format("%s%q/scripts/ptxas-check.sh %s 2>&1; echo __rc=$?", env or "", H.root, args))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("__rc=(%d+)"))
end

local function planted(lines)
  local f = H.tmpname("_ptxas.log")
  local h = assert(io.open(f, "w"))
  h:write(table.concat(lines, "\n"), "\n")
  h:close()
  local out, rc = check("--log " .. f)
  os.remove(f)
  return out, rc
end

local K = "_Z10bwd_kernelILi128ELi128ELi1ELb0ELb0ELi80EEv14CUtensorMap_stS0_S0_S0_12bwd_params_t"
local clean = {
  "ptxas info    : Compiling entry function '" .. K .. "' for 'sm_90a'",
  "ptxas info    : Function properties for " .. K,
  "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
  "ptxas info    : Used 168 registers, used 3 barriers",
}

describe("scripts/ptxas-check.sh", function()
  it("passes a log with no spill and no note", function()
    local out, rc = planted(clean)
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("1 kernels, 0 spilling, 0 with a performance note", 1, true), out)
  end)

  it("fails a serialised wgmma (C7515) and names the kernel", function()
    local lines = { unpack(clean) }
    lines[#lines + 1] = "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized " ..
      "due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline " ..
      "stage in the function '" .. K .. "'"
    local out, rc = planted(lines)
    assert.are.equal(1, rc, out)
    assert.truthy(out:find("bwd_kernel<128, 128, 1, false, false, 80>", 1, true), out)
    assert.truthy(out:find("C7515", 1, true), out)
  end)

  it("fails a log that names no kernel (a compile that printed nothing is not a pass)", function()
    local out, rc = planted({ "ptxas info    : 0 bytes gmem" })
    assert.are.equal(1, rc, out)
    assert.truthy(out:find("no kernel", 1, true), out)
  end)

  it("fails a spill", function()
    local lines = { unpack(clean) }
    lines[3] = "    64 bytes stack frame, 64 bytes spill stores, 76 bytes spill loads"
    local out, rc = planted(lines)
    assert.are.equal(1, rc, out)
    assert.truthy(out:find("140 bytes of spill", 1, true), out)
  end)

  local it_ = H.has_command("nvcc") and it or pending
  it_("finds the Hopper kernels free of spills and serialised wgmmas, and writes one digest a kernel (SUMS)", function()
    local sums = H.tmpname("_sums.txt")
    local out, rc = check("", string.format("SUMS=%q ", sums))
    assert.are.equal(0, rc, out)
    local n = tonumber(out:match("attn_hopper.cu: (%d+) kernels, 0 spilling, 0 with a performance note"))
    assert.truthy(n and n > 0, out)
    -- the digests: as many as the kernels ptxas named, each a kernel's own (no name twice), sorted by name
    local names, prev, lines = {}, "", 0
    for line in io.lines(sums) do
      local md5, file, name = line:match("^(%x+) (%S+) (%S+)$")
      assert.truthy(md5 and #md5 == 32 and file:find("attn_hopper.cu", 1, true) and name:find("^_Z"), line)
      assert.is_nil(names[name], "twice: " .. name)
      assert.truthy(name >= prev, "not sorted at " .. name)
      names[name], prev, lines = true, name, lines + 1
    end
    os.remove(sums)
    assert.are.equal(n, lines, out)
  end)
end)
