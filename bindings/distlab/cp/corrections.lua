-- distlab.cp.corrections — how the p2p ring's per-step partial results
-- (out, lse) become one (O, L): the correction strategies, and your own.
--
--   dl.cp.register_correction(name, spec)   name: letters, digits, _; then
--       dl.cp.attention{algo = "p2p", correction = name}. Registering a name
--       again replaces your earlier spec (a script re-run in the REPL); the
--       library's own (post_loop, incremental, fused) cannot be replaced.
--   dl.cp.attention{correction = spec, ...}  a spec table directly, without
--       a name in the registry (spec.name, if set, is what the ranks compare
--       and cp prints; else "custom")
--   dl.cp.corrections.names() -> the registered names, sorted
--   dl.cp.corrections.library      the library's own: fused, incremental, post_loop
--
-- The contract. A spec is {start = fn, step = fn, finish = fn, peak = fn}
-- (plus name, doc: strings). The schedule (cp/p2p.lua, M.forward) calls on
-- every rank, on the current stream:
--   start(f)              once, before the ring loop
--   step(f, st)           for i = 0 .. C-1 in order: run the step's attention,
--                         dl.attn.fwd(st.q, st.k, st.v, st.o) with st.o.out and
--                         st.o.lse set (the step's result: q's dtype, or f32
--                         for a partial kept in fp32) or st.o.accumulate =
--                         {out =, lse =} (the kernel's fused merge), and fold
--                         it into what f keeps
--   finish(f) -> {out = O, lse = L}   once, after the loop and after the
--                         K/V buffers are freed: O of q's dtype, shaped like q
--                         with v's head dim; L f32 [b, h, s_r] (thd [h, t_r]),
--                         this rank's rows in dual-chunk order. Free what
--                         else the correction made (plan.free).
--   peak(g, comm) -> bytes   the most the correction holds at once during
--                         the forward, plus the `comm` bytes of K/V buffers
--                         while those live (the loop; finish runs after
--                         they are freed): the schedule adds the inputs and
--                         the fixed parts (M.peak in cp/p2p.lua). On meta,
--                         cp:memory(...) measures exactly what this predicts
--                         (.fwd.peak against .formula.fwd).
-- f, one table per forward (yours to add to):
--   f.pl        the plan (cp/plan.lua): pl.C ranks, pl.r this rank, pl.layout,
--               pl.thd, and the helpers below
--   f.q, f.k, f.v   this rank's shards; f.cp the cp.attention object (its
--               options: f.cp.causal, f.cp.scale, f.cp.layout, ...)
--   f.comp      the stream the steps compute on (the caller's current one)
--   f.ms        a second stream of the object's, for merges beside compute
--   f.ev        the object's events; ev.done and ev.back are free for a
--               correction's use in the forward (ready and arrived are the
--               ring's)
-- st, one table per step:
--   st.i        the step, 0 .. C-1; st.src the rank whose K/V it holds (r - i)
--   st.part     the rows of Q it computes: "all", or "second" (causal bshd/sbhd
--               steps with src > r: chunk 2C-1-r only)
--   st.q        those rows of Q (pl:part(f.q, st.part)); st.k, st.v the K/V
--               rows (all, or the first half when src < r, causal)
--   st.o        dl.attn.fwd's options for the step (layout, mask, scale,
--               backend, thd's cu_seqlens, max_logit): add out/lse or accumulate
-- Helpers (cp/plan.lua): pl:result(qv, v, out_tag, lse_tag[, dtype]) -> {out, lse}
-- (empty, for the rows of qv; thd: 0 and -inf; dtype "f32" for fp32
-- partials); pl:part(x, part[, "lse"]) (a view of those rows, freed at the
-- step's end); pl:merge_opts(part[, extra]) (the options of dl.attn.merge_lse
-- / merge_out / correct_grad for those rows; thd: this rank's offsets);
-- plan.free(...) (free now: the allocator, not the GC, decides a peak);
-- plan.wait(stream, event); plan.on(stream, event, fn) (fn on stream, then
-- event recorded there). Charge what you allocate to a memory tag
-- (dl.mem.tag: out_per_step, lse_per_step, accumulator) so reports split it.
-- g, the geometry (cp:geometry(q, k, v[, seq])), in bytes per rank: Uq, Uk,
-- Uv, Uo (one per-rank Q, K, V, O: rows x heads x head dim x e), l (one lse:
-- rows x hq x 4), e (bytes of an element of q), rows (query rows: b s_r, or
-- t_r), hq, hkv, dqk, dv (head dims), C, r, layout, causal, comm_buffers,
-- correction, dkv, ml (4 hq with return_max_logit), B (thd sequences),
-- seqlens_rows(n), workspace(rows[, h]). An fp32 O is g.Uo / g.e * 4.
--
-- The library's corrections, each a table entry below with its memory:
--   post_loop    TE's main: keep every step's (out, lse), merge after the loop
--   incremental  seed 000: merge each step into a running (O, L) on a side
--                stream while the next computes (SLOTS = 2 out/lse slots)
--   fused        the attention kernel folds each step into (O, L) in its
--                epilogue; no per-step output exists. O is q's dtype: the
--                running output is rounded to bf16 (f16) after every step
--                (an f32 accumulator is a correction of your own: see
--                experiments/cp/f32_partials.lua)
local dl = require "distlab"
local plan = require "distlab.cp.plan"

local fail, free, wait, on = dl.fail, plan.free, plan.wait, plan.on
local M = {}

-- n buffers that rotate over the C-1 hops of the ring: never more than C-1.
local function rotating(n, C) return math.min(n, C - 1) end

-- incremental: out/lse slots that rotate, so that step i+1 computes while
-- step i merges.
local SLOTS = 2

local function accumulator(f)
  return dl.mem.tag("accumulator", dl.attn.accumulator, f.q, f.v, { layout = f.pl.layout, dtype = f.q.dtype })
end

local function attend(st) dl.attn.fwd(st.q, st.k, st.v, st.o) end

local BUILTIN = {
  -- TE's main: keep every step's (out, lse), U + l each (half the rows for
  -- bshd/sbhd steps on the second half of Q), and merge them after the loop
  -- into (O, L), U + l, made once the K/V buffers are gone: L = logaddexp of
  -- every step's lse, then O = sum_i e^(L_i - L) O_i.
  post_loop = {
    start = function(f) f.parts = {} end,
    step = function(f, st)
      local part = f.pl:result(st.q, f.v, "out_per_step", "lse_per_step")
      part.half = st.part
      f.parts[#f.parts + 1] = part
      st.o.out, st.o.lse = part.out, part.lse
      attend(st)
    end,
    finish = function(f)
      local acc = accumulator(f)
      for _, p in ipairs(f.parts) do dl.attn.merge_lse(acc.lse, p.lse, f.pl:merge_opts(p.half)) end
      for i, p in ipairs(f.parts) do
        dl.attn.merge_out(acc.out, acc.lse, p.out, p.lse,
          f.pl:merge_opts(p.half, { mode = i == 1 and "init" or "add", skip_zero_rows = f.pl.thd }))
        free(p.out, p.lse)
      end
      return acc
    end,
    peak = function(g, comm)
      local P = g.C * (g.Uo + g.l)
      if g.causal and g.layout ~= "thd" then P = (1 + g.r + (g.C - 1 - g.r) / 2) * (g.Uo + g.l) end
      return P + math.max(comm, g.Uo + g.l)
    end,
  },

  -- Seed 000: the running (O, L), U + l, and SLOTS out/lse slots, U + l
  -- each; each step is merged into (O, L) as it finishes, on the merge
  -- stream, while the next computes into another slot. Step 0 covers
  -- every row: it writes (O, L) itself.
  incremental = {
    start = function(f)
      f.acc = accumulator(f)
      f.slots = {}
      for j = 1, rotating(SLOTS, f.pl.C) do
        local s = f.pl:result(f.q, f.v, "out_per_step", "lse_per_step")
        s.merged = dl.event(f.q.device):record(f.comp) -- the merge that last read the slot
        s.out:record_stream(f.ms)
        s.lse:record_stream(f.ms)
        f.slots[j] = s
      end
      if f.pl.thd then f.pl.meta_t:record_stream(f.ms) end
    end,
    step = function(f, st)
      if st.i == 0 then
        st.o.out, st.o.lse = f.acc.out, f.acc.lse
        return attend(st)
      end
      local s = f.slots[(st.i - 1) % #f.slots + 1]
      wait(f.comp, s.merged)
      st.o.out, st.o.lse = f.pl:part(s.out, st.part), f.pl:part(s.lse, st.part, "lse")
      attend(st)
      f.ev.done:record(f.comp)
      wait(f.ms, f.ev.done)
      on(f.ms, s.merged, function()
        dl.attn.merge_out(f.acc.out, f.acc.lse, s.out, s.lse,
          f.pl:merge_opts(st.part, { mode = "incremental", skip_zero_rows = f.pl.thd }))
      end)
    end,
    finish = function(f)
      for _, s in ipairs(f.slots) do
        wait(f.comp, s.merged)
        free(s.out, s.lse)
      end
      return f.acc
    end,
    peak = function(g, comm) return comm + (1 + rotating(SLOTS, g.C)) * (g.Uo + g.l) end,
  },

  -- The running (O, L), U + l: the attention kernel folds each step into it
  -- in its epilogue; no per-step output ever exists.
  fused = {
    start = function(f) f.acc = accumulator(f) end,
    step = function(f, st)
      st.o.accumulate = { out = f.pl:part(f.acc.out, st.part), lse = f.pl:part(f.acc.lse, st.part, "lse") }
      attend(st)
    end,
    finish = function(f) return f.acc end,
    peak = function(g, comm) return comm + g.Uo + g.l end,
  },
}

-- ---- the registry ------------------------------------------------------------------

local registry = {}
-- the library's own names, sorted (what its specs sweep; names() adds yours)
M.library = {}
for name, spec in pairs(BUILTIN) do
  spec.name = name
  registry[name] = spec
  M.library[#M.library + 1] = name
end
table.sort(M.library)

local SPEC_KEYS = { start = "function", step = "function", finish = "function", peak = "function",
  name = "string", doc = "string" }

-- The spec checked: the four functions there, nothing unknown.
local function checked(spec, where)
  if type(spec) ~= "table" then fail("%s: a correction is a table {start, step, finish, peak}, got %s", where, type(spec)) end
  local known = {}
  for k in pairs(SPEC_KEYS) do known[#known + 1] = k end
  table.sort(known)
  for k, v in pairs(spec) do
    if SPEC_KEYS[k] == nil then
      fail("%s: unknown key %s in the correction (known: %s)", where, tostring(k), table.concat(known, ", "))
    end
    if type(v) ~= SPEC_KEYS[k] then fail("%s: the correction's %s must be a %s, got %s", where, k, SPEC_KEYS[k], type(v)) end
  end
  for _, k in ipairs { "start", "step", "finish", "peak" } do
    if spec[k] == nil then fail("%s: the correction has no %s (it needs start, step, finish and peak)", where, k) end
  end
  return spec
end

function M.names()
  local n = {}
  for name in pairs(registry) do n[#n + 1] = name end
  table.sort(n)
  return n
end

-- dl.cp.register_correction(name, spec): cp.attention{correction = name} then
-- runs it. spec = {start =, step =, finish =, peak =}: the contract (the
-- fields of f, st and g, what finish returns, what peak counts) is this
-- file's header: ?dl.cp.corrections.
function M.register(name, spec)
  if type(name) ~= "string" or not name:match("^[%w_]+$") then
    fail("cp.register_correction: name must be letters, digits and _, got %s", tostring(name))
  end
  if BUILTIN[name] then fail("cp.register_correction: %s is the library's own correction; pick another name", name) end
  checked(spec, "cp.register_correction")
  if spec.name ~= nil and spec.name ~= name then
    fail("cp.register_correction: spec.name is %q but it is registered as %q", spec.name, name)
  end
  registry[name] = spec
  return name
end

-- dl.cp.unregister_correction(name): forget a correction registered before
-- (the library's own stay); registering a name again replaces it.
function M.unregister(name)
  if BUILTIN[name] then fail("cp.unregister_correction: %s is the library's own correction", tostring(name)) end
  if registry[name] == nil then fail("cp.unregister_correction: no correction %s is registered", tostring(name)) end
  registry[name] = nil
end

-- The (name, spec) of cp.attention's correction option: a registered name or a spec table.
function M.resolve(x, where)
  if type(x) == "table" then
    checked(x, where)
    return x.name or "custom", x
  end
  local spec = type(x) == "string" and registry[x]
  if not spec then
    fail("%s: correction = %s is not one of %s (or register yours: dl.cp.register_correction)", where, tostring(x),
      table.concat(M.names(), ", "))
  end
  return x, spec
end

return M
