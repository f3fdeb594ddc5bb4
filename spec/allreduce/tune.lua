-- spec/allreduce/tune.lua <file> — dl.allreduce.tune measures every algorithm
-- at a few sizes, writes its table to <file>, and "auto" then runs what the
-- table says for each size (on every rank the same), and stays correct.
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
  assert(#entry.measured >= #sizes * #dl.allreduce.algos, "tune measured " .. #entry.measured .. " cases")
  -- each size's row is its fastest candidate after the near-ties were timed again
  local fastest = {}
  for _, m in ipairs(entry.measured) do
    assert(m.timings >= 1, "a measurement without timings")
    local f = fastest[m.bytes]
    if not f or m.us < f.us then fastest[m.bytes] = m end
  end
  for _, bytes in ipairs(sizes) do
    local algo, blocks = dl.allreduce.choose(bytes, w)
    local f = fastest[bytes]
    assert(f and f.algo == algo and f.blocks == blocks, string.format("at %d bytes the table says %s/%d, the fastest "
      .. "measured was %s/%d", bytes, algo, blocks, f and f.algo or "-", f and f.blocks or -1))
  end
  -- auto now follows the file
  local e, from = dl.allreduce.table(w)
  assert(from == file, "auto reads " .. tostring(from) .. ", not the tuned file")
  for _, bytes in ipairs(sizes) do
    local algo, blocks = dl.allreduce.choose(bytes, w)
    local best
    for _, r in ipairs(entry.rows) do
      if not best and (not r.upto or bytes <= r.upto) then best = r end
    end
    assert(algo == best.algo and blocks == best.blocks, string.format("choose(%d) = %s/%d, the table says %s/%d", bytes,
      algo, blocks, best.algo, best.blocks))
    local n = bytes / 2
    local x = A.exact_input(n, "bf16", bytes, me)
    dl.allreduce.run(x, { algo = "auto" })
    A.exact_check(x, bytes, "auto at " .. bytes .. " bytes")
  end
  w:barrier()
  print(string.format("tune ok: rank %d of %d on %s, %d rows", me, A.N, w.device, #e.rows))
end)
