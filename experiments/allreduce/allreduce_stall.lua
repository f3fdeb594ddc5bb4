-- experiments/allreduce/allreduce_stall.lua — do back-to-back all-reduces
-- stay slow after one rank starts late? Per case (size, algorithm, grid) and
-- per start skew: the sweep's method (a CUDA graph of 10 calls, 3 warm-up
-- replays, a barrier, then the replays back to back), except that after the
-- barrier the last rank spins `skew` us on the host before it queues its
-- replays. A skew delays the first replay only; if the median replay stays
-- slow, late starts feed themselves (a late rank's peers wait, their waits
-- slow them, they are late at the next call). Reports, max over ranks, the
-- median, the slowest, and how many replays took over twice the fastest.
--
--   ./distlab run -n 2 --device cuda experiments/allreduce/allreduce_stall.lua [options]
--     --sizes LIST   bytes (default 2M,8M)
--     --cases LIST   algo:blocks (0: the kernels' own grid), default
--                    one_shot_lamport:264,two_shot_lamport:264,two_shot_lamport:0,one_shot:0
--     --skews LIST   us the last rank starts late (default 0,300,3000)
--     --replays N    timed replays per case (default 40)
--     --tag NAME     results: allreduce-stall-TAG.{md,csv}
-- Run it once per setting of a knob to compare (scripts/gpu/allreduce.sh stall
-- runs it per word of STALL_VARIANTS); the DISTLAB_AR_* knobs set are named in
-- the results and the CSV's name (allreduce-stall-h200x2-gone_gap_us0.csv).
local dl = require "distlab"
local bench = dl.bench

local w = dl.comm.world()
local N, me = w.size, w.rank
local h = bench.harness {
  name = "allreduce_stall", family = "allreduce", comm = w, tag = true,
  usage = "./distlab run -n 2 --device cuda experiments/allreduce/allreduce_stall.lua [options]",
  about = "back-to-back all-reduces after a late start; see the file's header",
  options = {
    { "sizes", "sizes", nil, "sizes in bytes (default 2M,8M)" },
    { "cases", "list", nil, "algo:blocks, e.g. two_shot_lamport:264", meta = "LIST" },
    { "skews", "list", nil, "us the last rank starts late (default 0,300,3000)", meta = "LIST" },
    { "replays", "int", 40, "timed replays per case", meta = "N" },
  },
}
local opt = h.opt
local sizes = opt.sizes or { 2 * 2 ^ 20, 8 * 2 ^ 20 }
local cases = {}
for _, c in ipairs(opt.cases or { "one_shot_lamport:264", "two_shot_lamport:264", "two_shot_lamport:0", "one_shot:0" }) do
  local algo, blocks = c:match("^([%w_]+):(%d+)$")
  if not algo then dl.fail("allreduce_stall: --cases: %s is not algo:blocks", c) end
  cases[#cases + 1] = { algo = algo, blocks = tonumber(blocks) }
end
local skews = {}
for _, s in ipairs(opt.skews or { "0", "300", "3000" }) do
  local v = tonumber(s)
  if not v or v < 0 then dl.fail("allreduce_stall: --skews: %s is not a number of us >= 0", s) end
  skews[#skews + 1] = v
end

local ar = dl.allreduce.get(w)
local now_us = dl.core.C.dl_now_us
-- the knobs this run sets (the all-reduce's DISTLAB_AR_* variables), for the results
local knobs = {}
for _, k in ipairs { "DISTLAB_AR_GONE_GAP_US", "DISTLAB_AR_LONG_POLL_NS", "DISTLAB_AR_LONG_POLL_AFTER", "DISTLAB_AR_POLL_NS",
  "DISTLAB_AR_PDL" } do
  if os.getenv(k) then knobs[#knobs + 1] = k .. "=" .. os.getenv(k) end
end
local knob = #knobs > 0 and table.concat(knobs, " ") or "default"
h.device_desc = (w.device:match("^cuda") and dl.cuda_device_name(tonumber(w.device:match("%d+"))) or w.device) ..
  " x " .. N .. ", " .. knob

local tbl = h:table({ { "bytes", "%10d" }, { "case", "%-22s" }, { "skew", "%6d", unit = "(us)" },
  { "median", "%9.1f", unit = "(us)" }, { "max", "%9.1f", unit = "(us)" }, { "fastest", "%8.1f", unit = "(us)" },
  { "slow", "%5d", unit = "(>2x)" } })
tbl:header(h.device_desc)
local rows = {}
for _, bytes in ipairs(sizes) do
  local x = dl.zeros({ bytes / 2 }, { dtype = "bf16" })
  for _, c in ipairs(cases) do
    for _, skew in ipairs(skews) do
      local st = bench.timing.graph(function() ar:run(x, { algo = c.algo, blocks = c.blocks }) end, {
        ops = 10, warmup = 3, replays = opt.replays,
        before = function()
          w:barrier()
          if me == N - 1 and skew > 0 then
            local t0 = now_us()
            while now_us() - t0 < skew do end
          end
        end })
      ar:check()
      local slow = 0
      for _, t in ipairs(st.times) do if t > 2 * st.min then slow = slow + 1 end end
      local med, mx = h:max(st.median * 1e3), h:max(st.max * 1e3)
      local fastest, nslow = -h:max(-st.min * 1e3), h:max(slow)
      local name = c.algo .. ":" .. c.blocks
      tbl:row { bytes, name, skew, med, mx, fastest, nslow }
      rows[#rows + 1] = { bytes, c.algo, c.blocks, skew, knob, string.format("%.2f", med), string.format("%.2f", mx),
        string.format("%.2f", fastest), nslow, opt.replays }
    end
  end
end
if h.rank0 then
  local tag = h.tag
  for _, k in ipairs(knobs) do tag = tag .. "-" .. k:gsub("^DISTLAB_AR_", ""):gsub("=", ""):lower() end
  h:csv("allreduce-stall-" .. tag .. ".csv",
    { "bytes", "algo", "blocks", "skew_us", "knobs", "median_us", "max_us", "fastest_us", "slow_replays", "replays" },
    rows)
end
h:finish()
