-- distlab.ep — expert-parallel low-latency MoE dispatch and combine
-- (core/ops/ep/, kernels/ep/; the buffer layouts are in kernels/ep/ep.h).
--
--   local ep = dl.ep.buffer { comm = w, max_tokens = B, hidden = H, experts = E, topk = K,
--     layout = "per_rank" | "per_expert", output = "expert_major" | "rank_major",
--     dtype = "bf16" | "fp8", blocks = nil (1..1024), ranks = nil (the comm's),
--     backend = "ours" | "nccl_ep" }   collective
--   backend = "nccl_ep": the same calls over NVIDIA's NCCL EP (distlab.ep_nccl has
--     its options: algorithm = "low_latency" | "high_throughput", and what maps to what)
--   local recv, handle = ep:dispatch(x, topk_idx, topk_weights)
--       x bf16 [T, H] (T <= B), topk_idx int32 [T, K] (-1: no expert), topk_weights f32 [T, K]
--       expert_major: recv = {x = [L, N*B, H], counts = [L]}: rows r < counts[e] of x[e]
--         are the tokens local expert e got (rows ordered by source rank, then token)
--       rank_major: recv = {x = [N, B, H], counts = [N], expert_ids = [N, B, K],
--         weights = [N, B, K]}: row j < counts[s] of x[s] is a token of rank s, and
--         expert_ids[s][j][k] the local expert of its selection k (-1: on another rank)
--       dtype "fp8": x holds e4m3 codes (u8) and recv.scales [.., H/128] f32, x ~ code * scale
--   local out = ep:combine(y, handle[, {out = t}])  -> bf16 [T, H]
--       y bf16 shaped like recv.x. expert_major: each row the output of its expert;
--       out[t] = sum_k w[t, k] * y_k(t) in fp32 (id -1 skipped). rank_major: each row
--       already weighted over its selections on that rank (recv.weights); out[t] = the
--       sum over ranks.
--   ep:dispatch_send(x, topk_idx, topk_weights) -> handle;  ep:dispatch_recv(handle) -> recv
--   ep:combine_send(y, handle);  ep:combine_recv(handle[, out]) -> out
--       the two phases apart (two kernels on cuda), so other work can run while the
--       messages travel; dispatch and combine run both in one kernel
--   ep:bytes()   symmetric bytes per rank by part: dispatch_send, dispatch_recv,
--                combine_send, combine_recv, signals, total; and outputs (the
--                tensors above, not symmetric). The allocator charges each part to
--                the tag "ep_<part>" (dl.mem.report shows them; outputs: ep_outputs).
--                On cuda the buffer is in whole 2 MiB pages: signals holds the rounding
--   ep:info(), ep:check() (wait and report what the kernels recorded), ep:free()
--                (every later call is an error, and so is reading recv's tensors
--                and combine's default out)
--   dl.ep.formula(opts) -> the same parts from the layout's formulas, for `ranks` ranks
--                (as meta and cpu count them: the buffer rounded to 4 KiB)
--
-- Knobs (every rank alike; dl_ep_new checks the second): DISTLAB_EP_PDL=0 launches
-- without programmatic dependent launch; DISTLAB_EP_LAMPORT_MAX_ROWS (default 256):
-- per_rank buffers with rank_major output whose receive is at most this many rows,
-- ranks x max_tokens, combine in Lamport slots (no flag, no fence: kernels/ep/ep.h;
-- 0.4-1.7 us faster at B 1-128 on 2 H200s), and dispatch so too with bf16 payloads
-- (0.5-1.3 us faster), others with the flag.
--
-- recv, handle and the default out are the buffer's own tensors, reused by
-- the next dispatch (one dispatch in flight per buffer; make two buffers for
-- two); a handle of an older dispatch is refused. Every rank makes the same
-- calls in the same order, on the current stream: a rank a call ahead or behind
-- (an extra or missing dispatch or combine) is an error on every rank naming the
-- calls (the call tag, kernels/ep/ep.h), and a dead peer ends every wait within a
-- second naming it. On meta the buffer counts
-- its bytes for any world size and moves nothing.
local ffi = require "ffi"
local core = require "distlab.core"
local args = require "distlab.args"
local tensor = require "distlab.tensor"

local C, check, fail = core.C, core.check, core.fail

local M = {}
M.layouts = { per_expert = C.DL_EP_PER_EXPERT, per_rank = C.DL_EP_PER_RANK }
M.outputs = { expert_major = C.DL_EP_EXPERT_MAJOR, rank_major = C.DL_EP_RANK_MAJOR }
M.dtypes = { bf16 = 0, fp8 = 1 }
M.backends = { ours = true, nccl_ep = true }
-- The names name_of(0), name_of(1), ... up to its first NULL (the library's lists).
function M.names(name_of)
  local n = {}
  for i = 0, math.huge do
    local name = name_of(i)
    if name == nil then return n end
    n[i + 1] = ffi.string(name)
  end
end
-- the parts of ep:bytes(), in DL_EP_*_BYTES order, as the library names them
M.parts = M.names(C.dl_ep_part_name)

-- {part = bytes} of an info struct's bytes array, in the order of parts
function M.by_part(parts, bytes)
  local b = {}
  for i, name in ipairs(parts) do b[name] = tonumber(bytes[i - 1]) end
  return b
end

local Buffer = {}
Buffer.__index = Buffer

local function tensor_arg(x, what)
  if not tensor.is_tensor(x) then fail("%s must be a tensor, got %s", what, type(x)) end
end

local function names(t)
  local n = {}
  for k in pairs(t) do n[#n + 1] = k end
  table.sort(n)
  return table.concat(n, ", ")
end

function M.choice(o, key, list, dflt, fn)
  local v = o[key] == nil and dflt or o[key]
  if list[v] == nil then fail("%s: %s %s (expected one of %s)", fn, key, tostring(v), names(list)) end
  return v
end

-- the options of ep.buffer; formula takes them but comm, and ranks
local buffer_keys = { "comm", "max_tokens", "hidden", "experts", "topk", "layout", "output", "dtype", "blocks", "ranks",
  "backend" }
local formula_keys = { "max_tokens", "hidden", "experts", "topk", "layout", "output", "dtype", "blocks", "ranks" }

-- The options as the library takes them (errors name the option); fn names
-- the caller in messages. Integers are checked to fit the C int (args.int32),
-- their ranges by dl_ep_new.
local function config(o, fn, known)
  if type(o) ~= "table" then fail("%s: expected a table of options", fn) end
  args.options(o, known, fn)
  local function int(key, lo) return args.int32(o[key], fn .. ": " .. key, lo) end
  local c = ffi.new("dl_ep_config_t")
  c.max_tokens, c.hidden, c.experts, c.topk = int("max_tokens", 1), int("hidden", 1), int("experts", 1), int("topk", 1)
  c.layout = M.layouts[M.choice(o, "layout", M.layouts, "per_rank", fn)]
  c.output = M.outputs[M.choice(o, "output", M.outputs, "expert_major", fn)]
  c.fp8 = M.dtypes[M.choice(o, "dtype", M.dtypes, "bf16", fn)]
  c.blocks = o.blocks == nil and 0 or int("blocks", 1) -- nil: the default grid (0)
  return c
end

-- A backend's calls, its C functions <prefix>free, check, dispatch_send ...
-- (their signatures dl_ep_*'s), looked up once; raw(ptr): its info struct
-- (ctype) filled by <prefix>info; parts: the names of its bytes.
function M.calls(prefix, ctype, parts)
  local api, raw = { parts = parts }, ffi.new(ctype)
  for _, name in ipairs { "free", "check", "dispatch_send", "dispatch", "dispatch_recv", "combine_send", "combine_recv",
    "combine", "info" } do
    api[name] = C[prefix .. name]
  end
  local info_fn = api.info
  function api.raw(ptr)
    check(info_fn(ptr, raw))
    return raw
  end
  return api
end

-- What the Buffer's methods call for our buffers (ep_nccl.lua has nccl_ep's).
local ours = M.calls("dl_ep_", "dl_ep_info_t", M.parts)
function ours.info(ptr)
  local info = ours.raw(ptr)
  return { rank = info.rank, size = info.size, local_experts = info.local_experts, blocks = info.blocks,
    threads = info.threads, failed = info.failed ~= 0, tokens = info.tokens,
    msg_dispatch = tonumber(info.msg_dispatch), msg_combine = tonumber(info.msg_combine),
    dispatches = tonumber(info.dispatches), combines = tonumber(info.combines) }
end
function ours.describe(ep)
  return string.format("ep(%s, %s, %s, B=%d, H=%d, E=%d, K=%d, rank %d of %d, %.1f MiB symmetric)", ep.layout,
    ep.output, ep.dtype, ep.max_tokens, ep.hidden, ep.experts, ep.topk, ep.rank, ep.size, ep:bytes().total / 2 ^ 20)
end

-- The buffer around ptr (wrapped for the GC) of a backend's api: fields,
-- and its output tensors viewed once through tensor_fn (which index: the
-- DL_EP_* tensors, and `extra` past them).
function M.wrap(ptr, api, fields, tensor_fn, extra)
  local ep = setmetatable(fields, Buffer)
  ep.ptr, ep.api, ep.calls, ep.views = ptr, api, 0, setmetatable({}, { __mode = "k" })
  local i = ep:info()
  ep.rank, ep.size, ep.local_experts, ep.blocks = i.rank, i.size, i.local_experts, i.blocks
  local t = {}
  local which = { x = C.DL_EP_X, scales = C.DL_EP_SCALES, counts = C.DL_EP_COUNTS,
    expert_ids = C.DL_EP_EXPERT_IDS, weights = C.DL_EP_WEIGHTS, out = C.DL_EP_OUT }
  for key, w in pairs(extra or {}) do which[key] = w end
  for key, w in pairs(which) do
    local tp = ffi.new("dl_tensor_t*[1]")
    check(tensor_fn(ptr, w, tp))
    if tp[0] ~= nil then t[key] = ffi.gc(tp[0], C.dl_tensor_free) end
  end
  ep.tensors = t
  return ep
end

function M.buffer(o)
  if type(o) ~= "table" then fail("ep.buffer: expected a table of options") end
  if M.choice(o, "backend", M.backends, "ours", "ep.buffer") == "nccl_ep" then
    return require("distlab.ep_nccl").buffer(o)
  end
  if o.algorithm ~= nil then
    fail("ep.buffer: algorithm is nccl_ep's (low_latency, high_throughput); ours is low latency, with two " ..
      "layouts: per_rank is NCCL EP low_latency's buffer (give backend = \"nccl_ep\" for NCCL EP's own)")
  end
  if o.output == "flat" then
    fail("ep.buffer: output flat is nccl_ep high_throughput's; ours: expert_major or rank_major (the nearest, a row " ..
      "per token and source rank that the caller weights)")
  end
  local c = config(o, "ep.buffer", buffer_keys)
  local comm = o.comm or require("distlab.comm").world()
  if type(comm) ~= "table" or comm.ptr == nil then fail("ep.buffer: comm must be a live communicator") end
  if o.ranks ~= nil and o.ranks ~= comm.size then
    fail("ep.buffer: ranks %s, but comm '%s' has %d ranks (ranks is dl.ep.formula's; a buffer takes its comm's)",
      tostring(o.ranks), tostring(comm.name), comm.size)
  end
  local pp = ffi.new("dl_ep_t*[1]")
  check(C.dl_ep_new(pp, comm.ptr, c))
  return M.wrap(ffi.gc(pp[0], C.dl_ep_free), ours, { comm = comm, device = comm.device, backend = "ours",
    layout = o.layout or "per_rank", output = o.output or "expert_major", dtype = o.dtype or "bf16",
    max_tokens = c.max_tokens, hidden = c.hidden, experts = c.experts, topk = c.topk }, C.dl_ep_tensor)
end

Buffer.__tostring = function(ep)
  if ep.ptr == nil then return "ep(<freed>)" end
  return ep.api.describe(ep)
end

-- The buffer's handle; an error at the caller's caller's line once freed.
local function live(ep)
  if type(ep) ~= "table" or getmetatable(ep) ~= Buffer then fail("expected an ep buffer (dl.ep.buffer), got %s", type(ep)) end
  if ep.ptr == nil then fail("this ep buffer was freed (ep:free()): make a new one") end
  return ep.ptr
end

-- A view of the buffer's tensor `key` that ep:free() frees too.
local function view(self, key, n)
  local v = self.tensors[key]:narrow(1, 1, n)
  self.views[v] = true
  return v
end

function Buffer:info() return self.api.info(live(self)) end

-- {part = bytes} (the backend's parts)
function Buffer:bytes() return M.by_part(self.api.parts, self.api.raw(live(self)).bytes) end

function Buffer:check()
  check(self.api.check(live(self), core.stream))
  return self
end

-- Gives the buffer and its outputs back now (views of them, recv's tensors
-- among them, are freed too).
function Buffer:free()
  for _, t in pairs(self.tensors or {}) do t:free() end
  for v in pairs(self.views or {}) do v:free() end
  if self.ptr ~= nil then self.api.free(ffi.gc(self.ptr, nil)) end
  self.ptr, self.tensors, self.views = nil, nil, {}
end

-- ---- dispatch and combine ----------------------------------------------------------------

-- recv: the buffer's output tensors of the last dispatch (those its
-- configuration has: ep.tensors)
local function received(self)
  local t = self.tensors
  return { x = t.x, scales = t.scales, counts = t.counts, expert_ids = t.expert_ids, weights = t.weights,
    offsets = t.offsets }
end

-- The handle of the dispatch that `fn` (api.dispatch_send or api.dispatch) ran. A bad
-- expert id on cpu fails the call after the tokens went out: the dispatch counts all the same.
local function dispatched(self, fn, what, x, topk_idx, topk_weights)
  local ptr = live(self)
  tensor_arg(x, what .. ": x")
  tensor_arg(topk_idx, what .. ": topk_idx")
  tensor_arg(topk_weights, what .. ": topk_weights")
  local rc = fn(ptr, x, topk_idx, topk_weights, core.stream)
  self.calls = self:info().dispatches
  check(rc)
  return { ep = self, call = self.calls, tokens = tonumber(x.sz[0]) }
end

function Buffer:dispatch_send(x, topk_idx, topk_weights, ...)
  args.none_after("ep:dispatch_send", 3, x, topk_idx, topk_weights, ...)
  return dispatched(self, self.api.dispatch_send, "ep:dispatch_send", x, topk_idx, topk_weights)
end

local function handle_of(self, h, what)
  live(self)
  if type(h) ~= "table" or h.ep ~= self then fail("ep %s: expected a handle of this buffer's dispatch", what) end
  if h.call ~= self.calls then
    fail("ep %s: the handle of dispatch %d is stale: dispatch %d reused the buffer's outputs", what, h.call, self.calls)
  end
  return h
end

function Buffer:dispatch_recv(h)
  h = handle_of(self, h, "dispatch_recv")
  check(self.api.dispatch_recv(live(self), core.stream))
  return received(self), h
end

-- send and receive in one launch (one kernel on cuda): what dispatch_send
-- then dispatch_recv give, with one launch and one grid drain fewer
function Buffer:dispatch(x, topk_idx, topk_weights, ...)
  args.none_after("ep:dispatch", 3, x, topk_idx, topk_weights, ...)
  local h = dispatched(self, self.api.dispatch, "ep:dispatch", x, topk_idx, topk_weights)
  return received(self), h
end

function Buffer:combine_send(y, h, ...)
  args.none_after("ep:combine_send", 2, y, h, ...)
  h = handle_of(self, h, "combine_send")
  tensor_arg(y, "ep:combine_send: y")
  check(self.api.combine_send(live(self), y, core.stream))
end

function Buffer:combine_recv(h, out, ...)
  args.none_after("ep:combine_recv", 2, h, out, ...)
  h = handle_of(self, h, "combine_recv")
  if out ~= nil then tensor_arg(out, "ep:combine_recv: out") end
  out = out or view(self, "out", h.tokens)
  check(self.api.combine_recv(live(self), out, core.stream))
  return out
end

-- send and receive in one launch, as dispatch; opts {out = t}
function Buffer:combine(y, h, opts, ...)
  args.none_after("ep:combine", 3, y, h, opts, ...)
  h = handle_of(self, h, "combine")
  opts = args.options(opts, { "out" }, "ep:combine")
  tensor_arg(y, "ep:combine: y")
  if opts.out ~= nil then tensor_arg(opts.out, "ep:combine: out") end
  local out = opts.out or view(self, "out", h.tokens)
  check(self.api.combine(live(self), y, out, core.stream))
  return out
end

-- ---- the layouts' formulas --------------------------------------------------------------

local function align(n, a) return math.ceil(n / a) * a end

-- Bytes per rank of each part for the options of ep.buffer plus ranks = N,
-- from the layout as kernels/ep/ep.h describes it (not from the library, so
-- that the allocator's count checks it).
function M.formula(o)
  local c = config(o, "dl.ep.formula", formula_keys)
  local N = args.int32(o.ranks, "dl.ep.formula: ranks", 1)
  if c.experts % N ~= 0 then
    fail("dl.ep.formula: experts %d is not a multiple of the %d ranks (each rank holds experts / ranks)", c.experts, N)
  end
  local B, H, E, K, L = c.max_tokens, c.hidden, c.experts, c.topk, c.experts / N
  local per_rank, fp8 = c.layout == C.DL_EP_PER_RANK, c.fp8 == 1
  -- token + K (local expert, position, weight) / token, row, k, weight; header and message
  -- padded to 128-byte lines (DL_EP_LINE)
  local hdr = align(per_rank and 4 + 8 * K or 16, 128)
  local msg_d = align(hdr + align(fp8 and (H + 4 * H / 128) or 2 * H, 16), 128)
  local msg_c = align(2 * H, 128)
  -- per_rank with rank_major output in Lamport slots (two halves) up to
  -- DISTLAB_EP_LAMPORT_MAX_ROWS rows received, N B (default 256: DL_EP_LAMPORT_MAX_ROWS,
  -- kernels/ep/ep.h), as dl_ep_new decides: the dispatch's and the combine's
  local lamport = per_rank and c.output == C.DL_EP_RANK_MAJOR and
    N * B <= (tonumber(os.getenv("DISTLAB_EP_LAMPORT_MAX_ROWS") or "") or 256)
  -- (the dispatch's with bf16 payloads): slots [2][N][B] and the sources' count words [N]
  -- (to a line) / [N][B] / [L][N][B]
  local drecv = lamport and not fp8 and 2 * N * B * msg_d + align(4 * N, 128) or (per_rank and N or E) * B * msg_d
  local crecv = (per_rank and (lamport and 2 or 1) * K or E) * B * msg_c -- slots [2][K][B] / [K][B] / [E][B]
  local ctrl = align((8 + 8 * N + N * L) * 4, 4096) -- flags, counts, call tags, counts per (source, expert)
  -- the symmetric buffer rounds to 4 KiB and keeps its signal pad behind the data
  local pad = 4 * (C.DL_SIGNAL_FLAGS + C.DL_SIGNAL_MAX_BLOCKS * C.DL_SIGNAL_MAX_RANKS + C.DL_SIGNAL_MAX_BLOCKS + 4)
  local total = align(ctrl + drecv + crecv, 4096) + pad
  local em = c.output == C.DL_EP_EXPERT_MAJOR
  local rows = em and L * N * B or N * B
  local outputs = rows * H * (fp8 and 1 or 2) + (fp8 and rows * H / 128 * 4 or 0) + (em and L or N) * 4 +
    (em and 0 or 2 * rows * K * 4) + B * H * 2 + rows * 2 * 4 + 2 * B * K * 4
  return { dispatch_send = 0, dispatch_recv = drecv, combine_send = 0, combine_recv = crecv,
    signals = total - drecv - crecv, total = total, outputs = outputs, msg_dispatch = msg_d, msg_combine = msg_c }
end

M.Buffer = Buffer
return M
