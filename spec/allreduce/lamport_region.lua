-- spec/allreduce/lamport_region.lua — the Lamport region's size: a slot of
-- max_bytes / 4 at 2 ranks, 2 / N of max_bytes at N > 2 (at least 1 MiB, at
-- most max_bytes), or with
-- DISTLAB_AR_LAMPORT_MB=M a region of M MiB in all (2 x N slots); a Lamport
-- call of up to a slot (two_shot_lamport: N / 2 slots at N > 2) runs as one
-- kernel call, a larger one in pieces, and
-- both sum exactly (also after the region's halves have been used in turn).
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local A = dofile(dir .. "/common.lua")
local dl = require "distlab"

local w, me, N = A.w, A.me, A.N
local MiB = 2 ^ 20

local function expected_slot(max_bytes)
  local mb = tonumber(os.getenv("DISTLAB_AR_LAMPORT_MB") or "")
  local ls = mb and math.floor(mb * MiB / (2 * N))
    or math.max(N > 2 and math.floor(2 * max_bytes / N) or math.floor(max_bytes / 4), MiB)
  ls = ls - ls % 4096
  return math.min(ls, max_bytes)
end

A.report(function()
  for _, max_bytes in ipairs { 4096, 2 * MiB, 16 * MiB } do
    local ar = dl.allreduce.new(w, { max_bytes = max_bytes })
    local want = expected_slot(max_bytes)
    if ar.lamport_bytes ~= want or ar:info().lamport_bytes ~= want then
      error(string.format("max_bytes %d at %d ranks: Lamport slot %d, expected %d", max_bytes, N, ar.lamport_bytes,
        want), 0)
    end
    ar:free()
  end
  local ar = dl.allreduce.new(w, { max_bytes = 16 * MiB })
  local call = 0
  for _, algo in ipairs { "one_shot_lamport", "two_shot_lamport" } do
    for _, bytes in ipairs { 3 * MiB, 3 * MiB, 3 * MiB + 32, 5 * MiB } do -- twice: both halves
      call = call + 1
      local n = bytes / 2
      local x = A.exact_input(n, "bf16", call, me)
      local before = ar:info().calls
      ar:run(x, { algo = algo })
      ar:check()
      -- two_shot_lamport's pieces are N / 2 slots (each slot holds two of the N slices)
      local most = (algo == "two_shot_lamport" and N > 2) and ar.lamport_bytes / 2 * N or ar.lamport_bytes
      local pieces, want = ar:info().calls - before, math.ceil(bytes / most)
      if pieces ~= want then
        error(string.format("%s on %d bytes (slot %d): %d kernel calls, expected %d", algo, bytes, ar.lamport_bytes,
          pieces, want), 0)
      end
      A.exact_check(x, call, algo .. " on " .. bytes .. " bytes")
    end
  end
  ar:free()
  w:barrier()
  print(string.format("lamport_region ok: rank %d of %d, slot %d", me, N, expected_slot(16 * MiB)))
end)
