-- experiments/ep/ep_bench.lua — latency and bandwidth of distlab's
-- expert-parallel dispatch and combine (distlab.ep), both layouts, both
-- outputs, bf16 and fp8, beside distlab's own all_to_allv path and (with
-- --torch) a PyTorch baseline on torch.distributed.all_to_all_single
-- (experiments/ep/ep_bench_torch.py).
--
--   ./distlab run -n 8 --device cuda experiments/ep/ep_bench.lua [options]
--     --B 1,32,128,512   tokens per rank (T = B, every rank)   --hidden 7168  --topk 8
--     --experts 16,256   (those N divides)    --layouts, --outputs, --dtypes, --paths ep,a2av
--     --torch T.csv      the baseline's CSV from the same machine, merged into the report
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
-- Data are checked after timing (one more dispatch and combine, the expert
-- being the identity): counts summed over ranks equal the selections sent;
-- bf16 outputs, sampled, equal x times the token's weight sum (expert_major)
-- or its count of ranks (rank_major); fp8 outputs are checked by the specs.
local ffi = require "ffi"
local dl = require "distlab"
local bench = dl.bench

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
    { "ops", "int", 10, "calls per graph" },
    { "blocks", "int", 0, "grid of every ep kernel (0: the buffer's choice, a block an SM)" },
    { "split", "flag", false, "time dispatch_send + dispatch_recv and combine_send + combine_recv (two kernels each) " ..
      "instead of dispatch and combine (one)" },
    { "span", "int", 0, "experts of each rank that the tokens pick among (its first S; 0: all): a routing skewed " ..
      "onto N S experts, in E's ids (at least topk in all)" },
    { "replays", "int", on_gpu and 30 or 5, "timed replays" },
    { "torch", "string", nil, "ep_bench_torch.py's CSV from the same machine", meta = "T.csv" },
  },
}
local opt = h.opt
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

-- Rank me's routing: K distinct experts per token, uniformly (seeded by
-- rank and case) among all E, or (--span S) among the first S of each
-- rank's E / N; weights 2^-ceil(log2 K) each, so the identity expert's
-- combine is x times an exact weight sum.
local function routing(T, E, seed)
  local S, L = opt.span > 0 and opt.span or E / N, E / N
  local idx = dl.empty({ T, K }, { dtype = "i32", device = "cpu" })
  local p = ffi.cast("int32_t*", idx:data_ptr())
  local s = (seed * 7919 + me * 104729 + 13) % 2147483647
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

-- Sampled elements of got (cpu f32 [T, H]) that differ from x[t] * scale[t].
local function wrong_rows(got, x, scale, tol)
  local pg, px = ffi.cast("float*", got:data_ptr()), ffi.cast("float*", x:data_ptr())
  local bad = 0
  for t = 0, got:size(1) - 1 do
    for i = 0, H - 1, 61 do
      local want = px[t * H + i] * scale[t + 1]
      if math.abs(pg[t * H + i] - want) > tol * math.abs(want) + 1e-6 then bad = bad + 1 end
    end
  end
  return bad
end
jit.off(wrong_rows)

-- x, idx, wts on the buffer's device; idx_h: the host copy of idx.
local function check_ep(ep, case, x, idx, wts, idx_h, wk)
  local recv, hd = ep:dispatch(x, idx, wts)
  local counts = 0
  for _, c in ipairs(recv.counts:to("cpu"):tolist()) do counts = counts + c end
  -- per token: its selections (expert_major rows) or its ranks (rank_major rows)
  local pi = ffi.cast("int32_t*", idx_h:data_ptr())
  local L, T, sent, scale = case.E / N, x:size(1), 0, {}
  for t = 0, T - 1 do
    local ranks = {}
    for k = 0, K - 1 do ranks[math.floor(pi[t * K + k] / L)] = true end
    local r = 0
    for _ in pairs(ranks) do r = r + 1 end
    sent = sent + (case.output == "expert_major" and K or r)
    scale[t + 1] = case.output == "expert_major" and K * wk or r
  end
  local wrong = h:sum(counts) == h:sum(sent) and 0 or 1
  if case.dtype == "bf16" then
    local out = ep:combine(recv.x, hd)
    wrong = wrong + wrong_rows(out:to("cpu"):f32(), x:to("cpu"):f32(), scale, 2 ^ -8)
  end
  return wrong
end
jit.off(check_ep)

local function dispatch_bytes(case, T) return T * K * (case.dtype == "fp8" and H + 4 * H / 128 or 2 * H) end

local function run_ep(case)
  local T = case.B
  local ep = dl.ep.buffer { comm = w, max_tokens = case.B, hidden = H, experts = case.E, topk = K,
    layout = case.layout, output = case.output, dtype = case.dtype, blocks = opt.blocks > 0 and opt.blocks or nil }
  local idx_h, w_h, wk = routing(T, case.E, case.B * 1000 + case.E)
  local x = dl.randn({ T, H }, { dtype = "bf16", seed = me + 17, device = w.device })
  local idx, wts = idx_h:to(w.device), w_h:to(w.device)
  local recv, hd = ep:dispatch(x, idx, wts)
  local y = dl.randn(recv.x:size(), { dtype = "bf16", device = w.device })
  local r = { impl = "distlab", path = "ep", B = case.B, E = case.E, layout = case.layout, output = case.output,
    dtype = case.dtype, method = "graph" }
  local dispatch, combine = ep.dispatch, ep.combine
  if opt.split then
    dispatch = function(e, ...) return e:dispatch_recv(e:dispatch_send(...)) end
    combine = function(e, yy, hh)
      e:combine_send(yy, hh)
      return e:combine_recv(hh)
    end
  end
  r.dispatch_us = timed(function() dispatch(ep, x, idx, wts) end)
  recv, hd = dispatch(ep, x, idx, wts)
  r.combine_us = timed(function() combine(ep, y, hd) end)
  r.both_us = timed(function()
    local _, hh = dispatch(ep, x, idx, wts)
    combine(ep, y, hh)
  end)
  r.dispatch_GBps = dispatch_bytes(case, T) / (r.dispatch_us * 1e3)
  r.combine_GBps = T * K * 2 * H / (r.combine_us * 1e3)
  r.bytes = ep:bytes().total
  r.wrong = h:check(function() return check_ep(ep, case, x, idx, wts, idx_h, wk) end)
  ep:free()
  return r
end

-- ---- the all_to_allv path --------------------------------------------------------------------

local function run_a2av(case)
  local T, L = case.B, case.E / N
  local idx = routing(T, case.E, case.B * 1000 + case.E)
  local pi = ffi.cast("int32_t*", idx:data_ptr())
  -- rows sorted by destination rank, one per (token, k): built once, untimed
  local x = dl.randn({ T, H }, { dtype = "bf16", seed = me + 17, device = w.device })
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
  local send = dl.empty({ math.max(1, #rows), H }, { dtype = "bf16", device = w.device })
  for i, t in ipairs(rows) do send:narrow(1, i, 1):copy_(x:narrow(1, t + 1, 1)) end
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
  local function dispatch()
    w:all_to_all(cnt_out, cnt_in)
    local rc = cnt_out:to("cpu"):tolist() -- what a plain MoE layer waits for
    w:all_to_allv(rflat, rc, sflat, send_counts)
  end
  local function combine() w:all_to_allv(bflat, send_counts, rflat, recv_counts) end
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
  -- the rows came back where they went out from
  r.wrong = h:check(function()
    dispatch()
    combine()
    local b, s = flat(back, #rows * H):to("cpu"), flat(send, #rows * H):to("cpu")
    return dl.max_abs_diff(b:f32(), s:f32()) == 0 and 0 or 1
  end)
  return r
end

-- ---- running --------------------------------------------------------------------------------

local COLS = { "impl", "path", "B", "E", "layout", "output", "dtype", "method", "dispatch_us", "combine_us", "both_us",
  "dispatch_GBps", "combine_GBps", "bytes", "wrong" }
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
    if want.a2av then add(run_a2av { B = B, E = E }) end
  end
end
if opt.torch then
  local head, recs = bench.csv.read(opt.torch)
  if not head then dl.fail("ep_bench: cannot read %s: %s", opt.torch, tostring(recs)) end
  for _, t in ipairs(recs) do
    local r = { impl = "torch", path = "a2a", B = tonumber(t.B), E = tonumber(t.E), layout = "-", output = "-",
      dtype = t.dtype, method = t.method }
    for _, c in ipairs { "dispatch_us", "combine_us", "both_us", "dispatch_GBps", "combine_GBps", "wrong" } do
      r[c] = tonumber(t[c])
    end
    r.bytes = 0
    add(r)
  end
end

local out = {}
for i, r in ipairs(rows) do
  out[i] = {}
  for j, c in ipairs(COLS) do
    local v = r[c]
    out[i][j] = type(v) == "number" and v ~= math.floor(v) and string.format("%.2f", v) or v
  end
end
local base = "ep-bench-" .. h.tag
local csv = h:csv(base .. ".csv", COLS, out)
local md = {
  string.format("H=%d, K=%d, T=B tokens on every rank, each picking K distinct experts uniformly%s. Latency: " ..
    "median over %d replays of a CUDA graph of %d calls, max over ranks (the all_to_allv and PyTorch rows: " ..
    "eager calls between events, as a plain MoE layer runs, its split sizes read on the host). Bandwidth as " ..
    "DeepEP counts it: selections x bytes per token / time. Published at 8 ranks on NVLink, B=128: DeepEP " ..
    "42.6 / 72.0 us (dispatch / combine, as Perplexity measured it), pplx-kernels 83.6 / 102.3 us (H100), " ..
    "NCCL EP about 65 / 79 us (bf16 both ways, H100).%s", H, K,
    opt.span > 0 and string.format(" among the first %d experts of each rank (--span)", opt.span) or "",
    opt.replays, opt.ops,
    (opt.blocks > 0 and string.format(" Every ep kernel on a grid of %d blocks (--blocks).", opt.blocks) or "") ..
    (opt.split and " Send and receive as two kernels each (--split: dispatch_send + dispatch_recv, " ..
      "combine_send + combine_recv)." or " Send and receive in one kernel each (dispatch, combine).")),
  "",
  "| impl | path | B | E | layout | output | dtype | dispatch us | combine us | both us | dispatch GB/s | combine GB/s | buffer MiB | #wrong |",
  "|---|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
}
for _, r in ipairs(rows) do
  md[#md + 1] = string.format("| %s | %s | %d | %d | %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d |",
    r.impl, r.path, r.B, r.E, r.layout, r.output, r.dtype, r.dispatch_us, r.combine_us, r.both_us, r.dispatch_GBps,
    r.combine_GBps, r.bytes / 2 ^ 20, r.wrong)
end
local path = h:markdown(base .. ".md", "Expert-parallel dispatch/combine: latency on " .. h.device_desc, md)
h:print("wrote %s and %s", csv, path)
h:finish()
