-- spec/comm/create_fail.lua [lua|c] — the last rank cannot create the
-- communicator the others are creating (the ipc backend on cuda:4096, a
-- device no host has, so that it fails on GPU hosts too: in comm.new's
-- check, "lua", or in the core's, "c"); it tells them through the
-- store, and every rank ends at once with an error naming it. Prints
-- "CREATE <rank> <seconds> <message>"; the timeout is 30 s. With "raise"
-- after the mode, each rank raises its error instead (the launcher's view);
-- with "late" after that, rank 1 starts 1 s after the others, when rank 0
-- has long read rank 2's failure and raised: it must still find the store
-- (rank 0's, freed by lua_close's finalizers after the raise) and read it.
local ffi = require "ffi"
local dl = require "distlab"
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local U = dofile(dir .. "/util.lua")

local e = dl.comm.env()
local last = e.rank == e.world_size - 1
local t0 = dl.now_us()
local NO_DEVICE = 4096
local function make()
  if not last then return dl.comm.new { timeout = 30 } end
  if arg[1] == "c" then
    local store = dl.comm.store { timeout = 30 }
    local pp = ffi.new("dl_comm_t*[1]")
    dl.check(dl.C.dl_comm_new(pp, dl.C.DL_COMM_IPC, store.ptr, e.rank, e.world_size, NO_DEVICE, 30))
  else
    return dl.comm.new { backend = "ipc", device = "cuda:" .. NO_DEVICE, timeout = 30 }
  end
end
if arg[2] == "raise" then
  if arg[3] == "late" and e.rank == 1 then U.sleep(1) end
  make()
  os.exit(0)
end
local ok, err = pcall(make)
io.stdout:write(string.format("CREATE %d %.3f %s\n", e.rank, (dl.now_us() - t0) / 1e6,
  ok and "made" or tostring(err):gsub("\n", " ")))
io.stdout:flush()
os.exit(0)
