-- All-reduce family (distlab.allreduce) and graphs (distlab.graph): every
-- algorithm against an fp64 sum for bf16/f16/f32 and sizes 1, 7, 4095 and
-- 2^20+3; 1000 calls back to back; graph replays among eager calls; a peer
-- that never comes; the Lamport region's size; tuning and the dispatch table,
-- and what "auto" runs on an input in the zero-copy region. The multi-rank parts run
-- scripts under spec/allreduce/ through `./distlab run -n N` on 2 and 4 cpu
-- ranks (the CPU twins over shared memory) and, tagged #multigpu, on 2 GPUs.
local ffi = require "ffi"
local dl = require "distlab"
local H = require "helpers"
local C = require("distlab.core").C

local run, comm_run = H.ranks("allreduce"), H.ranks("comm")

-- the algorithms run by kernels (all but the communicator's own)
local A_kernels = {}
for _, a in ipairs(dl.allreduce.algos) do if a ~= "nccl" then A_kernels[#A_kernels + 1] = a end end

-- auto_zc.lua's "pick" on n ranks: auto on an input in the zero-copy region follows a test table's zc_rows
local function auto_zc_picks(n, device)
  local file = H.tmpname(".lua")
  local rc, out = run(n, device, "auto_zc.lua", file .. " pick", "DISTLAB_AR_TABLE=" .. file)
  os.remove(file)
  H.ranks_ok(n, "auto_zc", rc, out)
end

local scripts = {
  { "correct.lua", "correct", "every algorithm, dtype and size against the fp64 sum" },
  { "backtoback.lua", "backtoback", "1000 calls back to back, alternating sizes, dtypes and algorithms" },
  { "graph.lua", "graph", "graph replays stay exact among eager calls" },
}

-- Without debug mode: the kernels compare every rank's call descriptor
-- (kernels/allreduce/allreduce.h, dl_ar_call_t) before reading its data
-- (one_shot_lamport's tagged vectors: as their tags say another call), so
-- ranks that call differently fail at once, every one naming what differs.
-- (Ranks that share a GPU talk through the ipc communicator, which keeps
-- debug mode on: there its store check names the difference first, in its
-- own words; `strict` expects the kernels' words.)
local function mismatches(device, worlds, algos, strict)
  local function mismatch(n, args)
    local t0 = os.time()
    local rc, out = comm_run(n, device, "mismatch.lua", args, "SPEC_TIMEOUT=20")
    assert.equal(0, rc, out)
    assert.falsy(out:find("NOERR", 1, true), out)
    assert.is_true(os.time() - t0 <= 10, "took " .. os.time() - t0 .. " s (the timeout is 20 s)")
    return out
  end
  local function every_rank(out, n, pattern)
    for r = 0, n - 1 do
      assert.truthy(out:find("ERR: [^\n]*all_reduce [%w_]+ on rank " .. r .. " of " .. n .. " [^\n]*" .. pattern), out)
    end
  end

  it("mismatched sizes fail at once on every rank, naming the sizes (" .. table.concat(algos, ", ") .. ")", function()
    for _, algo in ipairs(algos) do
      local out = mismatch(worlds[1], "ar_count " .. algo)
      every_rank(out, worlds[1], strict and "mismatched calls %(the buffer's call 0%): rank %d runs " .. algo ..
        " on 100[01] f32 [^\n]* but rank %d runs " .. algo .. " on 100[01] f32 [^\n]*%(differs: elements 100[01] vs 100[01]"
        or "mismatched [^\n]*calls[^\n]*%(differs: [^\n]*100[01][^\n]* vs [^\n]*100[01]")
    end
  end)

  it("mismatched dtypes or algorithms fail at once on every rank, naming them (" ..
    table.concat(worlds, " and ") .. " ranks)", function()
    for _, n in ipairs(worlds) do
      every_rank(mismatch(n, "ar_dtype one_shot_push"), n, "differs: [^\n]*dtype [bf3216]+ vs [^\n]*[bf3216]+")
      for _, ab in ipairs { { "one_shot", "two_shot" }, { "two_shot_write", "one_shot_lamport" } } do
        local out = mismatch(n, "ar_algo " .. ab[1] .. " " .. ab[2])
        for r = 0, n - 1 do -- the differing part names both algorithms, in either order
          local line = out:match("ERR: [^\n]*all_reduce [%w_]+ on rank " .. r .. " of " .. n .. "[^\n]*")
          local diff = line and line:match("%(differs: ([^\n]*)")
          assert.truthy(diff and diff:find("%f[%w_]" .. ab[1] .. "%f[^%w_]") and diff:find("%f[%w_]" .. ab[2] .. "%f[^%w_]"), out)
          if strict then assert.truthy(diff:find("^algorithm [%w_]+ vs [%w_]+"), out) end
        end
      end
    end
  end)
end

describe("allreduce on cpu (shared memory)", function()
  for _, n in ipairs { 2, 4 } do
    for _, s in ipairs(scripts) do
      it(n .. " ranks: " .. s[3], function()
        H.ranks_ok(n, s[2], run(n, "cpu", s[1]))
      end)
    end
  end

  it("2 ranks: a peer that never comes ends in an error naming the op, rank and peer", function()
    for _, algo in ipairs { "one_shot", "two_shot_push", "two_shot_write", "one_shot_lamport", "two_shot_lamport" } do
      local t0 = os.time()
      local rc, out = run(2, "cpu", "fail.lua", algo, "SPEC_TIMEOUT=1")
      assert.equal(0, rc, out)
      assert.truthy(out:find("ERR: [^\n]*all_reduce " .. algo .. " on rank 0 of 2 %(comm 'w', cpu:0%): rank 1 did not arrive within 1.0 s"), out)
      assert.truthy(out:find("AFTER: [^\n]*this all%-reduce failed earlier and refuses work"), out)
      assert.is_true(os.time() - t0 <= 10)
    end
  end)

  mismatches("cpu", { 2, 3 }, A_kernels, true)

  -- one_shot_lamport's small calls go as tagged vectors (kernels/allreduce/allreduce.h):
  -- no rank waits for the others' calls, the tags in the data say which call sent it
  it("one_shot_lamport, tagged or not (DISTLAB_AR_TAGGED_MAX_BYTES): sizes under the limit, one under and one " ..
    "over, dtypes and a flag-based algorithm that differ fail at once on every rank, naming what differs", function()
    for _, env in ipairs { "DISTLAB_AR_TAGGED_MAX_BYTES=262144", "DISTLAB_AR_TAGGED_MAX_BYTES=0" } do
      local on = env ~= "DISTLAB_AR_TAGGED_MAX_BYTES=0"
      local tag = on and ", tagged%)" or ", copy%-in%)"
      for _, n in ipairs { 2, 3 } do
        for _, c in ipairs {
          { "ar_count one_shot_lamport", "on 100[01] f32 [^\n]*" .. tag .. " but rank %d runs one_shot_lamport on 100[01] f32 " ..
            "[^\n]*" .. tag .. " %(differs: elements 100[01] vs 100[01]%)" },
          { "ar_big one_shot_lamport", "%(differs: elements [17]0000? vs [17]0000?" ..
            (on and "[^\n]*; tagged [01] vs [01] %(the size limit" or "[;)]") },
          { "ar_dtype one_shot_lamport", "%(differs: dtype [bf3216]+ vs [bf3216]+[;)]" },
          { "ar_algo one_shot_lamport two_shot_write", "%(differs: algorithm [%w_]+ vs [%w_]+" },
          { "ar_algo one_shot_lamport two_shot_lamport", "%(differs: algorithm [%w_]+ vs [%w_]+" },
        } do
          local t0 = os.time()
          local rc, out = comm_run(n, "cpu", "mismatch.lua", c[1], "SPEC_TIMEOUT=20 " .. env)
          assert.equal(0, rc, out)
          assert.falsy(out:find("NOERR", 1, true), out)
          assert.is_true(os.time() - t0 <= 10, "took " .. os.time() - t0 .. " s (the timeout is 20 s)")
          for r = 0, n - 1 do
            assert.truthy(out:find("ERR: [^\n]*all_reduce [%w_]+ on rank " .. r .. " of " .. n ..
              " [^\n]*mismatched calls [^\n]*" .. c[2]), c[1] .. " " .. env .. "\n" .. out)
          end
        end
      end
    end
  end)

  it("2, 3 and 4 ranks: the Lamport region holds a quarter of max_bytes a slot at 2 ranks, 2 / N of it at N > 2 " ..
    "(or DISTLAB_AR_LAMPORT_MB in all; also with DISTLAB_AR_LAMPORT_PAD_KB between the slots); " ..
    "a call up to a slot (two_shot_lamport: N / 2 slots at 3+ ranks) is one piece", function()
    for _, n in ipairs { 2, 3, 4 } do
      for _, env in ipairs { "", "DISTLAB_AR_LAMPORT_MB=8", "DISTLAB_AR_LAMPORT_MB=32", "DISTLAB_AR_LAMPORT_PAD_KB=4" } do
        H.ranks_ok(n, "lamport_region", run(n, "cpu", "lamport_region.lua", "", env))
      end
    end
  end)

  it("2 and 4 ranks: auto on an input in the zero-copy region follows the table's zc_rows (in place only)", function()
    for _, n in ipairs { 2, 4 } do
      auto_zc_picks(n, "cpu")
    end
  end)

  it("2 ranks: auto with a zero-copy input on one rank only is refused on every rank, debug mode or not", function()
    for _, c in ipairs {
      { "mismatch", "", "mismatched calls [^\n]*%(differs: algorithm [%w_]+ vs [%w_]+; [^\n]*zero copy [01] vs [01]%)" },
      { "mismatch_same", "", "mismatched calls [^\n]*%(differs: zero copy [01] vs [01]%)" },
      { "mismatch", "DEBUG=1", "mismatched all%-reduce calls: [^\n]*%(differs: [%w_]+ vs [%w_]+; [%w -]+ vs [%w -]+%)" },
      { "mismatch_same", "DEBUG=1", "mismatched all%-reduce calls: [^\n]*%(differs: [%w -]+ vs [%w -]+%)" },
    } do
      local file = H.tmpname(".lua")
      local rc, out = run(2, "cpu", "auto_zc.lua", file .. " " .. c[1], "SPEC_TIMEOUT=10 DISTLAB_AR_TABLE=" .. file .. " " .. c[2])
      os.remove(file)
      assert.equal(0, rc, out)
      for r = 0, 1 do
        assert.truthy(out:find("ERR: [^\n]*all_reduce [%w_]+ on rank " .. r .. " of 2 [^\n]*" .. c[3]), out)
      end
    end
  end)

  it("2 ranks: the communicator's debug mode catches mismatched calls", function()
    local rc, out = run(2, "cpu", "fail.lua", "mismatch", "SPEC_TIMEOUT=5")
    assert.equal(0, rc, out)
    local _, k = out:gsub("ERR: [^\n]*mismatched all%-reduce calls: rank %d runs two_shot, 10[01] elements, dtype f32, " ..
      "[^\n]*%(differs: 10[01] elements vs 10[01] elements%)", "")
    assert.equal(2, k, out)
  end)

  it("a bad all-reduce knob in the environment is an error naming it", function()
    for _, env in ipairs { "DISTLAB_AR_POLL_NS=abc", "DISTLAB_AR_PDL=2", "DISTLAB_AR_ROUND_KB=-4",
      "DISTLAB_AR_LAMPORT_AHEAD=-1", "DISTLAB_AR_LAMPORT_MB=0", "DISTLAB_AR_LAMPORT_MB=1.5",
      "DISTLAB_AR_LAMPORT_MB=99999", "DISTLAB_AR_LONG_POLL_NS=x", "DISTLAB_AR_GONE_GAP_US=-1",
      "DISTLAB_AR_TAGGED_MAX_BYTES=-1", "DISTLAB_AR_LONG_POLL_AFTER=4",
      "DISTLAB_AR_LAMPORT_PAD_KB=-1" } do
      local rc, out = run(1, "cpu", "fail.lua", "knob", env)
      assert.equal(0, rc, out)
      local name = env:match("^[%w_]+")
      assert.truthy(out:find("ERR: [^\n]*dl_allreduce_new: " .. name .. "=[^\n]*an integer from"), out)
    end
  end)

  it("2 ranks: tune writes a table that auto follows", function()
    local file = H.tmpname(".lua")
    local rc, out = run(2, "cpu", "tune.lua", file, "DISTLAB_AR_TABLE=" .. file)
    os.remove(file)
    H.ranks_ok(2, "tune", rc, out)
  end)
end)

describe("allreduce algorithms", function()
  it("are named by the library (one table, kernels/allreduce/algos.h), numbered from 0, each name once", function()
    local n, seen = #dl.allreduce.algos, {}
    assert.equal("nccl", dl.allreduce.algos[1])
    for i, name in ipairs(dl.allreduce.algos) do
      assert.equal(name, ffi.string(C.dl_allreduce_algo_name(i - 1)))
      assert.is_nil(seen[name], name)
      seen[name] = true
    end
    assert.is_true(C.dl_allreduce_algo_name(n) == nil)
    assert.is_true(C.dl_allreduce_algo_name(-1) == nil)
  end)

  it("run takes every name, and an unknown one is an error listing them", function()
    local ar = dl.allreduce.new(dl.comm.meta(2, 0))
    local t = dl.empty({ 4 }, { device = "meta" })
    for _, algo in ipairs(dl.allreduce.algos) do ar:run(t, { algo = algo }) end
    local ok, err = pcall(ar.run, ar, t, { algo = "three_shot" })
    ar:free()
    assert.is_false(ok)
    assert.truthy(err:find('unknown all-reduce algorithm "three_shot" (auto, ' .. table.concat(dl.allreduce.algos, ", ")
      .. ")", 1, true), err)
  end)
end)

describe("allreduce tables", function()
  local ar = require "distlab.allreduce"

  it("ship provisional entries for H100/H200 at 2 ranks and generic ones for 2, 4, 6, 8", function()
    local chunk = assert(loadfile(ar.shipped_file))
    local entries = chunk()
    local have = {}
    for _, e in ipairs(entries) do
      have[e.device .. "/" .. e.world] = e
      for i, r in ipairs(e.rows) do
        local known = false
        for _, a in ipairs(ar.algos) do known = known or a == r.algo end
        assert.truthy(known, "row " .. i .. " of " .. e.device .. ": algorithm " .. tostring(r.algo))
        if i < #e.rows then assert.is_number(r.upto) end
      end
    end
    for _, k in ipairs { "NVIDIA H200/2", "NVIDIA H100 80GB HBM3/2", "*/2", "*/4", "*/6", "*/8" } do
      assert.truthy(have[k], "no entry " .. k)
    end
  end)

  it("round-trip through serialize", function()
    local e = { { device = "X", world = 2, dtype = "bf16", rows = { { upto = 4096, algo = "one_shot", blocks = 8 },
      { algo = "nccl", blocks = 0 } } }, { device = "Y", world = 4, dtype = "bf16", rows = { { algo = "nccl", blocks = 0 } },
      zc_rows = { { upto = 65536, algo = "two_shot_lamport", blocks = 16 }, { algo = "two_shot_push", blocks = 0 } } } }
    local back = loadstring(ar.serialize(e))()
    assert.same(e, back)
  end)
end)

describe("allreduce on meta", function()
  it("accepts every algorithm and moves nothing", function()
    local file = H.write(H.tmpname(".lua"), [[
      local dl = require "distlab"
      local w = dl.comm.meta(8, 3)
      local ar = dl.allreduce.new(w, { max_bytes = 2 ^ 20 })
      local t = dl.empty({ 1000 }, { dtype = "bf16", device = "meta" })
      for _, algo in ipairs(dl.allreduce.algos) do ar:run(t, { algo = algo }) end
      ar:run(t, { algo = "auto" })
      print("meta ok")
    ]])
    local rc, out = H.distlab("run --device meta --world 8 --rank 3 " .. file)
    os.remove(file)
    assert.equal(0, rc, out)
    assert.truthy(out:find("meta ok", 1, true), out)
  end)
end)

describe("graph on cpu", function()
  it("records a function and replays it on the current stream", function()
    local t = dl.zeros({ 4 })
    local g = dl.graph.capture(function() t:add_(1) end)
    assert.same({ 0, 0, 0, 0 }, t:tolist()) -- nothing ran at capture
    for _ = 1, 3 do g:replay() end
    assert.same({ 3, 3, 3, 3 }, t:tolist())
    g:free()
    assert.has_error(function() g:replay() end)
  end)
end)

-- DISTLAB_SPEC_RANKS=N (scripts/gpu/shared.sh: ranks sharing one GPU) runs
-- the correctness, back-to-back and graph cases at N ranks instead of 2;
-- DISTLAB_SPEC_GPUS=4 (scripts/gpu/allreduce.sh with NRANKS=4) adds them at
-- that many ranks.
local gpu_worlds = { H.gpu_ranks }
local more = tonumber(os.getenv("DISTLAB_SPEC_GPUS") or "")
if more and more ~= H.gpu_ranks then gpu_worlds[2] = more end

describe("allreduce on GPUs (DISTLAB_SPEC_RANKS, and DISTLAB_SPEC_GPUS) #multigpu", function()
  for _, n in ipairs(gpu_worlds) do
    for _, s in ipairs(scripts) do
      it(n .. " ranks: " .. s[3], function()
        H.ranks_ok(n, s[2], run(n, "cuda", s[1]))
      end)
    end
  end

  it("a peer that never comes: the kernel ends by itself, check() names the op, rank and peer", function()
    for _, algo in ipairs(dl.allreduce.algos) do
      if algo ~= "nccl" then -- the kernels (NCCL's own timeouts: spec/comm_spec.lua)
        local t0 = os.time()
        local rc, out = run(2, "cuda", "fail.lua", algo, "SPEC_TIMEOUT=2")
        assert.equal(0, rc, out)
        assert.truthy(out:find("ERR: [^\n]*all_reduce " .. algo .. " on rank 0 of 2 %(comm 'w', cuda:0%): rank 1 did not arrive within 2.0 s"), out)
        assert.truthy(out:find("AFTER: [^\n]*this all%-reduce failed earlier and refuses work"), out)
        assert.is_true(os.time() - t0 <= 30)
      end
    end
  end)

  mismatches("cuda", { H.gpu_ranks }, { "one_shot", "two_shot", "one_shot_push_flat", "two_shot_lamport" })

  it("the Lamport region's slot, a call up to it in one piece; auto on a zero-copy input follows zc_rows", function()
    for _, n in ipairs(gpu_worlds) do
      for _, env in ipairs { "", "DISTLAB_AR_LAMPORT_MB=32" } do
        H.ranks_ok(n, "lamport_region", run(n, "cuda", "lamport_region.lua", "", env))
      end
      auto_zc_picks(n, "cuda")
    end
  end)

  it("tune writes a table that auto follows", function()
    local file = H.tmpname(".lua")
    local rc, out = run(2, "cuda", "tune.lua", file, "DISTLAB_AR_TABLE=" .. file)
    os.remove(file)
    H.ranks_ok(2, "tune", rc, out)
  end)
end)
