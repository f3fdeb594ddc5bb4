-- distlab.bench — the benchmark harness: every benchmark under experiments/
-- runs on it, and a researcher's own script can too.
--
--   dl.bench(fn, {warmup = 5, iters = 20, device =}) -> {median, min, max, mean, iters, times, method}
--       ms per call, each call between two device events on the current
--       stream; same as bench.timing.events. On cpu and meta there are no
--       device events: a time is the host's for one whole call (the reference
--       kernels run inside it, and ranks share the host's cores), so it is
--       not the sweeps' figure (a graph of 10 calls a replay, timing.graph),
--       nor a GPU's; `method` says which it is, and print(st) shows it
--   bench.stats(times)                          median / min / max / mean of a list
--   bench.anchor(runs, "high"|"low")           an anchor's figure from its runs (timing.anchor)
--
-- The parts, each loaded on first use (bench.options, bench.sizes, ...):
--   options   typed command-line options with defaults, --help, a clear error for unknown ones
--   sizes     size lists: "8K,1M,64M", ranges "8..1G" (doubling) or "8K..1M:4"; human sizes
--   timing    events, CUDA-graph replay of k calls, back-to-back loops, host issue time;
--             reductions over ranks (max of times, sum of #wrong)
--   busbw     nccl-tests' bus-bandwidth factors, defined once
--   table     the nccl-tests-style table on stdout
--   csv       RFC 4180 writing and reading (what Python's csv module reads and writes)
--   markdown  results files whose header names device, date, commit and command
--   plot      a gnuplot PNG where gnuplot exists, a note where it does not
--   harness   one bench run: options, results folder, data checks after timing, exit code
--
-- A bench (see experiments/comm/comm_bench.lua):
--   local h = dl.bench.harness { name = "my_bench", family = "comm", comm = world,
--     about = "what it measures", options = { { "sizes", "sizes", "8..64M", "bytes" } } }
--   for _, bytes in ipairs(h.opt.sizes) do ... h:check(function() return wrong end) ... end
--   h:csv("x.csv", header, rows); h:markdown("x.md", "title", lines); h:finish()
local timing = require "distlab.bench.timing"

local M = {
  stats = timing.stats,
  anchor = timing.anchor,
  bench = timing.events,
}

local PARTS = { options = true, sizes = true, timing = true, busbw = true, table = true, csv = true,
  markdown = true, plot = true, harness = true }

return setmetatable(M, {
  __call = function(_, fn, opts) return timing.events(fn, opts) end,
  __index = function(t, k)
    if not PARTS[k] then return nil end
    local mod = require("distlab.bench." .. k)
    rawset(t, k, mod)
    return mod
  end,
})
