-- Communicators: the store, every collective against a reference on 2 and 4
-- cpu ranks (shared memory), split communicators, the meta world, and every
-- failure path ending in a clear error within the timeout. The multi-rank
-- parts run scripts under spec/comm/ through `./distlab run -n N`; the same
-- scripts run on 2 GPUs (NCCL) under the #multigpu tag.
local ffi = require "ffi"
local dl = require "distlab"
local H = require "helpers"

local C = dl.C

local run = H.ranks("comm")

local function elapsed(fn)
  local t0 = os.time()
  local a, b = fn()
  return os.time() - t0, a, b
end

describe("store", function()
  it("sets, gets, adds, checks, deletes in the job's namespace", function()
    local pp = ffi.new("dl_store_t*[1]")
    dl.check(C.dl_store_new(pp, "127.0.0.1", 0, 0, 1, "specjob", 2))
    local s = ffi.gc(pp[0], C.dl_store_free)
    dl.check(C.dl_store_set(s, "k", "hello", 5))
    local buf, len = ffi.new("char[16]"), ffi.new("int64_t[1]")
    dl.check(C.dl_store_get(s, "k", buf, 16, len))
    assert.equal("hello", ffi.string(buf, len[0]))
    local v = ffi.new("int64_t[1]")
    dl.check(C.dl_store_add(s, "n", 5, v))
    dl.check(C.dl_store_add(s, "n", -2, v))
    assert.equal(3, tonumber(v[0]))
    local e = ffi.new("int[1]")
    dl.check(C.dl_store_check(s, "k", e))
    assert.equal(1, e[0])
    dl.check(C.dl_store_delete(s, "k"))
    dl.check(C.dl_store_check(s, "k", e))
    assert.equal(0, e[0])
  end)

  it("times out on a key nobody sets, naming the key, rank and address", function()
    local pp = ffi.new("dl_store_t*[1]")
    dl.check(C.dl_store_new(pp, "127.0.0.1", 0, 0, 1, "specjob", 0.5))
    local s = ffi.gc(pp[0], C.dl_store_free)
    local t, rc = elapsed(function() return C.dl_store_wait(s, "never") end)
    assert.equal(C.DL_ETIMEOUT, rc)
    local msg = ffi.string(C.dl_last_error())
    assert.truthy(msg:find("store wait of key 'never' timed out after 0.5 s (rank 0, store 127.0.0.1:", 1, true), msg)
    assert.is_true(t <= 2)
    dl.check(C.dl_store_set(s, "after", "x", 1)) -- the connection recovers
  end)

  it("fails within the timeout when rank 0 never serves, naming the address", function()
    local pp = ffi.new("dl_store_t*[1]")
    local t, rc = elapsed(function() return C.dl_store_new(pp, "127.0.0.1", 1, 1, 2, "specjob", 1) end)
    assert.equal(C.DL_ETIMEOUT, rc)
    local msg = ffi.string(C.dl_last_error())
    assert.truthy(msg:find("could not reach the store within 1.0 s (rank 1, store 127.0.0.1:1, job 'specjob')", 1, true), msg)
    assert.is_true(t <= 3)
  end)
end)

local small = "DISTLAB_SHM_SLOT_BYTES=4096 DISTLAB_SHM_BOX_BYTES=4096"

describe("comm on cpu (shared memory)", function()
  for _, n in ipairs { 2, 4 } do
    it(n .. " ranks: every collective and dtype, sizes 1, 7, 1001, in many chunks", function()
      H.ranks_ok(n, "collectives", run(n, "cpu", "collectives.lua", "", small))
    end)

    it(n .. " ranks: split communicators", function()
      H.ranks_ok(n, "split", run(n, "cpu", "split.lua"))
    end)
  end

  it("2 ranks: a recorded graph that meets its freed communicator refuses to replay", function()
    H.ranks_ok(2, "graph_release", run(2, "cpu", "graph_release.lua"))
  end)

  it("2 ranks: a large tensor (600001 elements) through the default chunk and mailbox sizes", function()
    local rc, out = run(2, "cpu", "collectives.lua", "600001", "SPEC_DTYPES='f32 bf16'")
    assert.equal(0, rc, out)
  end)
end)

describe("multi-rank REPL", function()
  it("runs each line on every rank, prefixes differing output, survives errors", function()
    local input = H.write(H.tmpname(".txt"), 'x = 40 + 2\nx\nrank * 10\nerror("boom " .. rank)\nt = dl.full({2}, rank + 1)\nworld:all_reduce(t)\n:quit\n')
    local rc, out = H.distlab("repl -n 2 --device cpu < " .. input)
    os.remove(input)
    assert.equal(0, rc, out)
    assert.truthy(out:find("\n?dl%[2%]> 42\n"), out)
    assert.truthy(out:find("[0] 0\n[1] 10\n", 1, true), out)
    assert.truthy(out:find("[0] error: stdin:1: boom 0\n[1] error: stdin:1: boom 1\n", 1, true), out)
    assert.truthy(out:find("tensor([3.0000, 3.0000]", 1, true), out)
  end)
end)

describe("choosing a backend", function()
  local function world_with(env)
    local file = H.write(H.tmpname(".lua"), [[
      local dl = require "distlab"
      local ok, err = pcall(dl.comm.world)
      print(ok and ("BACKEND " .. dl.comm.world().backend) or ("ERR " .. tostring(err)))
    ]])
    local rc, out = H.distlab("run -n 2 --device cpu " .. file, env)
    os.remove(file)
    return rc, out
  end
  it("DISTLAB_COMM_BACKEND picks one, and a bad name is a clear error", function()
    local rc, out = world_with("DISTLAB_COMM_BACKEND=shm")
    assert.equal(0, rc, out)
    local _, k = out:gsub("BACKEND shm", "")
    assert.equal(2, k, out)
    rc, out = world_with("DISTLAB_COMM_BACKEND=nvlink")
    assert.truthy(out:find('ERR [^\n]*unknown backend "nvlink" %(expected shm, nccl, ipc or meta%)'), out)
  end)
  -- One rank more than this host has GPUs: the last one (rank G on cuda:G) has none and fails
  -- before the store, and its error ends the job at once (the ranks that have a GPU would
  -- otherwise wait for it in the rendezvous until their timeout).
  it("the ipc communicator (ranks sharing a GPU) needs a GPU, and says so", function()
    local g, why = dl.cuda_device_count()
    local file = H.write(H.tmpname(".lua"), 'require("distlab").comm.world()\nprint("NOERR")\n')
    local t, rc, out = elapsed(function() return H.distlab(string.format("run -n %d --device cpu %s", g + 1, file),
      "DISTLAB_COMM_BACKEND=ipc") end)
    os.remove(file)
    assert.are_not.equal(0, rc, out)
    local want = string.format("the ipc communicator needs cuda:%d, but %s", g,
      g == 0 and why or string.format("this machine has %d GPU(s)", g))
    assert.truthy(out:find("rank " .. g .. " of " .. g + 1 .. " failed", 1, true), out)
    assert.truthy(out:find(want, 1, true), out)
    assert.falsy(out:find("NOERR", 1, true), out)
    assert.is_true(t <= 30, "took " .. t .. " s")
  end)
end)

describe("comm on meta", function()
  it("plays rank 5 of 64: ops accepted, shapes checked, split by function, symm buffers", function()
    local rc, out = H.distlab("run --device meta --world 64 --rank 5 spec/comm/meta.lua")
    assert.equal(0, rc, out)
    assert.truthy(out:find("meta ok: rank 5 of 64", 1, true), out)
  end)
end)

-- mode -> what rank 0's (or every rank's) error must say
local failures = {
  { "exit", "rank 1 %(pid %d+%) has exited" },
  { "never", "the communicator failed earlier" },
  { "size", "mismatched calls: rank %d calls all_reduce%(sum%), dtype f32, 1[01] in, 1[01] out but rank %d " ..
    "calls all_reduce%(sum%), dtype f32, 1[01] in, 1[01] out %(differs: 1[01] in vs 1[01] in; 1[01] out vs 1[01] out%)" },
  { "dtype", "mismatched calls: rank %d calls all_reduce%(sum%), dtype [bf3216]+, [^\n]*%(differs: dtype [bf3216]+ vs dtype [bf3216]+%)" },
  { "reduction", "mismatched calls: [^\n]*%(differs: all_reduce%(sum%) vs all_reduce%(max%)%)" },
  { "root", "mismatched calls: [^\n]*%(differs: broadcast from [01] vs broadcast from [01]%)" },
  { "p2p", "mismatched sizes: rank 1 receives 11 elements of f32 %(44 bytes%) from rank 0, which sends 10 elements of f32 %(40 bytes%)" },
  { "p2p_dtype", "mismatched dtypes: rank 1 receives 8 elements of bf16 %(16 bytes%) from rank 0, which sends 4 elements of f32 %(16 bytes%)" },
  { "counts", "mismatched counts: rank 0 sends 3 elements to rank 1, which expects 4" },
  { "late", "all_reduce #%d+ on rank 1 of 2 [^\n]*rank 0 gave up on the communicator %(this rank was [^\n]*timed out after 2.0 s" },
  { "debug", "mismatched calls: rank %d calls all_reduce%(max%), dtype f32, 1[01] in" },
  { "symmflag", "flag 5 did not reach 1 within 2.0 s" },
}

describe("comm failures on cpu end in a clear error within the timeout", function()
  for _, f in ipairs(failures) do
    it(f[1], function()
      local t, rc, out = elapsed(function() return run(2, "cpu", "fail.lua", f[1], "SPEC_TIMEOUT=2") end)
      assert.truthy(out:match("ERR: [^\n]*" .. f[2]), out)
      assert.is_true(t <= 10, "took " .. t .. " s")
      if f[1] == "exit" then assert.equal(3, rc, out) end
      if f[1] == "never" then
        assert.truthy(out:find("FIRST: [^\n]*timed out after 2.0 s waiting for rank 1 at barrier"), out)
      end
      if f[1]:match("^p2p") then -- the sender fails at its next op, with the receiver's reason
        assert.truthy(out:find("ERR: [^\n]*barrier #%d+ on rank 0 of 2 [^\n]*rank 1 gave up on the communicator %(this rank was " ..
          "[^\n]*" .. f[2]), out)
      end
      if f[1] == "late" then
        assert.truthy(out:find("FIRST: [^\n]*timed out after 2.0 s waiting for rank 1 at barrier"), out)
        assert.falsy(out:find("NOERR rank 1", 1, true), out)
      end
    end)
  end
end)

describe("comm debug mode on cpu", function()
  it("leaves no key of its point-to-point check in the store (the receive deletes the send's), and of its "
    .. "collective checks only each rank's last, numbered alike on every rank whatever p2p ops each made", function()
    H.ranks_ok(2, "debug_keys", run(2, "cpu", "debug_keys.lua"))
  end)
end)

local G = H.gpu_ranks
describe("comm on GPUs (NCCL; ipc where ranks share a GPU) #multigpu", function()
  it(G .. " ranks: every collective and dtype, odd sizes", function()
    local rc, out = run(G, "cuda", "collectives.lua", "1 7 1001")
    assert.equal(0, rc, out)
    rc, out = run(G, "cuda", "collectives.lua", "600001", "SPEC_DTYPES='f32 bf16'")
    assert.equal(0, rc, out)
  end)
  it(G .. " ranks: split communicators", function()
    local rc, out = run(G, "cuda", "split.lua")
    assert.equal(0, rc, out)
  end)
  it(G .. " ranks: a graph holding comm work is released when its communicator goes, and the exit does not hang", function()
    local t, rc, out = elapsed(function() return run(G, "cuda", "graph_release.lua") end)
    H.ranks_ok(G, "graph_release", rc, out)
    assert.is_true(t <= 60, "took " .. t .. " s")
  end)
  -- a hang shows as a kernel that does not finish, or as the host stuck in
  -- NCCL's lazy connection to the missing peer: either names the op and rank
  local hang = { "did not finish within 2.0 s", "has been inside NCCL for more than 2.0 s",
    "rank 1 did not arrive within 2.0 s" } -- nccl (the first two), ipc (its checks, a device barrier)
  local gpu_failures = {
    -- both backends watch the members' pids (peers.c): a rank that exits is
    -- named at once (ipc in its debug check's store wait, nccl in its watcher)
    { "exit", { "rank 1 %(pid %d+%) has exited" } },
    { "never", { "the communicator failed earlier" } },
    { "debug", { "mismatched calls: rank %d calls all_reduce%(max%), dtype f32, 1[01] in" } },
    { "symmflag", { "flag 5 did not reach 1 within 2.0 s" } },
  }
  for _, f in ipairs(gpu_failures) do
    it("failure: " .. f[1], function()
      local t, rc, out = elapsed(function() return run(2, "cuda", "fail.lua", f[1], "SPEC_TIMEOUT=2") end)
      local found = false
      for _, p in ipairs(f[2]) do found = found or out:match("ERR: [^\n]*" .. p) ~= nil end
      assert.is_true(found, out)
      if f[1] == "never" then
        local first = false
        for _, p in ipairs(hang) do first = first or out:match("FIRST: [^\n]*" .. p) ~= nil end
        assert.is_true(first, out)
      end
      assert.is_true(t <= 30, "took " .. t .. " s")
    end)
  end
end)

describe("a rank that cannot make a communicator, sends to self (issue 53)", function()
  for _, where in ipairs { "lua", "c" } do
    it("tells its peers at once (" .. where .. " check): every rank fails within a second naming it", function()
      local rc, out = run(3, "cpu", "create_fail.lua", where)
      assert.equal(0, rc, out)
      local n = 0
      for r, s, msg in out:gmatch("CREATE (%d) ([%d.]+) ([^\n]*)") do
        n = n + 1
        assert.is_true(tonumber(s) <= 1.0, "rank " .. r .. " took " .. s .. " s:\n" .. out)
        assert.truthy(msg:find("cuda", 1, true), out)
        if r ~= "2" then assert.truthy(msg:find("rank 2 gave up creating communicator 'w': ", 1, true), out) end
      end
      assert.equal(3, n, out)
    end)
  end

  -- rank 0 raises as soon as it reads rank 2's failure, and an uncaught error ends in
  -- lua_close, whose finalizers free the store: its server must linger there too, until the
  -- late rank has connected and read the failure (it stopped at once, and the late rank spent
  -- its 30 s connecting to nothing, about 1 run in 2; "late": every run)
  for _, late in ipairs { "", "late" } do
    it("under the launcher" .. (late == "" and "" or ", a rank starting 1 s late")
      .. ", every rank prints its own error and the headline names the one that gave up", function()
      -- a long grace and linger: ranks still starting on a loaded 2-core host must get there
      -- (and find rank 0's store still up); a hang shows as a run of 30 s
      local t, rc, out = elapsed(function()
        return H.distlab("run -n 3 --device cpu spec/comm/create_fail.lua lua raise " .. late,
          "DISTLAB_STOP_GRACE=30 DISTLAB_STORE_LINGER=30")
      end)
      assert.equal(1, rc, out)
      assert.truthy(out:find("distlab run: rank 2 of 3 failed (exit code 1)", 1, true), out)
      for r = 0, 1 do
        assert.truthy(out:find("creating shm communicator 'w' on rank " .. r .. " of 3: [^\n]*rank 2 gave up"), out)
      end
      assert.is_false(out:find("still ran", 1, true) ~= nil, out)
      assert.is_true(t <= (late == "" and 10 or 11), "took " .. t .. " s:\n" .. out)
    end)
  end

  it("a send or recv to self outside a group is an error; paired in a group it works; unpaired fails the rank that sent", function()
    local out = H.ranks_ok(3, "self", run(3, "cpu", "self.lua"))
    local _, k = out:gsub("SELF OUT_SEND %d [^\n]*send: rank %d to itself outside a group", "")
    assert.equal(3, k, out)
    _, k = out:gsub("SELF OUT_RECV %d [^\n]*recv: rank %d to itself outside a group", "")
    assert.equal(3, k, out)
    _, k = out:gsub("SELF PAIRED %d ok", "")
    assert.equal(3, k, out)
    -- the rank that sent to itself fails, naming it; the others fail naming it too where their
    -- exchange waited on its group, else their messages all arrived (shm sends as they are posted)
    assert.truthy(out:find("SELF UNPAIRED [%d.]+ 2 [^\n]*rank 2 sent 1 message to itself but received 0 from itself in one group"), out)
    for r = 0, 1 do
      local line = out:match("SELF UNPAIRED [%d.]+ " .. r .. " ([^\n]*)")
      assert.truthy(line == "ok" or line:find("rank 2 sent 1 message to itself", 1, true), out)
    end
  end)
end)
