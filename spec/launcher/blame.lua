-- Run by spec/launcher_spec.lua under `distlab run -n N`: rank 0 gives up on
-- the world (its abort reaches the others at once) and fails a second later,
-- so the other ranks fail first, each blaming rank 0 ("rank 0 gave up"): the
-- launcher's headline must still name rank 0, with rank 0's own error.
local ffi = require "ffi"
local dl = require "distlab"
ffi.cdef "int poll(void *fds, unsigned long n, int timeout_ms);"
local w = dl.comm.world()
if w.rank == 0 then
  w:abort("rank 0 found its input corrupt")
  ffi.C.poll(nil, 0, 1000)
  error("rank 0: corrupt input (the first failure)", 0)
end
w:barrier()
