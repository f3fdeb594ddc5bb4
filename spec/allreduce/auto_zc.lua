-- spec/allreduce/auto_zc.lua <file> <mode> — "auto" on inputs in the
-- all-reduce's zero-copy region (ar:buffer), with a test table written to
-- <file> (the caller sets DISTLAB_AR_TABLE=<file>).
--   pick       an input in the region, in place, follows the entry's zc_rows;
--              an ordinary one, one out of place or off the 16-byte grid
--              follows its rows; an entry without zc_rows, rows for all.
--              Which algorithm ran shows in ar:info().calls (nccl issues no
--              kernel). Prints "auto_zc ok".
--   mismatch   rank 0 passes a buffer input, the others an ordinary tensor:
--              zc_rows say two_shot, rows one_shot. Every rank prints ERR:.
--   mismatch_same  as mismatch, both rows two_shot_push (zero copy against
--              copy-in). Every rank prints ERR:.
-- With DEBUG=1 in the environment the communicator's debug mode is on.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local A = dofile(dir .. "/common.lua")
local dl = require "distlab"
local T = require "distlab.allreduce.table"

local w, me, N = A.w, A.me, A.N
local file, mode = assert(arg[1], "usage: auto_zc.lua <table file> <mode>"), arg[2] or "pick"
if os.getenv("DEBUG") == "1" then w:set_debug(true) end

local function write_table(rows, zc_rows)
  if me == 0 then
    local f = assert(io.open(file, "w"))
    f:write(dl.allreduce.serialize { { device = T.device_name(w), world = N, dtype = "f32", rows = rows,
      zc_rows = zc_rows } })
    f:close()
  end
  w:barrier()
  T.forget()
end

local ar = dl.allreduce.get(w)

-- auto on x (into out): what it chose, and the kernel calls it issued
local function auto(x, out, call)
  local n = x:numel()
  x:copy_(A.exact_input(n, "f32", call, me))
  local algo = ar:choose(x, out)
  local before = ar:info().calls
  ar:run(x, { algo = "auto", out = out })
  ar:check()
  A.exact_check(out or x, call, "auto " .. algo)
  return algo, ar:info().calls - before
end

local function expect(what, want_algo, want_calls, x, out, call)
  local algo, calls = auto(x, out, call)
  if algo ~= want_algo or calls ~= want_calls then
    error(string.format("%s: auto chose %s (%d kernel calls), expected %s (%d)", what, algo, calls, want_algo, want_calls), 0)
  end
end

local modes = {}

function modes.pick()
  write_table({ { algo = "one_shot", blocks = 0 } },
    { { upto = 4096, algo = "two_shot", blocks = 0 }, { algo = "nccl", blocks = 0 } })
  local x = dl.empty({ 1000 })
  expect("ordinary 4000 B", "one_shot", 1, x, nil, 1)
  expect("in the region 4000 B", "two_shot", 1, ar:buffer({ 1000 }, "f32", 64), nil, 2)
  expect("in the region 8192 B", "nccl", 0, ar:buffer({ 2048 }, "f32"), nil, 3)
  expect("in the region, out of place", "one_shot", 1, ar:buffer({ 1000 }, "f32"), dl.empty({ 1000 }), 4)
  local off_grid = ar:buffer({ 1001 }, "f32"):narrow(1, 2, 1000) -- 4 bytes in
  expect("in the region off the 16-byte grid", "one_shot", 1, off_grid, nil, 5)
  assert(ar:region_offset(ar:buffer({ 8 }, "f32", 4096)) == 4096 and ar:region_offset(off_grid) == nil and
    ar:region_offset(x) == nil, "region_offset")
  -- a table without zc_rows: rows for every input
  write_table({ { algo = "one_shot", blocks = 0 } }, nil)
  expect("no zc_rows, in the region", "one_shot", 1, ar:buffer({ 1000 }, "f32"), nil, 6)
  w:barrier()
  print(string.format("auto_zc ok: rank %d of %d", me, N))
end

local function mismatch(rows_algo, zc_algo)
  write_table({ { algo = rows_algo, blocks = 0 } }, { { algo = zc_algo, blocks = 0 } })
  local x = me == 0 and ar:buffer({ 1000 }, "f32") or dl.empty({ 1000 })
  x:fill_(1)
  local ok, err = pcall(function()
    ar:run(x, { algo = "auto" })
    ar:check()
  end)
  print("ERR: " .. tostring(err))
  io.stdout:flush()
  -- rank 0 serves the store: it stays until every rank has read its call
  pcall(w.barrier, w)
  os.exit(ok and 1 or 0)
end

function modes.mismatch() mismatch("one_shot", "two_shot") end
function modes.mismatch_same() mismatch("two_shot_push", "two_shot_push") end

if not modes[mode] then error("unknown mode " .. tostring(mode), 0) end
A.report(modes[mode])
