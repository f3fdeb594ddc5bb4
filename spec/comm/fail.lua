-- spec/comm/fail.lua <mode> — one failure each, to show it ends in a clear
-- error within the timeout: rank 0 (or every rank) prints "ERR: <message>"
-- and exits 0 (so the launcher lets the others report too), except in
-- mode exit, where rank 0's failure must end the job with a non-zero code.
--   exit      rank 1 exits without a word; rank 0 all-reduces
-- (on cuda ops are asynchronous: the error comes from w:synchronize())
--   never     rank 1 never calls; rank 0 times out, then its comm refuses ops
--   size      ranks all-reduce different sizes
--   dtype     ranks all-reduce different dtypes
--   reduction ranks all-reduce with different reductions (sum, max)
--   root      ranks broadcast from different roots
--   p2p       recv expects more than the send carries
--   p2p_dtype send f32[4], recv bf16[8]: the same bytes, another dtype
--   late      rank 1 calls after rank 0 timed out on the same all-reduce
--   counts    all_to_allv counts that do not match across ranks
--   debug     debug mode (checks through the store) catches a size mismatch
--   symmflag  rank 0 waits on a flag that no one sets
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local U = dofile(dir .. "/util.lua")
local dl = require "distlab"

local mode = arg[1]
local timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "2")
local w = dl.comm.world { timeout = timeout }
local me = w.rank
w:barrier()
local t0 = os.time()

local function elapsed() return os.time() - t0 end

U.report(function()
  if mode == "exit" then
    if me == 1 then os.exit(0) end
    w:all_reduce(dl.ones(8), "sum")
    w:synchronize()
  elseif mode == "never" then
    if me == 1 then
      U.sleep(timeout + 1.5)
      return
    end
    local ok, err = pcall(function()
      w:all_reduce(dl.ones(8), "sum")
      w:synchronize()
    end)
    print("FIRST: " .. tostring(err) .. " ELAPSED " .. elapsed())
    w:all_reduce(dl.ones(8), "sum")
  elseif mode == "size" then
    w:all_reduce(dl.ones(10 + me), "sum")
  elseif mode == "dtype" then
    w:all_reduce(dl.ones(10, me == 0 and "f32" or "bf16"), "sum")
  elseif mode == "reduction" then
    w:all_reduce(dl.ones(10), me == 0 and "sum" or "max")
  elseif mode == "root" then
    w:broadcast(dl.ones(10), me)
  elseif mode == "p2p" then
    if me == 0 then w:send(dl.ones(10), 1) else w:recv(dl.ones(11), 0) end
    w:barrier() -- the sender's next op fails too (the receiver gave up)
  elseif mode == "p2p_dtype" then
    if me == 0 then w:send(dl.ones(4), 1) else w:recv(dl.ones(8, "bf16"), 0) end
    w:barrier()
  elseif mode == "late" then
    -- rank 1 comes after rank 0 timed out: it must fail too, not complete
    -- the all-reduce against rank 0's abandoned one
    if me == 1 then U.sleep(timeout + 1) end
    local ok, err = pcall(w.all_reduce, w, dl.ones(8), "sum")
    if me == 0 then
      print("FIRST: " .. tostring(err))
      U.sleep(3) -- serve the store until rank 1 is done
    end
    if not ok then error(err, 0) end
  elseif mode == "counts" then
    local send = me == 0 and { 2, 3 } or { 1, 1 }
    local recv = me == 0 and { 2, 1 } or { 4, 1 }
    w:all_to_allv(dl.zeros(8), recv, dl.ones(8), send)
  elseif mode == "debug" then
    w:set_debug(true)
    w:all_reduce(dl.ones(10), "sum")
    w:all_reduce(dl.ones(10 + me), "max")
  elseif mode == "symmflag" then
    local b = dl.symm.alloc(w, { 16 }, "f32")
    if me == 0 then
      b:wait_flag(5, 1)
      b:check()
    else
      -- stay out of any wait until rank 0's flag wait has timed out: a barrier
      -- with the same timeout would race it, and rank 1 giving up first makes
      -- rank 0 report rank 1's exit instead of the flag
      U.sleep(timeout + 1)
    end
    w:barrier()
  else
    error("unknown mode " .. tostring(mode), 0)
  end
end, mode == "exit" and 3 or 0)
print("NOERR rank " .. me)
