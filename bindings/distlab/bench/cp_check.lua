-- distlab.bench.cp_check — a context-parallel schedule's results checked
-- against fp64 single-rank attention at sampled rows (distlab.bench.attn_rows),
-- for the CP benches: cp_bench (every timed call), cp_memory and
-- cp_cudnn_memory (the schedules they measure, run once more).
--
--   local cpc = require "distlab.bench.cp_check"
--   local x = cpc.inputs { layout =, B =, S =, H =, D =, seed = }
--       the whole sequence's q, k, v, dout (randn as bf16, seeds seed + 1..4, on the
--       default device), x.o: dl.attn's options (causal; thd: B sequences of S), x.seq:
--       the schedules' seq tables (thd)
--   local c = cpc.new { inputs = x, comm = world, elements = 1e5 }
--       the fp64 reference at sampled rows of x, the rows split among comm's ranks
--       (each checks its share: a schedule's results are gathered to whole sequences first)
--   c:shards(comm) -> {q, k, v, dout}       this rank's shards for a schedule on comm
--   c:check(comm, out, lse[, dq, dk, dv]) -> wrong, msg, rel, maxabs
--       a schedule's results on comm (this rank's shards; dl.cp.unshard, collective)
--       against the reference; rel, maxabs: the largest normwise error and |got - ref| of
--       out, dq, dk, dv over this rank's rows
--   c:verify(h, what, cp, comm) -> wrong, rel, maxabs
--       h:verify of cp's forward + backward (planted: --plant goes in) on c's inputs:
--       wrong elements over h's ranks, the largest errors over them
local dl = require "distlab"
local rows = require "distlab.bench.attn_rows"

local M = {}
local C = {}
C.__index = C

function M.inputs(o)
  local B, S, layout = o.B, o.S, o.layout or "bshd"
  local shape = layout == "thd" and { B * S, o.H, o.D } or layout == "sbhd" and { S, B, o.H, o.D } or { B, S, o.H, o.D }
  local function rnd(seed) return dl.randn(shape, { dtype = "f32", seed = (o.seed or 0) + seed }):to("bf16") end
  local x = { q = rnd(1), k = rnd(2), v = rnd(3), dout = rnd(4), layout = layout }
  if layout == "thd" then
    local cu = {}
    for b = 0, B do cu[b + 1] = b * S end
    x.seq = { cu_seqlens_q = cu, cu_seqlens_q_padded = cu }
    local t = dl.from_table(cu, { dtype = "i32" })
    x.o = { layout = "thd", mask = "causal", cu_seqlens_q = t, cu_seqlens_kv = t, max_seqlen_q = S, max_seqlen_kv = S }
  else
    x.o = { layout = layout, mask = "causal" }
  end
  return x
end

function M.new(o)
  local x, comm = o.inputs, o.comm
  local c = setmetatable({ x = x, sharded = {} }, C)
  c.ref = rows.prepare { q = x.q, k = x.k, v = x.v, dout = x.dout, opts = x.o, elements = o.elements,
    seed = o.seed or 1, part = comm and { comm.rank, comm.size } or nil }
  return c
end

function C:describe() return self.ref:describe() end

local function shard_opts(self, comm, lse)
  return { comm = comm, layout = self.x.layout, cu_seqlens_padded = self.x.seq and self.x.seq.cu_seqlens_q_padded,
    dim = lse and (self.x.layout == "thd" and 2 or 3) or nil }
end

function C:shards(comm)
  local s = self.sharded[comm]
  if not s then
    local so = shard_opts(self, comm)
    s = { q = dl.cp.shard(self.x.q, so), k = dl.cp.shard(self.x.k, so), v = dl.cp.shard(self.x.v, so),
      dout = dl.cp.shard(self.x.dout, so) }
    self.sharded[comm] = s
  end
  return s
end

function C:check(comm, out, lse, dq, dk, dv)
  local function full(t, is_lse) return comm.size > 1 and dl.cp.unshard(t, shard_opts(self, comm, is_lse)) or t end
  local got = { out = full(out), lse = full(lse, true) }
  if dq then got.dq, got.dk, got.dv = full(dq), full(dk), full(dv) end
  local n, msg, e, m = self.ref:check(got)
  local rel, mx = 0, 0
  for _, name in ipairs({ "out", "dq", "dk", "dv" }) do rel, mx = math.max(rel, e[name] or 0), math.max(mx, m[name] or 0) end
  return n, msg, rel, mx
end

function C:verify(h, what, cp, comm)
  local s = self:shards(comm)
  local run = h:planted(function()
    local out, lse = cp:forward(s.q, s.k, s.v, self.x.seq)
    local dq, dk, dv = cp:backward(s.dout)
    return out, lse, dq, dk, dv
  end, { returns = true })
  local rel, mx = 0, 0
  local wrong = h:verify { what = what, fresh = function() end, run = run,
    check = function(...)
      local n, msg, r, m = self:check(comm, ...)
      rel, mx = r, m
      return n, msg
    end }
  return wrong, h:max(rel), h:max(mx)
end

return M
