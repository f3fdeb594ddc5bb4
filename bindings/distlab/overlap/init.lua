-- distlab.overlap — tensor-parallel GEMMs with their communication pipelined
-- under them (seed 003: nvFuser's all-gather + GEMM over CUDA IPC).
--
--   local op = dl.overlap.ag_gemm{comm = w, algo = "p2p", transport = "get", copy = "ce", streams = 2}
--   local c = op:run(a_shard, b [, c])     c = all_gather(a_shard) @ b: a_shard [m/d, k] (rank r's
--                                          rows r*m/d ..), b [k, n] on every rank, c [m, n]
--   local op = dl.overlap.gemm_rs{comm = w, algo = "ring", transport = "put", ...}
--   local c = op:run(a_shard, b_shard [, c])  c = reduce_scatter(a_shard @ b_shard): a_shard
--                                          [m, k/d] (rank r's columns), b_shard [k/d, n], c [m/d, n]
--   op:check()   waits for the op's work (within twice the timeout) and reports a stuck run
--   op:info()    {algo, transport, copy, streams, rank, size, runs, failed, base, ...}
--   op:free()
--   dl.overlap.algos.ag / .rs, dl.overlap.transports, dl.overlap.copies
--   dl.overlap.variants(kind, streams) -> the option tables of every algo x transport x copy x
--                                        streams (streams: a list, default {1, 2})
--   dl.overlap.copy(dst, src [, blocks])  the transports' copy: copy engine, or a kernel of blocks
--
-- Options (each swaps one thing):
--   algo       ag: "nccl_then_gemm" (the communicator's all-gather into a full A, one GEMM),
--              "p2p" (d steps; step i multiplies rank (r + i) mod d's shard, taken from its
--              owner's symmetric buffer), "ring" (each rank relays the chunk it got at step i
--              at step i + 1); rs: "gemm_then_nccl", "p2p", "ring" (the mirrors)
--   transport  "get" (the receiver pulls once the owner signals ready) or "put" (the sender
--              pushes once the receiver signals free)
--   copy       "ce" (copy engine) or "sm" (a copy kernel of copy_blocks blocks, default 16,
--              capped at the rank's share of the GPU where ranks share one)
--   streams    s: step i runs on stream i mod s (default 2)
--   out_dtype  of an allocated c (default a's dtype; f32 also)
--   merge      ag p2p only: true (or "auto") multiplies a head of our shard first and the
--              rest of it with the neighbour's shard in one GEMM (overlap/ag_p2p_merge.lua);
--              a number: the head's rows (0 .. m/d); default false (overlap/ag_p2p.lua)
-- transport, copy and streams do not apply to the nccl baselines (they run on one stream).
--
-- Every run is stream-ordered on the current stream: it forks onto the op's
-- streams and joins back, so it can be captured in a CUDA graph. Buffers
-- (the symmetric slots, GEMM workspaces, the flags) are made at the first
-- run, from its shapes, and stay where they are for the op's life: later
-- runs must have the same shapes. The first run is collective and checks
-- that every rank runs the same op on the same shapes; a mismatch (e.g. m
-- not a multiple of d, so that ranks hold different shard rows) fails on
-- every rank, naming both sides. Flags: C side, dl_overlap_* in
-- core/include/distlab.h (stream memory operations on words in host memory
-- that every rank of the node maps; a watchdog turns a stuck run into an
-- error naming the step, the flag and the peer, and lets its streams drain). The
-- schedules: overlap/ag_*.lua and overlap/rs_*.lua, one file each.
local ffi = require "ffi"
local core = require "distlab.core"
local args = require "distlab.args"
local tensor = require "distlab.tensor"
local stream = require "distlab.stream"
local gemm = require "distlab.gemm"

local C, check, fail = core.C, core.check, core.fail
local T = tensor.methods

local M = {}
M.algos = { ag = { "nccl_then_gemm", "p2p", "ring" }, rs = { "gemm_then_nccl", "p2p", "ring" } }
M.transports = { "get", "put" }
M.copies = { "ce", "sm" }
local schedules = {
  ag = { nccl_then_gemm = "ag_nccl", p2p = "ag_p2p", ring = "ag_ring" },
  rs = { gemm_then_nccl = "rs_nccl", p2p = "rs_p2p", ring = "rs_ring" },
}
local KNOWN = { comm = true, algo = true, transport = true, copy = true, streams = true, copy_blocks = true,
  out_dtype = true, merge = true }

local Op = {}
Op.__index = Op
Op.__tostring = function(op)
  return string.format("overlap.%s(%s, rank %d of %d)", op.kind == "ag" and "ag_gemm" or "gemm_rs", op:label(),
    op.rank, op.size)
end

local function one_of(v, list, what, kind)
  for _, x in ipairs(list) do if v == x then return v end end
  fail("overlap.%s: unknown %s %q (%s)", kind, what, tostring(v), table.concat(list, ", "))
end

local function new(kind, o)
  local name = kind == "ag" and "ag_gemm" or "gemm_rs"
  if type(o) ~= "table" then fail("overlap.%s: expected a table of options", name) end
  args.options(o, KNOWN, "overlap." .. name)
  local comm = o.comm or require("distlab.comm").world()
  if type(comm) ~= "table" or comm.ptr == nil then fail("overlap.%s: comm must be a live communicator", name) end
  local op = setmetatable({ kind = kind, name = name, comm = comm, rank = comm.rank, size = comm.size,
    device = comm.device, runs = 0 }, Op)
  op.algo = one_of(o.algo or "p2p", M.algos[kind], "algo", name)
  op.transport = one_of(o.transport or "get", M.transports, "transport", name)
  op.copy = one_of(o.copy or "ce", M.copies, "copy", name)
  op.streams = args.int(o.streams or 2, "overlap." .. name .. ": streams", 1, 16)
  op.copy_blocks = args.int32(o.copy_blocks or 16, "overlap." .. name .. ": copy_blocks", 1)
  op.out_dtype = o.out_dtype and core.dtype_names[core.dtype_id(o.out_dtype)]
  local sched = schedules[kind][op.algo]
  if o.merge ~= nil and o.merge ~= false then
    if kind ~= "ag" then fail("overlap.gemm_rs: merge applies to ag_gemm's p2p only") end
    if op.algo ~= "p2p" then fail("overlap.ag_gemm: merge applies to algo p2p, not %s", op.algo) end
    if o.merge == true or o.merge == "auto" then
      op.merge = "auto"
    elseif type(o.merge) == "number" then
      op.merge = args.int32(o.merge, "overlap.ag_gemm: merge (the head's rows)", 0)
    else
      fail("overlap.ag_gemm: merge must be true, \"auto\", false or a row count, got %s", tostring(o.merge))
    end
    sched = "ag_p2p_merge"
  end
  op.schedule = require("distlab.overlap." .. sched)
  op.nccl = op.schedule.baseline == true
  if op.nccl then op.streams = 1 end
  return op
end

function M.ag_gemm(o) return new("ag", o) end
function M.gemm_rs(o) return new("rs", o) end

function M.variants(kind, streams)
  if not M.algos[kind] then fail("overlap.variants: kind must be \"ag\" or \"rs\", got %s", tostring(kind)) end
  local out = {}
  for _, algo in ipairs(M.algos[kind]) do
    if schedules[kind][algo]:match("_nccl$") then
      out[#out + 1] = { algo = algo }
    else
      for _, transport in ipairs(M.transports) do
        for _, copy in ipairs(M.copies) do
          for _, s in ipairs(streams or { 1, 2 }) do
            out[#out + 1] = { algo = algo, transport = transport, copy = copy, streams = s }
          end
        end
      end
    end
  end
  return out
end

-- "p2p get ce x2", or "nccl_then_gemm"
function Op:label()
  if self.nccl then return self.algo end
  return string.format("%s %s %s x%d%s", self.algo, self.transport, self.copy, self.streams,
    self.merge == "auto" and " merge" or self.merge and (" merge " .. self.merge) or "")
end

-- ---- the first run: shapes, buffers, flags --------------------------------------------

local function dims(t, what, name)
  if not tensor.is_tensor(t) then fail("%s: %s must be a tensor, got %s", name, what, type(t)) end
  if t.nd ~= 2 then fail("%s: %s must be 2-D, got %d dimensions", name, what, t.nd) end
  return tonumber(t.sz[0]), tonumber(t.sz[1])
end

-- The shapes of a run: rows (of a block of c's rows per rank), k and n of
-- each step's GEMM, m; every argument checked.
local function shapes(op, a, b)
  local name, d = op.name, op.size
  local ar, ac = dims(a, "a_shard", name)
  local br, bc = dims(b, op.kind == "ag" and "b" or "b_shard", name)
  if a.dtype_id ~= b.dtype_id or (a.dtype ~= "bf16" and a.dtype ~= "f16") then
    fail("%s: a_shard and b must both be bf16 or both f16, got %s and %s", name, a.dtype, b.dtype)
  end
  if ac ~= br then fail("%s: a_shard is [%d, %d] but b is [%d, %d] (a's columns must equal b's rows)", name, ar, ac, br, bc) end
  if a.dev_type ~= C.DL_META and core.device_name(a.dev_type, a.dev_index) ~= op.device then
    fail("%s: a_shard is on %s but the communicator on %s", name, a.device, op.device)
  end
  if not T.is_contiguous(a) then fail("%s: a_shard must be contiguous", name) end
  if op.kind == "ag" then return { rows = ar, k = ac, n = bc, m = ar * d } end
  if ar % d ~= 0 then
    fail("%s: a_shard has m = %d rows, which do not split over %d ranks (reduce-scatter gives each rank m/d; "
      .. "pad m to a multiple of %d)", name, ar, d, d)
  end
  return { rows = ar / d, k = ac, n = bc, m = ar }
end

function Op:describe(sh, a)
  return string.format("%s %s: a_shard [%d, %d] %s, b [%d, %d], out %s", self.name, self:label(),
    self.kind == "ag" and sh.rows or sh.m, sh.k, a.dtype, sh.k, sh.n, self.out_dtype or a.dtype)
end

local function round256(n) return math.ceil(n / 256) * 256 end

-- The fields of a description (Op:describe), by name, in order.
local FIELDS = { "op", "algo", "transport", "copy", "streams", "merge", "a_shard rows", "k", "n", "dtype", "out_dtype" }
local function fields(desc)
  local op, label, r, k, dt, n, out = desc:match("^(%S+) (.-): a_shard %[(%d+), (%d+)%] (%S+), b %[%d+, (%d+)%], out (%S+)$")
  if not op then return nil end
  local algo, transport, copy, streams, merge = label:match("^(%S+) (%S+) (%S+) x(%d+) ?(.*)$")
  return { op = op, algo = algo or label, transport = transport or "-", copy = copy or "-", streams = streams or "-",
    merge = merge ~= "" and merge or "no", ["a_shard rows"] = r, k = k, n = n, dtype = dt, out_dtype = out }
end

-- A mismatch of dl_overlap_new names the fields that differ (the core's
-- diff splits the shapes at their commas); only rows that differ in an
-- all-gather are the shard of an m that does not split over the ranks.
local function mismatch(msg, kind, d)
  local head, mine, theirs = msg:match("^(.-rank %d+ makes (.-) but rank %d+ makes (.-)) %(differs: [^\n]*%)")
  local a, b = fields(mine or ""), fields(theirs or "")
  if not (a and b) then return msg end
  local diff = {}
  for _, f in ipairs(FIELDS) do
    if a[f] ~= b[f] then diff[#diff + 1] = string.format("%s %s vs %s", f, a[f], b[f]) end
  end
  local hint = kind == "ag" and a["a_shard rows"] ~= b["a_shard rows"]
    and "; every rank must pass an a_shard of m/d rows: pad m to a multiple of " .. d
    or "; every rank must make the same op and run it on the same shapes"
  return string.format("%s (differs: %s%s)", head, table.concat(diff, ", "), hint)
end

-- Buffers once, at the first run (collective): the symmetric slots the
-- schedule asks for, the flags (READY 0, FREE 1), a GEMM workspace and an
-- event per stream.
function Op:plan(a, b)
  local sh = shapes(self, a, b)
  self.sh, self.dtype = sh, a.dtype
  self.out = self.out_dtype or a.dtype
  if self.out ~= a.dtype and self.out ~= "f32" then
    fail("%s: out_dtype %s with %s inputs (it must be %s or f32)", self.name, self.out, a.dtype, a.dtype)
  end
  self.what = self:describe(sh, a)
  local d = self.size
  if type(self.merge) == "number" and self.merge > sh.rows then
    fail("%s: merge = %d rows, more than the shard's %d (the head is a part of our shard)", self.name, self.merge,
      sh.rows)
  end
  self.regions, self.slots = {}, {}
  local offset = 0
  for _, reg in ipairs(self.schedule.regions and self.schedule.regions(self) or {}) do
    local name, shape, dtype = reg[1], reg[2], reg[3]
    -- packed: slot j + 1 starts where slot j ends, so that adjacent slots are one tensor (span)
    local bytes = shape[1] * shape[2] * C.dl_dtype_size(core.dtype_id(dtype))
    if not reg.packed then bytes = round256(bytes) end
    self.regions[name] = { offset = offset, shape = shape, dtype = dtype, bytes = bytes }
    offset = offset + d * bytes
  end
  local nflags = self.nccl and 0 or 2 * d
  local init = ffi.new("uint32_t[?]", math.max(nflags, 1))
  for p = 0, d - 1 do if nflags > 0 then init[d + p] = 1 end end
  local pp = ffi.new("dl_overlap_t*[1]")
  local mem = require "distlab.mem"
  local rc = mem.tag("overlap_buffers", function()
    return C.dl_overlap_new(pp, self.comm.ptr, self.what, offset, nflags, init)
  end)
  if rc < 0 then fail("%s", mismatch(ffi.string(C.dl_last_error()), self.kind, d)) end
  self.ov = ffi.gc(pp[0], C.dl_overlap_free)
  local info = ffi.new("dl_overlap_info_t")
  check(C.dl_overlap_info(self.ov, info))
  self.blocks = self.copy == "sm" and math.max(1, math.min(self.copy_blocks, info.sms > 0 and info.sms or
    self.copy_blocks)) or 0
  self.side, self.joins, self.ws = {}, {}, {}
  self.fork = stream.event(self.device)
  for j = 1, self.streams do
    self.side[j] = stream.stream(self.device)
    self.joins[j] = stream.event(self.device)
    if self.device ~= "cpu" then
      self.ws[j] = stream.with_stream(self.side[j], mem.tag, "gemm_workspace", tensor.empty,
        { gemm.workspace_bytes }, { dtype = "u8", device = self.device })
    end
  end
  -- the baselines' own buffers (a gathered A, a full partial C)
  if self.schedule.setup then stream.with_stream(self.side[1], mem.tag, "overlap_buffers", self.schedule.setup, self) end
end

-- A view of region `name`'s slot j in rank owner's buffer (default ours),
-- made once and kept.
function Op:slot(name, j, owner)
  owner = owner or self.rank
  local key = name .. "/" .. j .. "/" .. owner
  local v = self.slots[key]
  if v then return v end
  local reg = self.regions[name]
  local dimsa = ffi.new("int64_t[2]", reg.shape[1], reg.shape[2])
  local pp = ffi.new("dl_tensor_t*[1]")
  check(C.dl_overlap_tensor(pp, self.ov, owner, reg.offset + j * reg.bytes, core.dtype_id(reg.dtype), 2, dimsa))
  v = ffi.gc(pp[0], C.dl_tensor_free)
  self.slots[key] = v
  return v
end

-- A view of rows row0 .. row0 + nrows of a packed region `name` taken as one
-- tensor of its slots one after another (rank owner's, default ours), kept.
function Op:span(name, row0, nrows, owner)
  owner = owner or self.rank
  local key = name .. "/span " .. row0 .. "+" .. nrows .. "/" .. owner
  local v = self.slots[key]
  if v then return v end
  local reg = self.regions[name]
  local esize = C.dl_dtype_size(core.dtype_id(reg.dtype))
  local dimsa = ffi.new("int64_t[2]", nrows, reg.shape[2])
  local pp = ffi.new("dl_tensor_t*[1]")
  check(C.dl_overlap_tensor(pp, self.ov, owner, reg.offset + row0 * reg.shape[2] * esize, core.dtype_id(reg.dtype), 2,
    dimsa))
  v = ffi.gc(pp[0], C.dl_tensor_free)
  self.slots[key] = v
  return v
end

-- ---- what the schedules call -----------------------------------------------------------

function Op:READY(p) return p end
function Op:FREE(p) return self.size + p end

-- fn() with step i's stream (i mod streams) current
function Op:on(i, fn)
  local j = i % self.streams + 1
  self.cur = j
  return stream.with_stream(self.side[j], fn)
end

function Op:signal(peer, flag) check(C.dl_overlap_signal(self.ov, peer, flag, core.stream)) end

function Op:wait(flag, peer, step, what)
  check(C.dl_overlap_wait(self.ov, flag, peer, step, what, core.stream))
end

-- dst := src by the op's copy: the copy engine, or a kernel of self.blocks blocks
function Op:move(dst, src) check(C.dl_overlap_copy(dst, src, self.blocks, core.stream)) end

function Op:reduce(out, srcs)
  local arr = ffi.new("dl_tensor_t*[?]", #srcs)
  for i, s in ipairs(srcs) do arr[i - 1] = s end
  check(C.dl_overlap_reduce(out, arr, #srcs, core.stream))
end

-- dl.gemm with the workspace of the current step's stream
function Op:gemm(a, b, out, opts)
  opts = opts or {}
  opts.workspace = self.ws[self.cur]
  return gemm.run(a, b, out, opts)
end

-- rows j * rows .. of t (a block of c's rows, or of a's for reduce-scatter)
function Op:rows(t, j) return T.narrow(t, 1, j * self.sh.rows + 1, self.sh.rows) end

-- ---- running --------------------------------------------------------------------------

local function live(op, what)
  if op.freed then fail("%s: %s of a freed op", op.name, what) end
end

function Op:run(a, b, c)
  live(self, "run")
  if not self.ov then
    self:plan(a, b)
  else
    local sh = shapes(self, a, b)
    local want = self:describe(sh, a)
    if want ~= self.what then
      fail("%s: this op was set up for %s; it got %s (buffers stay put: make a new op for new shapes)", self.name,
        self.what, want)
    end
  end
  local sh = self.sh
  local cm = self.kind == "ag" and sh.m or sh.rows
  if c == nil then
    c = tensor.empty({ cm, sh.n }, { dtype = self.out, device = self.device })
  else
    local r, n = dims(c, "c", self.name)
    if r ~= cm or n ~= sh.n or c.dtype ~= self.out or not T.is_contiguous(c) then
      fail("%s: c must be a contiguous %s [%d, %d], got %s [%d, %d]%s", self.name, self.out, cm, sh.n, c.dtype, r, n,
        T.is_contiguous(c) and "" or " (strided)")
    end
  end
  local main = stream.current_stream()
  check(C.dl_overlap_begin(self.ov, core.stream))
  self.fork:record(main)
  for j = 1, self.streams do self.side[j]:wait(self.fork) end
  self.schedule[self.nccl and "run" or self.transport](self, a, b, c)
  for j = 1, self.streams do
    self.joins[j]:record(self.side[j])
    check(C.dl_stream_wait_event(core.stream, self.joins[j].ptr))
  end
  if self.schedule.finish then self.schedule.finish[self.transport](self, a, b, c) end
  check(C.dl_overlap_end(self.ov, core.stream))
  self.runs = self.runs + 1
  return c
end

function Op:check()
  live(self, "check")
  if self.ov then check(C.dl_overlap_check(self.ov, core.stream)) end
  return self
end

function Op:info()
  live(self, "info")
  local r = { kind = self.kind, algo = self.algo, transport = self.transport, copy = self.copy,
    streams = self.streams, copy_blocks = self.blocks, rank = self.rank, size = self.size, runs = self.runs,
    label = self:label(), merge = self.merge, head = self.head }
  if self.ov then
    local info = ffi.new("dl_overlap_info_t")
    check(C.dl_overlap_info(self.ov, info))
    r.failed, r.base, r.nbytes, r.waits = info.failed ~= 0, tonumber(ffi.cast("uintptr_t", info.base)),
      tonumber(info.nbytes), tonumber(info.waits)
    r.share, r.sms = info.share, info.sms
  end
  return r
end

function Op:free()
  -- the slot views hold the symmetric buffer's mappings of the peers' memory: closed now, not
  -- at some later collection, so that a peer's next buffer (which may reuse the freed memory,
  -- and with it the IPC handle) can be opened here
  for _, v in pairs(self.slots) do C.dl_tensor_free(ffi.gc(v, nil)) end
  if self.ov then C.dl_overlap_free(ffi.gc(self.ov, nil)) end
  self.ov, self.slots, self.ws, self.side = nil, {}, {}, {}
  self.freed = true
end

-- dst := src (contiguous, same dtype and size; either may be a view of a
-- peer's buffer) on the current stream: blocks 0 (default) by the copy
-- engine, else by the "sm" transport's copy kernel with that many blocks
function M.copy(dst, src, blocks)
  for _, x in ipairs { { dst, "dst" }, { src, "src" } } do
    if not tensor.is_tensor(x[1]) then fail("overlap.copy: %s must be a tensor, got %s", x[2], type(x[1])) end
  end
  check(C.dl_overlap_copy(dst, src, args.int32(blocks or 0, "overlap.copy: blocks", 0), core.stream))
  return dst
end

M.Op = Op
return M
