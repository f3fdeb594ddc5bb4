-- Issue 53's EP cases: calls out of step between ranks (the call tag,
-- kernels/ep/ep.h), unknown options, a dead peer, unclear errors and bad
-- values. Each ends in an error at the caller's line, on every rank, naming
-- what was wrong; never a silent result, a crash or a wait until the
-- timeout. Multi-rank parts run spec/ep/faults.lua and
-- experiments/faults/ep_death.lua on cpu ranks.
local dl = require "distlab"
local H = require "helpers"

local run = H.ranks("ep")

local function fails(fn, msg) return H.failed(msg, "ep_faults_spec.lua", pcall(fn)) end

local function buffer(o)
  local c = { comm = dl.comm.world(), max_tokens = 4, hidden = 128, experts = 2, topk = 1 }
  for k, v in pairs(o or {}) do c[k] = v end
  return dl.ep.buffer(c)
end

-- every "ERR: " line of out
local function errs(out)
  local t = {}
  for line in out:gmatch("ERR: ([^\n]*)") do t[#t + 1] = line end
  return t
end

describe("ep calls out of step", function()
  for _, n in ipairs { 2, 3 } do
    for _, lo in ipairs { { "per_rank", "rank_major" }, { "per_rank", "expert_major" }, { "per_expert", "expert_major" },
      { "per_expert", "rank_major" } } do
      it(n .. " ranks, " .. lo[1] .. "/" .. lo[2] .. ": an extra dispatch on rank 0 is an error on every rank naming the calls",
        function()
          local rc, out = run(n, "cpu", "faults.lua", "extra " .. lo[1] .. " " .. lo[2], "SPEC_TIMEOUT=20")
          assert.equal(0, rc, out)
          local e = errs(out)
          assert.equal(n, #e, out)
          for _, line in ipairs(e) do
            assert.truthy(line:find("^spec/ep/faults.lua:%d+: ep ") and
              line:find("rank %d made a %a+ as its ep call 2 where this rank made %a+ %d %(its call 2%)") and
              line:find("every rank must make the same ep calls", 1, true), out)
          end
          for took in out:gmatch("TOOK ([%d.]+)") do assert.is_true(tonumber(took) < 1, out) end
        end)
    end
  end
end)

describe("ep options", function()
  it("combine's unknown option is an error listing the known ones", function()
    local ep = buffer()
    local x = dl.zeros({ 4, 128 }):bf16()
    local idx = dl.zeros({ 4, 1 }, { dtype = "i32" })
    local recv, h = ep:dispatch(x, idx, dl.ones({ 4, 1 }))
    fails(function() ep:combine(recv.x, h, { output = dl.zeros({ 4, 128 }):bf16() }) end,
      "ep:combine: unknown option output (known: out)")
    fails(function() ep:combine(recv.x, h, {}, 3) end, "ep:combine: 1 argument too many")
    fails(function() ep:combine("y", h) end, "ep:combine: y must be a tensor, got string")
    fails(function() ep:dispatch(x, {}, dl.ones({ 4, 1 })) end, "ep:dispatch: topk_idx must be a tensor, got table")
    local out = ep:combine(recv.x, h, { out = dl.zeros({ 4, 128 }):bf16() })
    assert.same({ 4, 128 }, out.shape)
    ep:free()
  end)

  it("buffer and formula refuse unknown options, listing the known ones", function()
    fails(function() buffer { max_token = 4 } end, "ep.buffer: unknown option max_token (known: backend, blocks, comm, dtype")
    fails(function() dl.ep.formula { max_tokens = 4, hidden = 128, experts = 2, topk = 1, ranks = 2, comm = 1 } end,
      "dl.ep.formula: unknown option comm (known: blocks, dtype, experts")
  end)
end)

describe("ep values", function()
  it("integers past int32 are refused by name, not wrapped to -2147483648", function()
    for _, key in ipairs { "max_tokens", "hidden", "experts", "topk" } do
      fails(function() buffer { [key] = 2 ^ 31 } end, "ep.buffer: " .. key .. " is 2147483648, outside 1..2^31 - 1")
    end
    fails(function() buffer { hidden = 2.5 } end, "ep.buffer: hidden is 2.5, not an integer")
    fails(function() dl.ep.formula { max_tokens = 2 ^ 40, hidden = 128, experts = 2, topk = 1, ranks = 2 } end,
      "dl.ep.formula: max_tokens is 1099511627776, outside 1..2^31 - 1")
  end)

  it("blocks must be 1..1024 (nil: the default grid)", function()
    fails(function() buffer { blocks = -1 } end, "ep.buffer: blocks is -1, outside 1..2^31 - 1")
    fails(function() buffer { blocks = 2 ^ 40 } end, "ep.buffer: blocks is 1099511627776, outside 1..2^31 - 1")
    fails(function() buffer { blocks = 5000 } end, "ep: blocks 5000 is not in 1..1024")
    local ep = buffer { blocks = 3 }
    assert.equal(3, ep.blocks)
    ep:free()
  end)

  it("ranks must be the communicator's", function()
    fails(function() buffer { ranks = 8 } end, "ep.buffer: ranks 8, but comm")
    buffer({ ranks = 1 }):free()
  end)

  it("formula: experts must be a multiple of the ranks", function()
    fails(function() dl.ep.formula { max_tokens = 4, hidden = 128, experts = 6, topk = 1, ranks = 4 } end,
      "dl.ep.formula: experts 6 is not a multiple of the 4 ranks")
    fails(function() dl.ep.formula { max_tokens = 4, hidden = 128, experts = 6, topk = 1 } end,
      "dl.ep.formula: ranks is nil (a nil), not an integer")
  end)

  it("a freed buffer refuses every call by saying so, and its outputs with it", function()
    local ep = buffer()
    local x = dl.zeros({ 4, 128 }):bf16()
    local idx, wt = dl.zeros({ 4, 1 }, { dtype = "i32" }), dl.ones({ 4, 1 })
    local recv, h = ep:dispatch(x, idx, wt)
    local out = ep:combine(recv.x, h)
    ep:free()
    for name, fn in pairs {
      dispatch = function() ep:dispatch(x, idx, wt) end,
      combine = function() ep:combine(recv.x, h) end,
      combine_recv = function() ep:combine_recv(h) end,
      info = function() ep:info() end,
      bytes = function() ep:bytes() end,
    } do
      local ok, err = pcall(fn)
      assert.is_false(ok, name)
      assert.truthy(tostring(err):find("this ep buffer was freed (ep:free()): make a new one", 1, true), name .. ": " .. tostring(err))
    end
    assert.equal("ep(<freed>)", tostring(ep))
    for name, t in pairs { out = out, x = recv.x, counts = recv.counts } do
      assert.is_false(pcall(function() return t:sum() end), name .. " is still readable after ep:free()")
    end
    ep:free() -- twice: nothing
  end)
end)

describe("ep buffers that differ between ranks", function()
  it("3 ranks with different outputs: every rank's error names the option, not DISTLAB_EP_LAMPORT_MAX_ROWS", function()
    local rc, out = run(3, "cpu", "faults.lua", "output")
    assert.equal(0, rc, out)
    local e = errs(out)
    assert.equal(3, #e, out)
    for _, line in ipairs(e) do
      assert.truthy(line:find("ep: ranks disagree on the buffer", 1, true) and line:find("expert_major", 1, true) and
        line:find("rank_major", 1, true) and not line:find("DISTLAB_EP_LAMPORT_MAX_ROWS", 1, true), out)
    end
  end)

  it("2 ranks, an extra buffer on rank 0: its error says rank 1 made no such buffer", function()
    local rc, out = run(2, "cpu", "faults.lua", "extrabuf", "SPEC_TIMEOUT=1")
    assert.equal(0, rc, out)
    local e = errs(out)
    assert.equal(1, #e, out)
    assert.truthy(e[1]:find("ep: rank 1 did not make this ep buffer within 1.0 s", 1, true) and
      e[1]:find("every rank must make the same ep buffers", 1, true), out)
  end)
end)

describe("ep survivors of a dead rank", function()
  it("kill -9 and exit(1), with and without the launcher: every survivor fails within 1 s naming it", function()
    local p = io.popen(string.format("cd %q && TRIALS=%s experiments/faults/ep_deaths.sh 2>&1; echo __rc=$?", H.root,
      os.getenv("SPEC_KILL_TRIALS") or "2"))
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("__rc=0", 1, true), out)
    local _, cases = out:gsub("failed within 1 s naming the dead rank", "")
    assert.equal(4, cases, out)
  end)
end)
