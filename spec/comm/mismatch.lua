-- spec/comm/mismatch.lua <mode> — ranks that disagree, without debug mode:
-- every rank must end in an error naming the ranks and what differs (it
-- prints "ERR: <message>" and exits 0, so the others report too), never a
-- crash, a hang or a silently wrong result ("NOERR" then fails the spec).
--   symm_size   a symmetric buffer of 16 floats on rank 0, 4096 elsewhere
--   symm_dtype  the same bytes, f32[64] on rank 0 and bf16[128] elsewhere
--   ar_count <algo>          dl.allreduce.run of 1000 elements, rank 1 1001
--   ar_dtype <algo>          f32 on rank 0, bf16 elsewhere
--   ar_algo <algo> <algo2>   rank 1 runs algo2
--   ar_big <algo>            1000 elements, rank 1 70000 (280 KB: over the
--                            tagged limit of one_shot_lamport: 64 KiB at 2 ranks)
--   cp_mask, cp_correction   a CP schedule with a causal mask (fused correction)
--                            on rank 0 and none (post_loop) elsewhere
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local U = dofile(dir .. "/util.lua")
local dl = require "distlab"

local mode = arg[1]
local w = dl.comm.world { timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "5") }
local me = w.rank

local modes = {}

function modes.symm_size()
  local b = dl.symm.alloc(w, { me == 0 and 16 or 4096 }, "f32")
  b:peer((me + 1) % w.size):fill_(1) -- past rank 0's end if the sizes were not checked
  w:barrier()
end

function modes.symm_dtype()
  local b = dl.symm.alloc(w, { me == 0 and 64 or 128 }, me == 0 and "f32" or "bf16")
  b:peer((me + 1) % w.size):fill_(1)
  w:barrier()
end

-- on cuda a run returns at once: check() waits for it and reports its failure
local function ar_run(t, algo)
  local ar = dl.allreduce.get(w)
  ar:run(t, { algo = algo })
  ar:check()
end

function modes.ar_count()
  ar_run(dl.ones(1000 + (me == 1 and 1 or 0)), arg[2])
end

function modes.ar_dtype()
  ar_run(dl.ones(1000, me == 0 and "f32" or "bf16"), arg[2])
end

function modes.ar_big()
  ar_run(dl.ones(me == 1 and 70000 or 1000), arg[2])
end

function modes.ar_algo()
  ar_run(dl.ones(1000), me == 1 and arg[3] or arg[2])
end

function modes.cp_mask()
  dl.cp.attention { comm = w, mask = me == 0 and "causal" or "none" }
end

function modes.cp_correction()
  dl.cp.attention { comm = w, correction = me == 0 and "fused" or "post_loop" }
end

if not modes[mode] then error("unknown mode " .. tostring(mode), 0) end
U.report(modes[mode], 0)
print("NOERR rank " .. me)
