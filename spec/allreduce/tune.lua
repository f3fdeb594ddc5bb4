-- spec/allreduce/tune.lua <file> — dl.allreduce.tune measures every algorithm
-- at a few sizes, on ordinary tensors and on inputs in the zero-copy region,
-- writes its table (rows and zc_rows) to <file>, and "auto" then runs what
-- the table says for each size and kind of input (on every rank the same),
-- and stays correct.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local A = dofile(dir .. "/common.lua")
local dl = require "distlab"

local w, me = A.w, A.me
local file = assert(arg[1], "usage: tune.lua <table file>")

A.report(function()
  local sizes = { 64, 4096, 256 * 1024 }
  local entry, path = dl.allreduce.tune { sizes = sizes, file = file, replays = 3, log = function() end }
  assert(path == file, "tune wrote " .. tostring(path))
  assert(entry.world == A.N and #entry.rows >= 1, "tune returned no rows")
  assert(#entry.measured >= 2 * #sizes * #dl.allreduce.algos, "tune measured " .. #entry.measured .. " cases")
  assert(entry.zc_rows and #entry.zc_rows >= 1, "tune wrote no zc_rows")
  -- each size's row is its fastest candidate after the near-ties were timed
  -- again, apart for ordinary and zero-copy inputs
  local fastest = { [false] = {}, [true] = {} }
  for _, m in ipairs(entry.measured) do
    assert(m.timings >= 1, "a measurement without timings")
    local f = fastest[m.zc][m.bytes]
    if not f or m.us < f.us then fastest[m.zc][m.bytes] = m end
  end
  for _, zc in ipairs { false, true } do
    for _, bytes in ipairs(sizes) do
      local algo, blocks = dl.allreduce.choose(bytes, w, zc)
      local f = fastest[zc][bytes]
      assert(f and f.algo == algo and f.blocks == blocks, string.format("at %d bytes%s the table says %s/%d, the fastest "
        .. "measured was %s/%d", bytes, zc and " (zc)" or "", algo, blocks, f and f.algo or "-", f and f.blocks or -1))
    end
  end
  -- auto now follows the file: an ordinary tensor the rows, an input in the
  -- region (in place) the zc_rows
  local e, from = dl.allreduce.table(w)
  assert(from == file, "auto reads " .. tostring(from) .. ", not the tuned file")
  local ar = dl.allreduce.get(w)
  for _, zc in ipairs { false, true } do
    for _, bytes in ipairs(sizes) do
      local best
      for _, r in ipairs(zc and entry.zc_rows or entry.rows) do
        if not best and (not r.upto or bytes <= r.upto) then best = r end
      end
      local n = bytes / 2
      local x = A.exact_input(n, "bf16", bytes, me)
      if zc then
        local z = ar:buffer({ n }, "bf16")
        z:copy_(x)
        x = z
      end
      local algo, blocks = ar:choose(x)
      assert(algo == best.algo and blocks == best.blocks, string.format("choose(%d%s) = %s/%d, the table says %s/%d",
        bytes, zc and ", zc" or "", algo, blocks, best.algo, best.blocks))
      dl.allreduce.run(x, { algo = "auto" })
      A.exact_check(x, bytes, "auto at " .. bytes .. " bytes" .. (zc and " (zc)" or ""))
    end
  end
  w:barrier()
  print(string.format("tune ok: rank %d of %d on %s, %d rows", me, A.N, w.device, #e.rows))
end)
