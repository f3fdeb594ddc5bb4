-- experiments/block/block.lua — a MoE transformer block (CP attention, TP
-- projections, a router, EP experts with SwiGLU, a shared expert), forward
-- and backward, under one schedule after another: each checked against the
-- same block on one rank, then timed stage by stage with a timeline.
--
--   ./distlab run -n 4 experiments/block/block.lua [--variants axes] [--quick]
--   ./distlab run -n 2 --device cuda experiments/block/block.lua --shape dsv3 --scale 0.25 \
--       --variants named --check no
--
-- The block is layer.lua (the algorithm, a stage at a time), its
-- communication ops.lua, its shapes and options configs.lua (--help lists
-- them). Ranks: N = tp x cp; rank = c tp + t (t the TP rank: TP groups are
-- neighbours), the CP group of t the ranks c tp + t; EP spans all N ranks
-- (experts / N each). With --tp 1 the one group is CP's and EP's; with --tp N
-- it is TP's and EP's. The sequence has N T tokens (T = --tokens a rank),
-- thd (lengths from --seqlens: a distribution or a .npy file, each padded
-- to a multiple of 2 cp tp) or bshd (one sequence); cut in dual chunks over
-- CP, then in tp parts (TP's sequence split). Routing: --routing topk (the
-- router's own), zipf / uniform (dl.workload: per-layer hot experts,
-- --zipf-s, --layer, --seed) or a .npy of top-k ids (a model's routing
-- replayed); the router's weights are its softmax at the ids either way.
--
-- Check (--check yes; default unless --shape dsv3): fresh inputs and
-- output gradient (x, dout: normal, zero on thd padding rows), the block's
-- forward output and every gradient (dx; the weights': QKV and output
-- projection shards, router, this rank's experts, shared expert; f32) set
-- against the same block on one rank (ops.single: fp64 on the cpu with
-- --ref cpu, the default; bf16 with fp32 sums on this rank's device with
-- --ref device), routed as the ranks routed (top-k near-ties would
-- otherwise flip experts between the two: the routing itself is checked
-- apart, every token's ids a top-k of the reference's probabilities within
-- 2^-7). Each tensor within --tol normwise (default 2^-6: the two round to
-- bf16 at different places, a few times along the chain; measured 0.4-1%)
-- and no element off by more than the reference's rms; a scale error shows
-- in the mean over the nine tensors of <got - ref, ref> / <ref, ref>, within
-- --tol / 4 (rounding's is under 2^-10 there). --plant scale=0.02 (2%), and
-- the plant spec's 1%,
-- must fail it.
--
-- Timing: --warmup steps, then --iters steps (forward + backward) under
-- dl.trace: per stage (a span each, layer.lua) its time (median over the
-- steps; max over ranks), its share of the step's critical path (each
-- instant of the step given to the main-stream stage running then, else
-- shared by the second-stream stages running: the main stream waited for
-- them; a gap is no stage), how much of it another stream's stage overlapped
-- (mean over ranks), the bytes it sends to other ranks (ops.bytes: payload,
-- analytic) and, with --compute yes, the same stage with every transfer
-- left out (ops.compute_only: the compute stages alone, one stream). The
-- step time is set against the compute-alone step: 1.0 is communication
-- wholly hidden. Peak memory by tag (dl.mem; rank 0's, and the peak's max
-- over ranks). Writes the trace (block-<tag>-<variant>.json, Perfetto) and
-- its PNG where gnuplot exists, and block-<tag>.md: the variants side by
-- side, then each one's stages and memory.
local dl = require "distlab"
local configs = require "experiments.block.configs"
local layer = require "experiments.block.layer"
local blockops = require "experiments.block.ops"
local seq = require "distlab.seq"
local workload = require "distlab.workload"
local verify = require "distlab.bench.verify"

local w = dl.comm.world()
local N, me = w.size, w.rank

local opt_doc = {}
for _, k in ipairs { "cp", "correction", "comm_buffers", "cp_overlap", "ag", "rs", "transport", "copy", "ep",
  "ep_backend", "overlap" } do
  opt_doc[#opt_doc + 1] = string.format("  %-13s %s (default %s)", k, configs.doc[k], tostring(configs.default[k]))
end
local h = dl.bench.harness {
  name = "block", family = "block", comm = w, tag = true,
  usage = "./distlab run -n N experiments/block/block.lua [options]",
  about = "a MoE transformer block forward and backward under schedule variants, checked against one rank, "
    .. "timed per stage (see the header). Schedule options (a variant changes some):\n" .. table.concat(opt_doc, "\n"),
  options = {
    { "shape", "choice", "tiny", "block widths (configs.lua)", values = { "tiny", "check", "small", "dsv3" } },
    { "scale", "number", 1, "scale hidden, heads, experts and FFNs (dsv3 to the GPUs at hand)" },
    { "tokens", "int", nil, "tokens a rank (default: the shape's)" },
    { "tp", "int", nil, "tensor-parallel ranks (cp = N / tp); default 2 where N >= 4 and even, else 1" },
    { "variants", "string", "default", "default | axes (the option table) | named | serial, overlap, ring, "
      .. "ulysses | a list joined by +" },
    { "layout", "choice", "thd", "attention layout", values = { "thd", "bshd" } },
    { "seqlens", "string", "lognormal", "thd lengths: fixed | uniform | lognormal | FILE.npy" },
    { "seq-mean", "int", nil, "mean sequence length (default: a quarter of the sequence)" },
    { "routing", "string", "zipf", "topk | zipf | uniform | FILE.npy ([tokens, K] or [layers, tokens, K])" },
    { "zipf-s", "number", 1.0, "Zipf exponent of expert popularity" },
    { "layer", "int", 0, "layer of the routing (its seed; its slice of a 3-D file)" },
    { "seed", "int", 1, "seed of the routing and the sequence lengths" },
    { "check", "choice", "auto", "check against one rank: yes | no | auto (yes but for dsv3)",
      values = { "yes", "no", "auto" } },
    { "ref", "choice", "cpu", "where the one-rank reference runs", values = { "cpu", "device" } },
    { "tol", "number", 2 ^ -6, "normwise bound of the check (the mean bias bound is a quarter of it)" },
    { "time", "choice", "yes", "time the variants", values = { "yes", "no" } },
    { "compute", "choice", "yes", "also time the compute alone", values = { "yes", "no" } },
    { "warmup", "int", 2, "untimed steps first" },
    { "iters", "int", 3, "timed steps" },
    { "attn-backend", "choice", "ours", "dl.attn backend", values = { "ours", "cudnn", "auto" } },
    { "png", "choice", "yes", "draw each trace's PNG (where gnuplot exists)", values = { "yes", "no" } },
  },
}
local opt = h.opt
local dev = w.device

-- ---- ranks, shapes, the sequence ---------------------------------------------------------

local P = opt.tp or ((N >= 4 and N % 2 == 0) and 2 or 1)
if N % P ~= 0 then error(string.format("block: --tp %d does not divide the %d ranks", P, N), 0) end
local C = N / P
local t_rank, c_rank = me % P, math.floor(me / P)
local cfg = configs.shape(opt.shape, opt.scale, N, P)
local T = opt.tokens or cfg.tokens
if h.quick then T = math.min(T, 16) end
local S = N * T
for _, c in ipairs {
  { cfg.heads % P == 0, "heads %d do not divide over tp %d", cfg.heads, P },
  { cfg.experts % N == 0, "experts %d do not divide over %d ranks", cfg.experts, N },
  { T % 2 == 0, "tokens a rank %d must be even (dual chunks)", T },
} do
  if not c[1] then error("block: " .. string.format(c[2], c[3], c[4]), 0) end
end

local comms = { world = w, side = {} }
if P > 1 then
  comms.tp = w:split(c_rank, t_rank)
  comms.side.tp = w:split(c_rank, t_rank)
end
if C > 1 then
  comms.cp = w:split(t_rank, c_rank)
  comms.side.cp = w:split(t_rank, c_rank)
end
comms.side.world = N > 1 and w:split(0, me) or w

-- thd lengths (padded to 2 cp tp) or one bshd sequence
local mult = 2 * C * P
local lens
if opt.seqlens:match("%.npy$") or opt.seqlens:match("%.safetensors$") then
  lens = workload.seqlens { file = opt.seqlens, total = S, multiple = mult }
else
  lens = workload.seqlens { total = S, multiple = mult, dist = opt.seqlens, mean = opt.seq_mean or math.max(1, S / 4),
    seed = opt.seed }
end

-- The rows of the whole sequence (0-based) each rank holds, its padding, and
-- the geometry the block and its ops read (layout: a variant may ask for bshd).
local function geometry(layout)
  local cu, cup
  if layout == "thd" then
    cu, cup = workload.cu_seqlens(lens, mult)
  else
    cu, cup = { 0, S }, { 0, S }
  end
  local valid = {}
  for i = 1, #cu - 1 do
    for r = cup[i], cup[i + 1] - 1 do valid[r] = r - cup[i] < cu[i + 1] - cu[i] end
  end
  -- rows of rank (c, t): CP rank c's dual chunks, then TP part t
  local function rows_of(c, t)
    local part = {}
    for _, sg in ipairs(seq.chunk_segments(cup, c, C)) do
      for j = 0, sg[3] - 1 do part[sg[2] + j + 1] = sg[1] + j end
    end
    local out = {}
    for j = 1, T do out[j] = part[t * T + j] end
    return out
  end
  local function pad_runs(rows)
    local runs = {}
    for j, r in ipairs(rows) do
      if not valid[r] then
        local last = runs[#runs]
        if last and last[1] + last[2] == j then last[2] = last[2] + 1 else runs[#runs + 1] = { j, 1 } end
      end
    end
    return runs
  end
  -- this CP rank's part as thd: valid counts and padded offsets (ops: C = 1, compute_only)
  local c_sz, at = seq.chunk_sizes(cup, C)
  local local_cu = { 0 }
  for i = 1, #cup - 1 do
    local len = cu[i + 1] - cu[i]
    local_cu[i + 1] = local_cu[i] + seq.chunk_valid(len, c_sz[i], c_rank) + seq.chunk_valid(len, c_sz[i], 2 * C - 1 - c_rank)
  end
  local g = { N = N, P = P, C = C, rank = me, t = t_rank, c = c_rank, T = T, m = P * T, S = S, H = cfg.hidden,
    heads = cfg.heads, hp = cfg.heads / P, dh = cfg.head_dim, E = cfg.experts, L = cfg.experts / N, K = cfg.topk,
    F = cfg.ffn, Fs = cfg.shared_ffn, layout = layout, cu = cu, cup = cup, local_cu = local_cu, local_cup = at,
    device = dev, attn_backend = opt.attn_backend }
  g.rows = rows_of(c_rank, t_rank)
  g.pad = pad_runs(g.rows)
  g.rows_of = rows_of
  -- the same block on one rank: every row, every head, every expert
  local ref_dev = opt.ref == "cpu" and "cpu" or dev
  local gr = setmetatable({ N = 1, P = 1, C = 1, rank = 0, t = 0, c = 0, T = S, m = S, hp = cfg.heads, L = cfg.experts,
    local_cu = cu, local_cup = cup, device = ref_dev }, { __index = g })
  local all = {}
  for r = 0, S - 1 do all[r + 1] = r end
  gr.rows, gr.pad = all, pad_runs(all)
  g.full_pad = gr.pad
  return g, gr
end

-- ---- weights, by seeds: any shard is drawn without the whole ------------------------------

local function draw(shape, seed, std, device)
  return dl.randn(shape, { dtype = "f32", seed = seed, device = device }):mul_(std):bf16()
end

-- g's shard of the weights: heads t hp .. (t + 1) hp - 1, experts rank L .. (rank + 1) L - 1
local function weights(g, device)
  local H, dh, hp = g.H, g.dh, g.hp
  local W = {}
  local cols = {}
  for j = 0, 2 do -- q, k, v
    for i = 0, hp - 1 do cols[#cols + 1] = draw({ H, dh }, 100000 + 3 * (g.t * hp + i) + j, H ^ -0.5, device) end
  end
  W.qkv = dl.cat(cols, 2)
  local rows = {}
  for i = 0, hp - 1 do rows[#rows + 1] = draw({ dh, H }, 200000 + g.t * hp + i, (g.heads * dh) ^ -0.5, device) end
  W.o = dl.cat(rows, 1)
  W.r = draw({ H, g.E }, 7, H ^ -0.5, device)
  local e13, e2 = {}, {}
  for e = 0, g.L - 1 do
    local ge = g.rank * g.L + e
    e13[#e13 + 1] = draw({ 1, H, 2 * g.F }, 300000 + ge, H ^ -0.5, device)
    e2[#e2 + 1] = draw({ 1, g.F, H }, 400000 + ge, g.F ^ -0.5, device)
  end
  W.e13, W.e2 = dl.cat(e13, 1), dl.cat(e2, 1)
  W.s13 = draw({ H, 2 * g.Fs }, 11, H ^ -0.5, device)
  W.s2 = draw({ g.Fs, H }, 12, g.Fs ^ -0.5, device)
  return W
end

-- x or dout of the whole sequence (zero on padding rows), and g's rows of it
local function full_input(g, seed, device)
  local X = draw({ g.S, g.H }, seed, 1, device)
  for _, r in ipairs(g.full_pad) do X:narrow(1, r[1], r[2]):zero_() end
  return X
end
local function rows_tensor(rows, device)
  local t = {}
  for i, r in ipairs(rows) do t[i] = r end
  return dl.from_table(t, { dtype = "i64", device = device })
end

-- this rank's routing when it is not the router's top-k
local function given_ids()
  if opt.routing == "topk" then return nil end
  local o = { tokens = T, experts = cfg.experts, topk = cfg.topk, layer = opt.layer, rank = me, device = dev }
  if opt.routing:match("%.npy$") or opt.routing:match("%.safetensors$") then
    o.file = opt.routing
  else
    o.dist, o.s, o.seed = opt.routing, opt.zipf_s, opt.seed
  end
  return workload.routing(o)
end

-- ---- the check ---------------------------------------------------------------------------

local SIDE_ALL = { shared = true, expert_dw = true, wgrad = true, grads = true }
local GRADS = { "qkv", "o", "r", "e13", "e2", "s13", "s2" }

-- ref's part that g holds, of a gradient (or output) named k
local function ref_part(k, ref, g)
  local hp, dh = g.hp, g.dh
  if k == "qkv" then
    local parts = {}
    for j = 0, 2 do parts[#parts + 1] = ref:narrow(2, j * g.heads * dh + g.t * hp * dh + 1, hp * dh) end
    return dl.cat(parts, 2)
  elseif k == "o" then
    return ref:narrow(1, g.t * hp * dh + 1, hp * dh)
  elseif k == "e13" or k == "e2" then
    return ref:narrow(1, g.rank * g.L + 1, g.L)
  end
  return ref
end

-- the ids every rank routed, in the reference's row order
local function ids_for_ref(g, gr, ids_ep)
  local all = dl.empty({ N * T, g.K }, { dtype = "i32", device = dev })
  if N > 1 then w:all_gather(all, ids_ep) else all:copy_(ids_ep) end
  local inv = {}
  for r = 0, N - 1 do
    for j, row in ipairs(g.rows_of(math.floor(r / P), r % P)) do inv[row + 1] = r * T + j - 1 end
  end
  return all:i64():to(gr.device):index_select(1, dl.from_table(inv, { dtype = "i64", device = gr.device }))
end

-- every token's ids a top-k of the reference's probabilities, within tol
local function check_topk(p_ref, ids, g)
  local p, id = p_ref:cpu():tolist(), ids:cpu():tolist()
  local bad = 0
  local pad = {}
  for _, r in ipairs(g.pad) do for j = r[1], r[1] + r[2] - 1 do pad[j] = true end end
  for i, row in ipairs(g.rows) do
    if not pad[i] then
      local chosen, lo, hi = {}, math.huge, -math.huge
      for _, e in ipairs(id[i]) do chosen[e] = true; lo = math.min(lo, p[row + 1][e + 1]) end
      for e = 0, g.E - 1 do if not chosen[e] then hi = math.max(hi, p[row + 1][e + 1]) end end
      if lo < hi - 2 ^ -7 * hi then bad = bad + 1 end
    end
  end
  return bad
end

-- ---- the report's numbers, from this rank's spans -------------------------------------------

local STAGES = { "qkv.fwd", "attention.fwd", "proj.fwd", "router.fwd", "shared.fwd", "route.fwd", "dispatch.fwd",
  "experts.fwd", "combine.fwd", "shared.bwd", "combine.bwd", "experts.bwd", "dispatch.bwd", "experts_dw.bwd",
  "router.bwd", "proj.bwd", "wgrad.proj", "attention.bwd", "qkv.bwd", "wgrad.qkv", "grads.bwd" }
local STAGE_AT = {}
for i, s in ipairs(STAGES) do STAGE_AT[s] = i end

local function median(xs)
  if #xs == 0 then return 0 end
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

-- per stage: time (us, median over steps), critical-path us, overlapped us, its
-- stream (1 main, 2 second); the step's time (us)
local function stage_numbers(recs, iters)
  local per = {}
  for i = 1, #STAGES do per[i] = { dur = {}, crit = 0, over = 0, tid = 0 } end
  local steps = {}
  for it = 1, iters do
    local step, spans = nil, {}
    for _, r in ipairs(recs) do
      local a = r.args or {}
      if a.iter == it then
        if r.name == "step" then step = r elseif STAGE_AT[r.name] then spans[#spans + 1] = r end
      end
    end
    if step then
      steps[#steps + 1] = step.dur
      local cuts = { step.ts, step.ts + step.dur }
      for _, sp in ipairs(spans) do cuts[#cuts + 1] = sp.ts; cuts[#cuts + 1] = sp.ts + sp.dur end
      table.sort(cuts)
      for j = 1, #cuts - 1 do
        local a, b = cuts[j], cuts[j + 1]
        if b > a and a >= step.ts and b <= step.ts + step.dur then
          local active, main = {}, {}
          for _, sp in ipairs(spans) do
            if sp.ts <= a and sp.ts + sp.dur >= b then
              active[#active + 1] = sp
              if sp.tid == step.tid then main[#main + 1] = sp end
            end
          end
          local owners = #main > 0 and main or active
          for _, sp in ipairs(owners) do
            local x = per[STAGE_AT[sp.name]]
            x.crit = x.crit + (b - a) / #owners / iters
          end
          for _, sp in ipairs(active) do
            for _, o in ipairs(active) do
              if o.tid ~= sp.tid then
                local x = per[STAGE_AT[sp.name]]
                x.over = x.over + (b - a) / iters
                break
              end
            end
          end
        end
      end
      for _, sp in ipairs(spans) do
        local x = per[STAGE_AT[sp.name]]
        x.dur[#x.dur + 1] = sp.dur
        x.tid = sp.tid == step.tid and 1 or 2
      end
    end
  end
  local out = { step = median(steps), stages = {} }
  for i = 1, #STAGES do
    local x = per[i]
    out.stages[i] = { time = median(x.dur), crit = x.crit, over = x.over, stream = x.tid, ran = #x.dur > 0 }
  end
  return out
end

-- ---- one variant ---------------------------------------------------------------------------

local results = {}
local variants = configs.variants(h.quick and opt.variants == "default" and "default" or opt.variants)
local do_check = opt.check == "yes" or (opt.check == "auto" and opt.shape ~= "dsv3")
local ids_given = given_ids()
local W_ref_cache = {}

local function sanitize(s) return (s:gsub("[^%w_.-]+", "_")) end

local function timed_steps(blk, X, D, n, first_iter)
  for i = 1, n do
    blk.iter = first_iter and (first_iter + i - 1) or 0
    dl.trace.span("step", function()
      blk:forward(X)
      blk:backward(D)
    end, { iter = blk.iter })
  end
  dl.synchronize(dev)
end

for vi, var in ipairs(variants) do
  local sch = configs.schedule(var.changes)
  local layout = var.changes.layout or opt.layout
  local g, gr = geometry(layout)
  local label = var.name
  local ok_sched, why = true, nil
  if sch.cp == "a2a" and C > 1 then
    if g.hp % C ~= 0 then ok_sched, why = false, string.format("a2a: %d heads a TP rank over %d CP ranks", g.hp, C) end
    if sch.cp_overlap and (g.hp / C) % 2 ~= 0 then ok_sched, why = false, "a2a overlap: odd heads a rank" end
  end
  if not ok_sched then
    h:print("block: variant %s skipped: %s", label, why)
  else
    local W = weights(g, dev)
    local ops = blockops.distributed(g, sch, comms)
    local blk = layer.new(g, W, ops, { side = sch.overlap and SIDE_ALL or nil, ids = ids_given, pad = g.pad })
    local res = { name = label, sch = sch, layout = layout }
    results[#results + 1] = res
    -- the step, with --plant's error in its outputs: what the check runs
    local step = h:planted(function(X, D)
      local out = blk:forward(X)
      local dx, d = blk:backward(D)
      return out, dx, d.qkv, d.o, d.r, d.e13, d.e2, d.s13, d.s2
    end, { returns = true })

    if do_check then
      local seed = 1000 + 17 * vi
      local X, D
      local rows = rows_tensor(g.rows, dev)
      h:verify {
        what = label,
        fresh = function()
          X = full_input(g, seed, dev):index_select(1, rows)
          D = full_input(g, seed + 1, dev):index_select(1, rows)
        end,
        run = function() return step(X, D) end,
        check = function(...)
          local got = { ... }
          -- the reference: the same block on one rank, routed as the ranks routed
          local key = layout
          W_ref_cache[key] = W_ref_cache[key] or weights(gr, gr.device)
          local ref_ids = ids_for_ref(g, gr, blk.last_ids_ep)
          local rblk = layer.new(gr, W_ref_cache[key], blockops.single(gr), { ids = ref_ids, pad = gr.pad })
          local XR = full_input(gr, seed, gr.device)
          local DR = full_input(gr, seed + 1, gr.device)
          local rout = rblk:forward(XR)
          local p_ref = opt.routing == "topk" and rblk.s.p or nil
          local rdx, rd = rblk:backward(DR)
          local rrows = rows_tensor(g.rows, gr.device)
          local want = { rout:index_select(1, rrows), rdx:index_select(1, rrows) }
          for _, k in ipairs(GRADS) do want[#want + 1] = ref_part(k, rd[k], g) end
          local names = { "out", "dx" }
          for _, k in ipairs(GRADS) do names[#names + 1] = "d" .. k end
          -- each tensor normwise (and no element off by more than the reference's rms); a scale
          -- error in all of them shows as their mean bias <got - ref, ref> / <ref, ref>
          local bad, msgs, worst, bias, each = 0, {}, 0, 0, {}
          for i, name in ipairs(names) do
            local n, msg, st = verify.close(got[i], want[i], { atol_rms = 1, norm = opt.tol, bias = math.huge })
            worst = math.max(worst, st.norm)
            bias = bias + st.bias / #names
            if n > 0 then msgs[#msgs + 1] = name .. ": " .. msg end
            each[#each + 1] = string.format("%s %.2g/%.2g", name, st.norm, st.bias)
            bad = bad + n
          end
          if not (math.abs(bias) <= opt.tol / 4) then
            msgs[#msgs + 1] = string.format("the mean bias of the %d tensors is %.3g, beyond %.3g", #names, bias,
              opt.tol / 4)
            bad = bad + 1
          end
          if p_ref then
            local nb = check_topk(p_ref, blk.last_ids_ep, g)
            if nb > 0 then msgs[#msgs + 1] = string.format("routing: %d tokens' ids are not a top-%d of the "
              .. "reference's probabilities", nb, g.K) end
            bad = bad + nb
          end
          res.check_norm = worst
          if bad > 0 then return bad, table.concat(msgs, "; ") end
          return 0, string.format("out, dx and 7 weight gradients within normwise %.3g (worst %.3g), mean bias %.3g "
            .. "within %.3g (normwise/bias: %s)", opt.tol, worst, bias, opt.tol / 4, table.concat(each, ", "))
        end,
      }
      res.check_norm = h:max(res.check_norm or 0)
    end

    if opt.time == "yes" and not h.plant then
      local Xr = full_input(g, 7, dev):index_select(1, rows_tensor(g.rows, dev))
      local Dr = full_input(g, 8, dev):index_select(1, rows_tensor(g.rows, dev))
      timed_steps(blk, Xr, Dr, math.max(opt.warmup, 1))
      blk.bytes = ops.bytes(blk.last_ids_ep) -- the dispatch's bytes follow the routing taken
      dl.mem.reset_peak(dev)
      local base = string.format("block-%s-%s", h.tag, sanitize(label))
      dl.trace.start { comm = w }
      timed_steps(blk, Xr, Dr, opt.iters, 1)
      local png_opt -- nil: the PNG beside the JSON, where gnuplot exists
      if opt.png == "no" then png_opt = false end
      local path, recs, png = dl.trace.stop { path = h:path(base .. ".json"), png = png_opt }
      res.trace, res.png = path, png
      res.mem = dl.mem.report { device = dev, unit = T * cfg.hidden * 2, unit_name = "x" }
      res.peak_max = h:max(res.mem.peak)
      local nums = stage_numbers(recs, opt.iters)
      res.step = h:max(nums.step)
      local times, crit, over = {}, {}, {}
      for i, st in ipairs(nums.stages) do
        times[i], crit[i], over[i] = st.time, st.crit, st.over
      end
      res.times, res.crit, res.over = h:max(times), h:sum(crit), h:sum(over)
      res.stream = {}
      for i, st in ipairs(nums.stages) do res.stream[i] = st.ran and st.stream or 0 end
      local sent = {}
      for i, name in ipairs(STAGES) do sent[i] = blk.bytes[name] or 0 end
      res.sent = h:sum(sent)
      if opt.compute == "yes" then
        local cops = blockops.compute_only(g, ops)
        local cblk = layer.new(g, W, cops, { ids = ids_given, pad = g.pad })
        timed_steps(cblk, Xr, Dr, opt.warmup)
        dl.trace.start { comm = w }
        timed_steps(cblk, Xr, Dr, opt.iters, 1)
        local _, crecs = dl.trace.stop { path = h:path(base .. "-compute.json"), png = false }
        local cn = stage_numbers(crecs, opt.iters)
        res.compute_step = h:max(cn.step)
        local ct = {}
        for i, st in ipairs(cn.stages) do ct[i] = st.time end
        res.compute = h:max(ct)
      end
    end
    ops.free()
    collectgarbage()
  end
end

-- ---- the report -----------------------------------------------------------------------------

local function ms(us) return us and string.format("%.3f", us / 1000) or "-" end
local function pct(x, of) return (of and of > 0) and string.format("%.0f%%", 100 * x / of) or "-" end
local function mib(b) return string.format("%.2f", b / 1048576) end
local bytes = dl.mem.format_bytes

local md = {}
local function both(line)
  h:print("%s", line)
  md[#md + 1] = line
end

local shape_line = string.format("%s: hidden %d, %d heads of %d, %d experts top-%d, expert FFN %d, shared FFN %d; "
  .. "%d tokens a rank (%d in all, %s%s); N %d = tp %d x cp %d, EP over %d; routing %s", cfg.name, cfg.hidden,
  cfg.heads, cfg.head_dim, cfg.experts, cfg.topk, cfg.ffn, cfg.shared_ffn, T, S, opt.layout,
  opt.layout == "thd" and string.format(" %d sequences from %s", #lens, opt.seqlens) or "", N, P, C, N,
  opt.routing == "topk" and "the router's top-k" or (opt.routing .. (opt.routing == "zipf" and
  string.format(" s=%g layer %d seed %d", opt.zipf_s, opt.layer, opt.seed) or "")))
both("")
both("# block: " .. shape_line)
if ids_given then
  local st = workload.routing_stats(ids_given, cfg.experts)
  both(string.format("routing on rank %d: the busiest expert gets %.2fx the mean", me, st.imbalance))
end

if opt.time == "yes" and not h.plant and #results > 0 then
  both("")
  both("| variant | schedule | step ms | compute alone ms | step / compute | peak MiB (max over ranks) | check (normwise) |")
  both("|---|---|---:|---:|---:|---:|---:|")
  for _, r in ipairs(results) do
    if r.step then
      local s = r.sch
      local sched = string.format("cp %s%s, ag %s, rs %s%s, ep %s, overlap %s", s.cp,
        s.cp == "p2p" and string.format(" (%s, %s)", s.correction, tostring(s.comm_buffers)) or
        (s.cp_overlap and " overlap" or ""), s.ag, s.rs,
        (s.ag ~= "nccl_then_gemm" or s.rs ~= "gemm_then_nccl") and string.format(" %s %s", s.transport, s.copy) or "",
        s.ep, tostring(s.overlap))
      both(string.format("| %s | %s%s | %s | %s | %s | %s | %s |", r.name, sched,
        r.layout ~= opt.layout and (", " .. r.layout) or "", ms(r.step), ms(r.compute_step),
        r.compute_step and string.format("%.2f", r.step / r.compute_step) or "-", mib(r.peak_max),
        r.check_norm and string.format("%.2g", r.check_norm) or "-"))
    end
  end
  for _, r in ipairs(results) do
    if r.step then
      both("")
      both(string.format("## %s: step %s ms (max over ranks), compute alone %s ms", r.name, ms(r.step),
        ms(r.compute_step)))
      both("")
      both("| stage | stream | time ms | critical path | overlapped | sent | compute alone ms |")
      both("|---|---|---:|---:|---:|---:|---:|")
      local crit_sum = 0
      for i, name in ipairs(STAGES) do
        if r.stream[i] > 0 then
          local crit = r.crit[i] / N
          crit_sum = crit_sum + crit
          both(string.format("| %s | %s | %s | %s | %s | %s | %s |", name, r.stream[i] == 1 and "main" or "second",
            ms(r.times[i]), pct(crit, r.step), pct(r.over[i] / N, r.times[i]), bytes(math.floor(r.sent[i] / N)),
            r.compute and ms(r.compute[i]) or "-"))
        end
      end
      both(string.format("| (no stage: gaps, the joins' waits for nothing, host issue) | | | %s | | | |",
        pct(math.max(r.step - crit_sum, 0), r.step)))
      both("")
      both("Peak memory by tag on rank 0 (x = one [T, H] bf16 activation, " .. bytes(T * cfg.hidden * 2) .. "):")
      both("")
      both("```")
      for line in tostring(r.mem):gmatch("[^\n]+") do both(line) end
      both("```")
      if r.png then both(string.format("![timeline](%s)", r.png:match("[^/]+$"))) end
      both(string.format("trace: `%s`", r.trace and r.trace:match("[^/]+$") or "-"))
    end
  end
  if h.rank0 then
    local path = h:markdown(string.format("block-%s.md", h.tag), "MoE block: " .. shape_line, md, {
      "- method: experiments/block/block.lua's header; per stage the median of " .. opt.iters .. " steps after "
        .. opt.warmup .. " warm-up, max over ranks; critical path and overlap: mean over ranks" })
    print("block: wrote " .. path)
  end
end

h:finish()
h:print("block ok: %d variants on %d ranks (%s)", #results, N, dev)
