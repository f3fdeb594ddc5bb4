-- experiments/ep/ep_bench.lua — latency and bandwidth of distlab's
-- expert-parallel dispatch and combine (distlab.ep), both layouts, both
-- outputs, bf16 and fp8, beside NVIDIA's NCCL EP behind the same API
-- (backend = "nccl_ep": low latency and high throughput, every output, where
-- it runs: an NCCL communicator and the library, docs/ep.md), distlab's own
-- all_to_allv path and (with --torch) the PyTorch anchor on
-- torch.distributed.all_to_all_single (experiments/ep/ep_bench_torch.py): its
-- graph rows (split sizes and permutations planned ahead, dispatch and combine
-- captured in CUDA graphs) are the anchor, beside ours in the table, with
-- their isolated latency in a second table; its eager rows (counts read on
-- the host) an extra row labelled so.
--
--   ./distlab run -n 8 --device cuda experiments/ep/ep_bench.lua [options]
--     --B 1,32,128,512   tokens per rank (T = B, every rank)   --hidden 7168  --topk 8
--     --experts 16,256   (those N divides)    --layouts, --outputs, --dtypes, --paths ep,a2av
--     --nccl_dtypes bf16,fp8   NCCL EP's rows' payloads
--     --nccl_ep low_latency,high_throughput   NCCL EP's rows (none: without; skipped, saying
--                        why, where it cannot run), timed as ours
--     --torch T.csv      the anchor's CSV from the same machine (one run's, or the mean of the
--                        runs before and after this one: torch_common.py mean), merged into the report
--     --measured OURS.csv  time nothing: ours' rows from an earlier run's CSV, the report
--                        assembled again with --torch (the anchor's mean is known only after ours)
--     --ops 10 --replays 30   --out DIR (default experiments/results/ep)   --help
--   Several ranks on one GPU (distlab run -n 2 --device cuda on a 1-GPU host) is a
--   smoke run: timings mean nothing there, and results go to --out elsewhere.
--
-- Method (the harness's dl.bench.timing.graph, as DeepEP's and vLLM's
-- benchmarks time): a CUDA graph of `ops` back-to-back calls (dispatch; or
-- combine of the same dispatch; or both), warm-up replays, a barrier, then
-- `replays` replays each between two events; per call = replay / ops; the
-- median over replays on each rank, then the max over ranks. Routing: each
-- token picks K distinct experts uniformly at random. Bandwidth as DeepEP's
-- test_low_latency counts it: (selections that are not -1) x bytes per token
-- (dispatch: 2H bf16, H + 4H/128 fp8; combine: 2H), over the time.
-- all_to_allv path (a plain MoE layer on distlab's communicator): dispatch =
-- an all_to_all of the counts, read on the host, then all_to_allv of the
-- rows sorted by destination rank (one per (token, k)); combine = the
-- all_to_allv back. Timed eagerly (a host read of the counts cannot be
-- captured), each call between events; the permutation and the weighted
-- sum are not timed (distlab has no gather/scatter ops; the PyTorch baseline
-- times its index_select and index_add_).
-- Data checked after timing (distlab.bench.ep_ref), every row: the timed
-- dispatch and the timed combine, one after the other as `both` times them,
-- once more on fresh inputs (new x, new routing, random weights: every rank
-- draws every rank's again from their seeds) with every output poisoned
-- (NaN, 0xFF codes, INT_MIN counts). Dispatch: every row every local expert
-- (expert_major) or every source (rank_major) received, against the rows the
-- routing sends there (order free): counts exact, bf16 rows bit-exact, fp8
-- rows dequantized (code x scale) within 2^-4 |x| + 2^-10 scale of x, every
-- scale amax / 448, their bias against x within 2^-10 plus its noise; rank_major ids
-- and weights exact. Combine: the experts multiply their rows by coef(e)
-- (distinct per expert; rank_major rows weighted over their selections), and
-- every element of every token's output is checked against the fp64 sum
-- from x, the routing and the weights: element-wise and normwise 2^-8,
-- bias 2^-10. The all_to_allv path: fresh x, every received row against the
-- rows sent (exact), the rows back where they went out (exact). A 1% scale
-- of any output fails; #wrong counts the wrong elements over all ranks (exit
-- code 1, each rank's message on stderr). --quick: B 2, E 4, K 2, H 128, 2
-- replays of 2 calls (the plant spec's run); --plant noop | scale=X puts an
-- error into every timed call.
local ffi = require "ffi"
local dl = require "distlab"
local bench = dl.bench
local ep_ref = require "distlab.bench.ep_ref"
local nccl_ref = require "distlab.bench.ep_nccl_ref"
local verify = require "distlab.bench.verify"

local w = dl.comm.world()
local N, me = w.size, w.rank
local on_gpu = w.device:match("^cuda") ~= nil

local h = bench.harness {
  name = "ep_bench", family = "ep", comm = w, tag = true,
  usage = "./distlab run -n 8 --device cuda experiments/ep/ep_bench.lua [options]",
  about = "latency and bandwidth of EP dispatch/combine, both layouts and outputs, bf16/fp8, vs all_to_allv and PyTorch",
  options = {
    { "B", "counts", "1,32,128,512", "tokens per rank (T = B)" },
    { "hidden", "int", on_gpu and 7168 or 256, "H (a multiple of 128)" },
    { "topk", "int", 8, "K" },
    { "experts", "counts", "16,256", "E (those the ranks divide)" },
    { "layouts", "list", "per_expert,per_rank", "layouts", values = { "per_expert", "per_rank" } },
    { "outputs", "list", "expert_major,rank_major", "outputs", values = { "expert_major", "rank_major" } },
    { "dtypes", "list", "bf16,fp8", "dispatch payloads", values = { "bf16", "fp8" } },
    { "paths", "list", "ep,a2av", "ep: distlab.ep; a2av: all_to_allv on the communicator", values = { "ep", "a2av" } },
    { "nccl_ep", "list", "low_latency,high_throughput", "NCCL EP's algorithms beside ours (none: no NCCL EP rows)",
      values = { "low_latency", "high_throughput", "none" } },
    { "nccl_dtypes", "list", "bf16,fp8", "NCCL EP's rows' dispatch payloads (those --dtypes also names)",
      values = { "bf16", "fp8" } },
    { "ops", "int", 10, "calls per graph" },
    { "blocks", "int", 0, "grid of every ep kernel (0: the buffer's choice, a block an SM)" },
    { "split", "flag", false, "time dispatch_send + dispatch_recv and combine_send + combine_recv (two kernels each) " ..
      "instead of dispatch and combine (one)" },
    { "span", "int", 0, "experts of each rank that the tokens pick among (its first S; 0: all): a routing skewed " ..
      "onto N S experts, in E's ids (at least topk in all)" },
    { "replays", "int", on_gpu and 30 or 5, "timed replays" },
    { "torch", "string", nil, "ep_bench_torch.py's CSV from the same machine (graph rows: the anchor; eager: " ..
      "an extra row)", meta = "T.csv" },
    { "name", "string", "ep-bench", "the results files' name: NAME-<tag>.md and .csv" },
    { "measured", "string", nil, "ours' rows from this bench's CSV of an earlier run: time nothing, only write " ..
      "the report with --torch (give the run's other options again)", meta = "OURS.csv" },
  },
}
local opt = h.opt
if h.quick then -- the smallest case, where not given
  for key, v in pairs { B = { 2 }, experts = { 4 }, topk = 2, hidden = 128, replays = 2, ops = 2 } do
    if not h.given[key] then opt[key] = v end
  end
end
local H, K = opt.hidden, opt.topk
local device_name = on_gpu and dl.cuda_device_name(tonumber(w.device:match("%d+"))) or w.device
h.device_desc = string.format("%s x %d (%s backend%s)", device_name, N, w.backend,
  h.shared and string.format(", %d ranks a GPU: a smoke run", w.share) or "")

if opt.span < 0 then dl.fail("ep_bench: --span %d is negative", opt.span) end
if opt.span > 0 and opt.span * N < K then
  dl.fail("ep_bench: --span %d gives %d experts in all, fewer than topk %d", opt.span, opt.span * N, K)
end
local Bs, Es = opt.B, {}
for _, e in ipairs(opt.experts) do
  if e % N == 0 and e >= K and opt.span <= e / N then Es[#Es + 1] = e end
end
if #Es == 0 then
  dl.fail("ep_bench: no expert count among %s is a multiple of %d ranks and >= topk %d%s", table.concat(opt.experts, ","),
    N, K, opt.span > 0 and string.format(" with at least --span %d experts a rank", opt.span) or "")
end

-- ---- inputs ------------------------------------------------------------------------------

-- Rank `rank`'s routing (default: this rank's): K distinct experts per token,
-- uniformly (seeded by rank and case) among all E, or (--span S) among the
-- first S of each rank's E / N; weights 2^-ceil(log2 K) each (the data check
-- draws random ones).
local function routing(T, E, seed, rank)
  rank = rank or me
  local S, L = opt.span > 0 and opt.span or E / N, E / N
  local idx = dl.empty({ T, K }, { dtype = "i32", device = "cpu" })
  local p = ffi.cast("int32_t*", idx:data_ptr())
  local s = (seed * 7919 + rank * 104729 + 13) % 2147483647
  for t = 0, T - 1 do
    for k = 0, K - 1 do
      local e
      repeat
        s = (s * 48271) % 2147483647
        e = s % (S * N)
        e = math.floor(e / S) * L + e % S
        local dup = false
        for j = 0, k - 1 do dup = dup or p[t * K + j] == e end
      until not dup
      p[t * K + k] = e
    end
  end
  local wk = 2 ^ -math.ceil(math.log(K) / math.log(2))
  return idx, dl.full({ T, K }, wk, { device = "cpu" }), wk
end
jit.off(routing)

-- ---- the ep path ---------------------------------------------------------------------------

local function timed(fn)
  local st = bench.timing.graph(fn, { ops = opt.ops, replays = opt.replays, warmup = 3,
    before = function() w:barrier() end })
  return h:max(st.median) * 1e3 -- us
end
-- isolated latency: each call alone after an L2 flush, a sync and a barrier (as the PyTorch anchor's)
local function alone(fn)
  local st = bench.timing.isolated(fn, { replays = opt.replays, warmup = 3, before = function() w:barrier() end })
  return h:max(st.median) * 1e3 -- us
end

-- Rank `rank`'s fresh inputs for the data check of a case (seed: the case's):
-- x, a routing and random weights (f32 multiples of 1/997), on the host.
local function fresh_inputs(T, E, seed, rank)
  local idx = routing(T, E, seed + 7, rank)
  local x = dl.randn({ T, H }, { dtype = "bf16", seed = seed * 131 + rank + 1, device = "cpu" })
  local w = dl.empty({ T, K }, { dtype = "f32", device = "cpu" })
  local pw = ffi.cast("float*", w:data_ptr())
  local s = (seed * 31 + rank * 7 + 5) % 2147483647
  for i = 0, T * K - 1 do
    s = (s * 48271) % 2147483647
    pw[i] = (s % 1000 + 1) / 997
  end
  return { x = x, idx = idx, w = w, s = rank }
end
jit.off(fresh_inputs)

local function dispatch_bytes(case, T) return T * K * (case.dtype == "fp8" and H + 4 * H / 128 or 2 * H) end

-- An integer output (counts, ids) or fp8 codes under --plant scale: left as they are
-- (the float outputs beside them, x or the scales and weights, carry the scale).
local function keep(_) end

-- high throughput expert_major: y rows weighted by the caller before their rounding to
-- bf16 (NCCL EP's contract), where the reference rounds coef x and weights after: two
-- roundings of 2^-9 apart, then the sum's own
local HT_EM_TOL = { atol = 1e-6, rtol = 2 ^ -7, norm = 2 ^ -8, bias = 2 ^ -10 }

-- case: {B, E, layout, output, dtype} of ours, or {backend = "nccl_ep", algorithm, output, dtype}
local function run_ep(case)
  local T = case.B
  local nccl = case.backend == "nccl_ep"
  local ep = dl.ep.buffer { comm = w, max_tokens = case.B, hidden = H, experts = case.E, topk = K,
    layout = not nccl and case.layout or nil, output = case.output, dtype = case.dtype,
    blocks = opt.blocks > 0 and opt.blocks or nil, backend = case.backend, algorithm = case.algorithm }
  local idx_h, w_h = routing(T, case.E, case.B * 1000 + case.E)
  -- the inputs every timed call reads (`cur`), and the state between them (`st`: the last dispatch)
  local cur = { x = dl.randn({ T, H }, { dtype = "bf16", seed = me + 17, device = w.device }), idx = idx_h:to(w.device),
    wts = w_h:to(w.device) }
  local st = {}
  st.recv, st.hd = ep:dispatch(cur.x, cur.idx, cur.wts)
  cur.y = dl.randn(st.recv.x:size(), { dtype = "bf16", device = w.device })
  local r = { impl = nccl and "nccl_ep" or "distlab", path = "ep", B = case.B, E = case.E,
    layout = nccl and case.algorithm or case.layout, output = case.output, dtype = case.dtype, method = "graph" }
  local dispatch, combine = ep.dispatch, ep.combine
  if opt.split and case.algorithm ~= "high_throughput" then
    dispatch = function(e, ...) return e:dispatch_recv(e:dispatch_send(...)) end
    combine = function(e, yy, hh)
      e:combine_send(yy, hh)
      return e:combine_recv(hh)
    end
  end
  -- the timed calls, with --plant's error in them
  local recv_out = {}
  for _, key in ipairs { "x", "scales", "counts", "expert_ids", "weights", "offsets" } do
    recv_out[#recv_out + 1] = st.recv[key]
  end
  local out = ep.tensors.out:narrow(1, 1, T)
  local function plain_dispatch() st.recv, st.hd = dispatch(ep, cur.x, cur.idx, cur.wts) end
  local pdispatch = h:planted(plain_dispatch, { writes = recv_out, scale = keep })
  local pcombine = h:planted(function() combine(ep, cur.y, st.hd) end, { writes = { out } })
  local function both()
    pdispatch()
    pcombine()
  end
  r.dispatch_us = timed(pdispatch)
  plain_dispatch()
  r.combine_us = timed(pcombine)
  r.both_us = timed(both)
  r.dispatch_lat_us = alone(pdispatch)
  plain_dispatch()
  r.combine_lat_us = alone(pcombine)
  r.both_lat_us = alone(both)
  r.dispatch_GBps = dispatch_bytes(case, T) / (r.dispatch_us * 1e3)
  r.combine_GBps = T * K * 2 * H / (r.combine_us * 1e3)
  r.dispatch_lat_GBps = dispatch_bytes(case, T) / (r.dispatch_lat_us * 1e3)
  r.combine_lat_GBps = T * K * 2 * H / (r.combine_lat_us * 1e3)
  r.bytes = ep:bytes().total
  -- Data: `both` once more on fresh inputs; the experts' y made from a dispatch of them first
  -- (nccl_ep's outputs in ours' shape for ours' checks: distlab.bench.ep_nccl_ref)
  local o = { N = N, me = me, E = case.E, B = case.B, H = H, K = K, output = case.output, dtype = case.dtype,
    algorithm = case.algorithm }
  local o_ours = { N = N, me = me, E = case.E, B = case.B, H = H, K = K, dtype = case.dtype,
    output = nccl and nccl_ref.ours_output(o) or case.output,
    fp8_scales = nccl and "own" or nil } -- NCCL EP's recipe: its scales need not be ours' bit for bit
  local tol = case.algorithm == "high_throughput" and case.output == "expert_major" and HT_EM_TOL or ep_ref.COMBINE_TOL
  local seed, all = case.B * 1000 + case.E + 500, {}
  r.wrong = h:verify {
    what = string.format("%s %s %s %s B=%d E=%d", r.impl, r.layout, case.output, case.dtype, case.B, case.E),
    fresh = function()
      for s = 0, N - 1 do all[s + 1] = fresh_inputs(T, case.E, seed, s) end
      local mine = all[me + 1]
      cur.x:copy_(mine.x)
      cur.idx:copy_(mine.idx)
      cur.wts:copy_(mine.w)
      plain_dispatch()
      if not nccl then
        for slot, e in pairs(ep_ref.expert_outputs(o, st.recv)) do
          cur.y:select(1, slot + 1):narrow(1, 1, e.rows):copy_(e.y)
        end
      end
      for _, t in ipairs(recv_out) do verify.poison(t) end
      verify.poison(out)
    end,
    -- NCCL EP places an expert's rows in arrival order, which changes from one dispatch to the next:
    -- its experts' y come from the very dispatch that is checked (ours' places are fixed: `both`)
    run = nccl and function()
      pdispatch()
      cur.y:copy_(nccl_ref.expert_outputs(o, st.recv))
      pcombine()
    end or both,
    check = function()
      local recv = nccl and nccl_ref.as_ours(o, st.recv, all) or st.recv
      local bad, msg, elements = ep_ref.check_dispatch(o_ours, recv, all)
      local nc, cmsg = verify.close(out, ep_ref.combine_ref(o_ours, all[me + 1]), tol)
      if bad + nc == 0 then
        return 0, string.format("dispatch: %d elements received as sent; combine: %s", elements, cmsg)
      end
      local msgs = {}
      if bad > 0 then msgs[#msgs + 1] = "dispatch: " .. msg end
      if nc > 0 then msgs[#msgs + 1] = "combine: " .. cmsg end
      return bad + nc, table.concat(msgs, "; ")
    end,
  }
  ep:free()
  return r
end

-- ---- the all_to_allv path --------------------------------------------------------------------

-- Rank `rank`'s rows in destination order (one per (token, k)): {counts[q + 1] = elements, rows = tokens}
local function a2av_rows(T, E, rank)
  local L = E / N
  local idx = routing(T, E, T * 1000 + E, rank)
  local pi = ffi.cast("int32_t*", idx:data_ptr())
  local send_counts, rows = {}, {}
  for q = 1, N do send_counts[q] = 0 end
  for q = 0, N - 1 do
    for t = 0, T - 1 do
      for k = 0, K - 1 do
        if math.floor(pi[t * K + k] / L) == q then
          send_counts[q + 1] = send_counts[q + 1] + H
          rows[#rows + 1] = t
        end
      end
    end
  end
  return send_counts, rows
end
jit.off(a2av_rows)

-- rows of x (cpu bf16 [T, H]) in `rows` order, on the host
local function gather_rows(x, rows, first, n)
  local out = dl.empty({ math.max(1, n), H }, { dtype = "bf16", device = "cpu" })
  local px, po = ffi.cast("uint16_t*", x:data_ptr()), ffi.cast("uint16_t*", out:data_ptr())
  for i = 0, n - 1 do ffi.copy(po + i * H, px + rows[first + i] * H, 2 * H) end
  return out
end
jit.off(gather_rows)

local function run_a2av(case)
  local T = case.B
  -- rows sorted by destination rank, one per (token, k): built once, untimed
  local send_counts, rows = a2av_rows(T, case.E, me)
  local x = dl.randn({ T, H }, { dtype = "bf16", seed = me + 17, device = "cpu" })
  local send = dl.empty({ math.max(1, #rows), H }, { dtype = "bf16", device = w.device })
  send:copy_(gather_rows(x, rows, 1, #rows))
  local cnt_in = dl.from_table(send_counts, { dtype = "i64", device = w.device })
  local cnt_out = dl.empty({ N }, { dtype = "i64", device = w.device })
  w:all_to_all(cnt_out, cnt_in)
  local recv_counts = cnt_out:to("cpu"):tolist()
  local total = 0
  for _, c in ipairs(recv_counts) do total = total + c end
  local recv = dl.empty({ math.max(1, total / H), H }, { dtype = "bf16", device = w.device })
  local back = dl.empty({ math.max(1, #rows), H }, { dtype = "bf16", device = w.device })
  local flat = function(t, n) return t:view(t:numel()):narrow(1, 1, n) end
  local sflat, rflat, bflat = flat(send, #rows * H), flat(recv, total), flat(back, #rows * H)
  local dispatch = h:planted(function()
    w:all_to_all(cnt_out, cnt_in)
    local rc = cnt_out:to("cpu"):tolist() -- what a plain MoE layer waits for
    w:all_to_allv(rflat, rc, sflat, send_counts)
  end, { writes = { rflat } })
  local combine = h:planted(function() w:all_to_allv(bflat, send_counts, rflat, recv_counts) end, { writes = { bflat } })
  local function eager(fn)
    local st = bench.timing.events(fn, { warmup = 3, iters = opt.replays })
    return h:max(st.median) * 1e3
  end
  local r = { impl = "distlab", path = "a2av", B = case.B, E = case.E, layout = "-", output = "-", dtype = "bf16",
    method = "eager" }
  r.dispatch_us = eager(dispatch)
  r.combine_us = eager(combine)
  r.both_us = eager(function() dispatch(); combine() end)
  r.dispatch_GBps = T * K * 2 * H / (r.dispatch_us * 1e3)
  r.combine_GBps = T * K * 2 * H / (r.combine_us * 1e3)
  r.bytes = 0
  -- Data: both once more on a fresh x; every row received is the row its source sent
  -- here, and every row came back where it went out
  local seed = T * 1000 + case.E + 500
  local want_recv, want_back
  r.wrong = h:verify {
    what = string.format("a2av B=%d E=%d", case.B, case.E),
    fresh = function()
      local parts = {}
      for s = 0, N - 1 do
        local xs = dl.randn({ T, H }, { dtype = "bf16", seed = seed * 131 + s + 1, device = "cpu" })
        local sc, rs = a2av_rows(T, case.E, s)
        if s == me then
          want_back = gather_rows(xs, rs, 1, #rs)
          send:copy_(want_back)
        end
        -- the rows s sends here: its rows for destination me, in its order
        local first = 1
        for q = 0, me - 1 do first = first + sc[q + 1] / H end
        parts[#parts + 1] = gather_rows(xs, rs, first, sc[me + 1] / H):narrow(1, 1, sc[me + 1] / H)
      end
      want_recv = dl.empty({ math.max(1, total / H), H }, { dtype = "bf16", device = "cpu" })
      local at = 1
      for _, p in ipairs(parts) do
        local n = p:size(1)
        if n > 0 then want_recv:narrow(1, at, n):copy_(p) end
        at = at + n
      end
    end,
    poison = { recv, back },
    run = function() dispatch(); combine() end,
    check = function()
      local n1, m1 = verify.close(flat(recv, total), flat(want_recv, total))
      local n2, m2 = verify.close(flat(back, #rows * H), flat(want_back, #rows * H))
      local msgs = {}
      if n1 > 0 then msgs[#msgs + 1] = "rows received: " .. m1 end
      if n2 > 0 then msgs[#msgs + 1] = "rows back: " .. m2 end
      return n1 + n2, #msgs > 0 and table.concat(msgs, "; ") or nil
    end,
  }
  return r
end

-- ---- running --------------------------------------------------------------------------------

local COLS = { "impl", "path", "B", "E", "layout", "output", "dtype", "method", "dispatch_us", "combine_us", "both_us",
  "dispatch_GBps", "combine_GBps", "bytes", "wrong", "dispatch_lat_us", "combine_lat_us", "both_lat_us",
  "dispatch_lat_GBps", "combine_lat_GBps" }
local tbl = h:table {
  { "impl", "%-8s" }, { "path", "%-5s" }, { "B", "%5d" }, { "E", "%4d" }, { "layout", "%-10s" },
  { "output", "%-12s" }, { "dtype", "%-5s" }, { "dispatch", "%9.1f", unit = "(us)" }, { "combine", "%9.1f", unit = "(us)" },
  { "both", "%9.1f", unit = "(us)" }, { "disp", "%7.1f", unit = "(GB/s)" }, { "comb", "%7.1f", unit = "(GB/s)" },
  { "#wrong", "%6d" } }
tbl:header(string.format("distlab ep_bench: %s, H=%d K=%d", h.device_desc, H, K))
local rows = {}
local function add(r)
  rows[#rows + 1] = r
  tbl:row { r.impl, r.path, r.B, r.E, r.layout, r.output, r.dtype, r.dispatch_us, r.combine_us, r.both_us,
    r.dispatch_GBps, r.combine_GBps, r.wrong }
end
local want = {}
for _, p in ipairs(opt.paths) do want[p] = true end
-- --measured: ours' rows from an earlier run's CSV, nothing timed here: the report assembled once
-- the anchor's run after ours has ended (scripts/gpu/multi.sh)
if opt.measured then
  want = {}
  local head, recs = bench.csv.read(opt.measured)
  if not head then dl.fail("ep_bench: cannot read %s: %s", opt.measured, tostring(recs)) end
  for _, t in ipairs(recs) do
    if t.impl ~= "torch" then
      local r = {}
      for _, c in ipairs(COLS) do r[c] = tonumber(t[c]) or (t[c] ~= "" and t[c] or nil) end
      add(r)
    end
  end
end
-- NCCL EP's rows where it runs here: one buffer made and freed (every rank fails alike)
local nccl_algos = {}
for _, a in ipairs(opt.nccl_ep) do
  if a ~= "none" then nccl_algos[#nccl_algos + 1] = a end
end
if want.ep and #nccl_algos > 0 then
  local ok, b = pcall(dl.ep.buffer, { backend = "nccl_ep", comm = w, max_tokens = 1, hidden = 512, experts = N, topk = 1 })
  if ok then b:free() else
    h:print("ep_bench: no NCCL EP rows: %s", tostring(b))
    nccl_algos = {}
  end
end
local nccl_dtype = {}
for _, d in ipairs(opt.nccl_dtypes) do nccl_dtype[d] = true end
local NCCL_OUTPUTS = { low_latency = { "expert_major", "rank_major" }, high_throughput = { "expert_major", "flat" } }
for _, E in ipairs(Es) do
  for _, B in ipairs(Bs) do
    if want.ep then
      for _, layout in ipairs(opt.layouts) do
        for _, output in ipairs(opt.outputs) do
          for _, dtype in ipairs(opt.dtypes) do
            if dtype ~= "fp8" or H % 128 == 0 then
              add(run_ep { B = B, E = E, layout = layout, output = output, dtype = dtype })
            end
          end
        end
      end
    end
    for _, algorithm in ipairs(want.ep and nccl_algos or {}) do
      for _, output in ipairs(NCCL_OUTPUTS[algorithm]) do
        for _, dtype in ipairs(opt.dtypes) do
          -- (its fp8 recipe: low latency, H a multiple of 512; high throughput needs E a multiple of 4, and
          -- on 3 ranks or fewer an even B: ep_nccl.c)
          local fits = (dtype == "bf16" or (algorithm == "low_latency" and H % 512 == 0)) and
            (algorithm == "low_latency" and H % 128 == 0 or algorithm == "high_throughput" and E % 4 == 0) and
            nccl_dtype[dtype] and not (algorithm == "high_throughput" and N <= 3 and B % 2 == 1)
          if fits then
            add(run_ep { backend = "nccl_ep", algorithm = algorithm, B = B, E = E, output = output, dtype = dtype })
          end
        end
      end
    end
    if want.a2av then add(run_a2av { B = B, E = E }) end
  end
end
-- The PyTorch anchor's rows: mode graph (layout planned ahead, captured; its output expert-major,
-- packed) as layout "graph", mode eager (host-read counts; a CSV from before the modes has only
-- these) as "eager"; each with its isolated latency where it has one (*_lat_us)
local LAT = { "dispatch_lat_us", "combine_lat_us", "both_lat_us", "dispatch_lat_GBps", "combine_lat_GBps" }
local torch_rows = {}
if opt.torch then
  local head, recs = bench.csv.read(opt.torch)
  if not head then dl.fail("ep_bench: cannot read %s: %s", opt.torch, tostring(recs)) end
  for _, t in ipairs(recs) do
    local mode = (t.mode == nil or t.mode == "") and "eager" or t.mode
    local r = { impl = "torch", path = "a2a", B = tonumber(t.B), E = tonumber(t.E), layout = mode,
      output = mode == "graph" and "em_packed" or "-", dtype = t.dtype, method = t.method, runs = tonumber(t.runs) }
    for _, c in ipairs { "dispatch_us", "combine_us", "both_us", "dispatch_GBps", "combine_GBps", "wrong", unpack(LAT) } do
      r[c] = tonumber(t[c])
    end
    r.bytes = 0
    torch_rows[#torch_rows + 1] = r
  end
  -- the anchor first, then the eager rows
  for _, want_mode in ipairs { "graph", "eager" } do
    for _, r in ipairs(torch_rows) do
      if (r.layout == "graph") == (want_mode == "graph") then add(r) end
    end
  end
end

local out = {}
for i, r in ipairs(rows) do
  out[i] = {}
  for j, c in ipairs(COLS) do
    local v = r[c]
    -- times and rates at two decimals always (a re-read 14.00 stays 14.00), counts as they are
    out[i][j] = type(v) == "number" and (c:match("_us$") or c:match("_GBps$")) and string.format("%.2f", v) or v
  end
end
local base = opt.name .. "-" .. h.tag
local csv = h:csv(base .. ".csv", COLS, out)
local md = {
  string.format("H=%d, K=%d, T=B tokens on every rank, each picking K distinct experts uniformly%s. Latency: " ..
    "median over %d replays of a CUDA graph of %d calls, max over ranks (the all_to_allv and PyTorch eager " ..
    "rows: eager calls between events, as a plain MoE layer runs, its split sizes read on the host; the " ..
    "PyTorch graph rows, the anchor: the same graph method, their split sizes, send order and expert-major " ..
    "permutation planned ahead, untimed, output packed per expert; ep_bench_torch.py). Bandwidth as " ..
    "DeepEP counts it: selections x bytes per token / time. Published at 8 ranks on NVLink, B=128: DeepEP " ..
    "42.6 / 72.0 us (dispatch / combine, as Perplexity measured it), pplx-kernels 83.6 / 102.3 us (H100), " ..
    "NCCL EP about 65 / 79 us (bf16 both ways, H100).%s", H, K,
    opt.span > 0 and string.format(" among the first %d experts of each rank (--span)", opt.span) or "",
    opt.replays, opt.ops,
    (opt.blocks > 0 and string.format(" Every ep kernel on a grid of %d blocks (--blocks).", opt.blocks) or "") ..
    (opt.split and " Send and receive as two kernels each (--split: dispatch_send + dispatch_recv, " ..
      "combine_send + combine_recv)." or " Send and receive in one kernel each (dispatch, combine).")) ..
    " Data checked after timing, every row: the timed dispatch and combine once more on fresh inputs, outputs " ..
    "poisoned; every row every expert received against the routing (bf16 exact, fp8 dequantized within its " ..
    "bound and unbiased), every combined element against the fp64 sum (2^-8); #wrong: wrong elements over " ..
    "all ranks (experiments/ep/ep_bench.lua's header).",
  "",
  "| impl | path | B | E | layout | output | dtype | dispatch us | combine us | both us | dispatch GB/s | combine GB/s | buffer MiB | #wrong |",
  "|---|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
}
for _, r in ipairs(rows) do
  md[#md + 1] = string.format("| %s | %s | %d | %d | %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d |",
    r.impl, r.path, r.B, r.E, r.layout, r.output, r.dtype, r.dispatch_us, r.combine_us, r.both_us, r.dispatch_GBps,
    r.combine_GBps, r.bytes / 2 ^ 20, r.wrong)
end
local nccl_rows = 0
for _, r in ipairs(rows) do
  if r.impl == "nccl_ep" then nccl_rows = nccl_rows + 1 end
end
if nccl_rows > 0 then
  md[#md + 1] = ""
  md[#md + 1] = string.format("NCCL EP's rows: %s, payloads %s (--nccl_dtypes); its high throughput on 3 ranks or " ..
    "fewer only at even B (NCCL EP's dispatch moves its buffer's tokens in pairs there).",
    table.concat(nccl_algos, " and "), table.concat(opt.nccl_dtypes, ", "))
end
-- Isolated latency, every row that has one: ours and NCCL EP's (this run), the PyTorch anchor's
local lat_rows = {}
for _, r in ipairs(rows) do
  if r.dispatch_lat_us and (r.impl ~= "torch" or r.layout == "graph") then lat_rows[#lat_rows + 1] = r end
end
local function f1(v) return v and string.format("%.1f", v) or "-" end
-- a table after its caption: header and alignment rows, then the lines (none: no table)
local function section(caption, header, align, lines)
  if #lines == 0 then return end
  for _, l in ipairs { "", caption, "", header, align } do md[#md + 1] = l end
  for _, l in ipairs(lines) do md[#md + 1] = l end
end
local lat_lines = {}
for _, r in ipairs(lat_rows) do
  lat_lines[#lat_lines + 1] = string.format("| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d |",
    r.impl, r.B, r.E, r.layout, r.output, r.dtype, f1(r.dispatch_lat_us), f1(r.combine_lat_us), f1(r.both_lat_us),
    f1(r.dispatch_lat_GBps), f1(r.combine_lat_GBps), r.impl == "torch" and "-" or f1(r.bytes / 2 ^ 20), r.runs or 1,
    r.wrong)
end
section("Isolated latency: one replay of a graph of one call between two events, after an L2 flush (256 MB " ..
  "zeroed), a sync and a barrier, the previous call's output in place; median over the replays on each rank, max " ..
  "over ranks (ours and NCCL EP's: bench.timing.isolated, this run; PyTorch's: ep_bench_torch.py, runs 2 where " ..
  "the figures are the mean of a run before and one after this bench).",
  "| impl | B | E | layout | output | dtype | dispatch us | combine us | both us | dispatch GB/s | combine GB/s | " ..
  "buffer MiB | runs | #wrong |", "|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|", lat_lines)
-- Ours against NCCL EP's low latency, output for output (its buffer is per source rank: our per_rank):
-- its isolated latency over ours (above 1: ours faster), and the buffers
local function find(impl, layout, output, B, E, dtype)
  for _, r in ipairs(rows) do
    if r.impl == impl and r.layout == layout and r.output == output and r.B == B and r.E == E and r.dtype == dtype and
      r.dispatch_lat_us then
      return r
    end
  end
end
local vs = {}
for _, n in ipairs(rows) do
  if n.impl == "nccl_ep" and n.layout == "low_latency" and n.dispatch_lat_us then
    for _, layout in ipairs { "per_rank", "per_expert" } do
      local o = find("distlab", layout, n.output, n.B, n.E, n.dtype)
      if o then
        vs[#vs + 1] = string.format("| %d | %d | %s | %s | %s | %.1f / %.1f = **%.2fx** | %.1f / %.1f = **%.2fx** | " ..
          "%.1f / %.1f = %.2fx | %.1f / %.1f |", n.B, n.E, n.dtype, n.output, layout, n.dispatch_lat_us,
          o.dispatch_lat_us, n.dispatch_lat_us / o.dispatch_lat_us, n.combine_lat_us, o.combine_lat_us,
          n.combine_lat_us / o.combine_lat_us, n.dispatch_us, o.dispatch_us, n.dispatch_us / o.dispatch_us,
          o.bytes / 2 ^ 20, n.bytes / 2 ^ 20)
      end
    end
  end
end
section("Ours against NCCL EP's low latency, the same output (isolated latency, NCCL EP's over ours: above 1.00x " ..
  "ours is faster; graph: the same ratio of the graph rows' dispatch; buffers: ours' from our allocator, NCCL " ..
  "EP's from its allocator hooks and its NCCL window, ep:bytes()):",
  "| B | E | dtype | output | ours | dispatch us (NCCL EP / ours) | combine us | graph dispatch us | " ..
  "buffer MiB (ours / NCCL EP) |", "|---:|---:|---|---|---|---:|---:|---:|---:|", vs)
local path = h:markdown(base .. ".md", "Expert-parallel dispatch/combine: latency on " .. h.device_desc, md)
h:print("wrote %s and %s", csv, path)
h:finish()
