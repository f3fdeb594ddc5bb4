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
--                    (off a GPU: one_shot_lamport:0,two_shot_lamport:0,one_shot:0)
--     --skews LIST   us the last rank starts late (default 0,300,3000)
--     --replays N    timed replays per case (default 40)
--     --tag NAME     results: allreduce-stall-TAG.{md,csv}
--     --quick        64 KB, skews 0 and 300, a graph of 2 calls replayed 3 times (a check that it
--                    runs and checks); --plant noop|scale=X puts an error into every timed
--                    all-reduce, which the data check must report (exit code 1)
-- Data checked after each case's timings, as allreduce_sweep.lua checks them:
-- the timed callable once more as it was timed (a graph of it, replayed once)
-- on fresh inputs (normal, a new seed each case and rank), against the fp64
-- sum of every rank's input drawn again on the host (all of it up to 128K
-- elements, else 128 windows of 1024): each element within 1e-2 n + 2^-7
-- |ref|, normwise within 1.5 u sqrt((1 + (n + 2)(n - 1) / (2n)) / 3) (u =
-- 2^-8), the bias within 2^-10. Wrong elements, over all ranks, make the
-- exit code non-zero.
-- Run it once per setting of a knob to compare (scripts/gpu/allreduce.sh stall
-- runs it per word of STALL_VARIANTS); the DISTLAB_AR_* knobs set are named in
-- the results and the CSV's name (allreduce-stall-h200x2-gone_gap_us0.csv).
local dl = require "distlab"
local bench = dl.bench
local verify = require "distlab.bench.verify"

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
local sizes = opt.sizes or (h.quick and { 65536 }) or { 2 * 2 ^ 20, 8 * 2 ^ 20 }
local cases = {}
-- the default grids are an H200's (132 SMs); elsewhere the kernels' own
local DEFAULT_CASES = w.device:match("^cuda") and
  { "one_shot_lamport:264", "two_shot_lamport:264", "two_shot_lamport:0", "one_shot:0" } or
  { "one_shot_lamport:0", "two_shot_lamport:0", "one_shot:0" }
for _, c in ipairs(opt.cases or DEFAULT_CASES) do
  local algo, blocks = c:match("^([%w_]+):(%d+)$")
  if not algo then dl.fail("allreduce_stall: --cases: %s is not algo:blocks", c) end
  cases[#cases + 1] = { algo = algo, blocks = tonumber(blocks) }
end
local skews = {}
for _, s in ipairs(opt.skews or (h.quick and { "0", "300" }) or { "0", "300", "3000" }) do
  local v = tonumber(s)
  if not v or v < 0 then dl.fail("allreduce_stall: --skews: %s is not a number of us >= 0", s) end
  skews[#skews + 1] = v
end

local ar = dl.allreduce.get(w)
local now_us = dl.core.C.dl_now_us
local OPS, WARMUP, REPLAYS = 10, 3, opt.replays
if h.quick then OPS, WARMUP, REPLAYS = 2, 1, 3 end

-- after a case's timings: fresh inputs (check number c, rank r: Philox(seed(c, r), i)),
-- the timed callable as timed (a graph of it, replayed once), against the fp64 sum
local checks = 0
local function seed_of(c, r) return 5151 + 7919 * c * N + r end
local U = 2 ^ -8
local TOL = { atol = 1e-2 * N, rtol = 2 ^ -7, norm = 1.5 * U * math.sqrt((1 + (N + 2) * (N - 1) / (2 * N)) / 3),
  bias = 2 ^ -10 }
local function check(what, issue, x)
  checks = checks + 1
  local wins = verify.windows(x:numel(), 131072, 1024, checks * N + me + 1)
  return h:verify { what = what,
    fresh = function() x:normal_(0, 1, seed_of(checks, me)) end,
    run = function()
      local g = dl.graph.capture(issue)
      g:replay()
      g:free()
    end,
    check = function()
      local seeds = {}
      for r = 0, N - 1 do seeds[r + 1] = seed_of(checks, r) end
      return verify.close(verify.take(x, wins), verify.normal_sum("bf16", seeds, wins), TOL)
    end }
end
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
  { "slow", "%5d", unit = "(>2x)" }, { "#wrong", "%6d" } })
tbl:header(h.device_desc)
local rows = {}
for _, bytes in ipairs(sizes) do
  local x = dl.zeros({ bytes / 2 }, { dtype = "bf16" })
  for _, c in ipairs(cases) do
    -- in place: x is the input and the result (the timed inputs zeros, the check's fresh)
    local issue = h:planted(function() ar:run(x, { algo = c.algo, blocks = c.blocks }) end, { writes = { x } })
    local case_rows = {}
    for _, skew in ipairs(skews) do
      x:zero_()
      local st = bench.timing.graph(issue, {
        ops = OPS, warmup = WARMUP, replays = REPLAYS,
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
      case_rows[#case_rows + 1] = { bytes, name, skew, med, mx, fastest, nslow }
      rows[#rows + 1] = { bytes, c.algo, c.blocks, skew, knob, string.format("%.2f", med), string.format("%.2f", mx),
        string.format("%.2f", fastest), nslow, REPLAYS }
    end
    local wrong = check(string.format("%s %s:%d", bench.sizes.human(bytes), c.algo, c.blocks), issue, x)
    ar:check()
    for k = #rows - #case_rows + 1, #rows do rows[k][#rows[k] + 1] = wrong end
    for _, r in ipairs(case_rows) do
      r[#r + 1] = wrong
      tbl:row(r)
    end
  end
end
if h.rank0 then
  local tag = h.tag
  for _, k in ipairs(knobs) do tag = tag .. "-" .. k:gsub("^DISTLAB_AR_", ""):gsub("=", ""):lower() end
  h:csv("allreduce-stall-" .. tag .. ".csv",
    { "bytes", "algo", "blocks", "skew_us", "knobs", "median_us", "max_us", "fastest_us", "slow_replays", "replays",
      "wrong" },
    rows)
end
h:finish()
