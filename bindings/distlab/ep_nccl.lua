-- distlab.ep_nccl — dl.ep.buffer{backend = "nccl_ep"}: the EP buffer's calls
-- (distlab.ep) over NVIDIA's NCCL EP, libnccl_ep.so of the pinned nccl-extensions
-- 0.1.0 (NCCL EP 0.2), opened at run time (core/ops/ep/nccl_ep_lib.c: DISTLAB_NCCL_EP
-- names the file; scripts/fetch-nccl-ep.sh fetches it; it needs NCCL 2.29.2 or newer).
-- cuda only, on an NCCL communicator (one rank a GPU).
--
--   local ep = dl.ep.buffer { backend = "nccl_ep", comm = w, max_tokens = B, hidden = H,
--     experts = E, topk = K, algorithm = "low_latency" | "high_throughput",
--     output = ..., dtype = "bf16" | "fp8", blocks = nil (NCCL EP's max_num_sms) }
--   algorithm "low_latency" (the default; its buffer is per source rank, our
--   per_rank layout, the only layout it takes):
--     output "expert_major" | "rank_major": recv and combine as distlab.ep's, except
--       that rank_major's recv.weights of a selection on another rank hold the
--       token's weight (ours: 0; its recv.expert_ids is -1 there, as ours);
--     hidden, max_tokens and topk such that its combine buffers come in 16-byte units
--       (hidden a multiple of 512 always does; else a clear error says what fits);
--     dtype "fp8": NCCL EP's DeepSeek recipe (e4m3 codes, an f32 scale a 128 values,
--       recv.scales as ours); hidden a multiple of 512 (bf16: of 128)
--     dispatch_send / dispatch_recv and combine_send / combine_recv: its send_only
--       calls and ncclEpComplete; combine_recv writes where combine_send said: the
--       buffer's own out (use ep:combine(y, h, {out = t}) for another)
--   algorithm "high_throughput" (bf16; no send/receive phases; on 3 ranks or fewer an even
--   max_tokens: its dispatch moves the buffer's tokens in pairs, and NCCL EP aborts otherwise):
--     output "expert_major": recv = {x [S, H], counts [L], offsets [L], weights [S]},
--       S = N*B*min(K, L): expert e's counts[e] rows from row offsets[e] (0-based),
--       weights each row's routing weight. y shaped like x, each row already
--       weighted by the caller (NCCL EP's contract: ours weights in the combine)
--     output "flat": recv = {x [S, H], counts [1], expert_ids [S, K] (i64: NCCL EP's
--       high throughput writes 64-bit ids), weights [S, K]},
--       S = N*B: counts[1] rows, a row per token that picked an expert here, its
--       selections' local ids (-1 elsewhere) and weights; y each row weighted
--       over its selections here (as rank_major's)
--   ep:bytes(): handle (its routing buffers), library (what it allocated through
--     its allocator hooks), window (the rest of the GPU memory its group and handle
--     took: its NCCL-registered buffer), total, outputs; total charged to the
--     memory tag ep_nccl. ep:info() adds version, nccl_version (ncclGetVersion's
--     coding), slots (rows of x) and path (the library opened).
-- topk_idx (and low latency expert_major's topk_weights) are read again by the
-- combine: keep them unchanged until it (the buffer holds a view of them). NCCL EP
-- stops a process on arguments it refuses, so everything is checked first, here and
-- in the core. A low-latency wait past the comm's timeout masks the late peer: the
-- next call or ep:check() says so and the buffer refuses work; in high throughput it
-- traps the kernel (the CUDA context is lost). ep:free() is collective (NCCL EP's
-- group deregisters an NCCL window): every rank frees its buffer together.
local ffi = require "ffi"
local core = require "distlab.core"
local args = require "distlab.args"
local ep = require "distlab.ep"

local C, check, fail = core.C, core.check, core.fail

local M = {}
M.algorithms = { low_latency = C.DL_EP_NCCL_LOW_LATENCY, high_throughput = C.DL_EP_NCCL_HIGH_THROUGHPUT }
-- each algorithm's outputs
M.outputs = {
  low_latency = { expert_major = C.DL_EP_EXPERT_MAJOR, rank_major = C.DL_EP_RANK_MAJOR },
  high_throughput = { expert_major = C.DL_EP_EXPERT_MAJOR, flat = C.DL_EP_FLAT },
}
-- the parts of ep:bytes(), in DL_EP_NCCL_*_BYTES order
M.parts = ep.names(C.dl_ep_nccl_part_name)

local keys = { "comm", "max_tokens", "hidden", "experts", "topk", "output", "dtype", "blocks", "backend",
  "algorithm", "layout", "ranks" }

-- An option of ours that NCCL EP has no counterpart for: an error naming the nearest.
local function refuse(o, algorithm)
  if o.ranks ~= nil then fail("ep.buffer: ranks is dl.ep.formula's; a buffer takes its comm's ranks") end
  if o.layout ~= nil and not (algorithm == "low_latency" and o.layout == "per_rank") then
    if algorithm == "low_latency" then
      fail("ep.buffer: nccl_ep low_latency has no layout %s: its buffer is per source rank, as our per_rank " ..
        "(give layout = \"per_rank\" or none; per_expert is ours only: backend = \"ours\")", tostring(o.layout))
    end
    fail("ep.buffer: nccl_ep high_throughput lays out its own buffers (staging through NVLink windows), neither " ..
      "per_rank nor per_expert: give no layout (the nearest of ours: per_rank)")
  end
  if o.output == "rank_major" and algorithm == "high_throughput" then
    fail("ep.buffer: nccl_ep high_throughput has no output rank_major; the nearest is flat (a row per token that " ..
      "picked an expert here, with its expert ids and weights; the caller weights the rows, as rank_major's), or " ..
      "algorithm = \"low_latency\"")
  end
  if o.output == "flat" and algorithm == "low_latency" then
    fail("ep.buffer: output flat is nccl_ep high_throughput's; low_latency's nearest is rank_major (rows by source " ..
      "rank), or algorithm = \"high_throughput\"")
  end
  if o.dtype == "fp8" and algorithm == "high_throughput" then
    fail("ep.buffer: nccl_ep high_throughput has no fp8 dispatch (NCCL EP's fp8 recipe is low-latency only): " ..
      "algorithm = \"low_latency\", or dtype = \"bf16\"")
  end
end

local api = ep.calls("dl_ep_nccl_", "dl_ep_nccl_info_t", M.parts)
function api.info(ptr)
  local info = api.raw(ptr)
  return { rank = info.rank, size = info.size, local_experts = info.local_experts, failed = info.failed ~= 0,
    tokens = info.tokens, version = info.version, nccl_version = info.nccl_version, slots = tonumber(info.slots),
    dispatches = tonumber(info.dispatches), combines = tonumber(info.combines), path = ffi.string(info.path) }
end
function api.describe(b)
  local v = b:info().version
  return string.format("ep(nccl_ep %d.%d.%d %s, %s, %s, B=%d, H=%d, E=%d, K=%d, rank %d of %d, %.1f MiB)",
    math.floor(v / 10000), math.floor(v / 100) % 100, v % 100, b.algorithm, b.output, b.dtype, b.max_tokens,
    b.hidden, b.experts, b.topk, b.rank, b.size, b:bytes().total / 2 ^ 20)
end

-- dl.ep.buffer{backend = "nccl_ep", ...} (distlab.ep calls it)
function M.buffer(o)
  local fn = "ep.buffer"
  args.options(o, keys, fn)
  local algorithm = ep.choice(o, "algorithm", M.algorithms, "low_latency", fn)
  refuse(o, algorithm)
  local outputs = M.outputs[algorithm]
  local output = o.output == nil and "expert_major" or o.output
  if outputs[output] == nil then
    local n = {}
    for k in pairs(outputs) do n[#n + 1] = k end
    table.sort(n)
    fail("%s: output %s (nccl_ep %s's: %s)", fn, tostring(output), algorithm, table.concat(n, ", "))
  end
  local dtype = ep.choice(o, "dtype", ep.dtypes, "bf16", fn)
  local comm = o.comm or require("distlab.comm").world()
  if type(comm) ~= "table" or comm.ptr == nil then fail("ep.buffer: comm must be a live communicator") end
  local function int(key, lo) return args.int32(o[key], fn .. ": " .. key, lo) end
  local c = ffi.new("dl_ep_nccl_config_t")
  c.max_tokens, c.hidden, c.experts, c.topk = int("max_tokens", 1), int("hidden", 1), int("experts", 1), int("topk", 1)
  c.algorithm, c.output, c.fp8 = M.algorithms[algorithm], outputs[output], ep.dtypes[dtype]
  c.sms = o.blocks == nil and 0 or int("blocks", 1)
  local pp = ffi.new("dl_ep_nccl_t*[1]")
  check(C.dl_ep_nccl_new(pp, comm.ptr, c))
  local b = ep.wrap(ffi.gc(pp[0], C.dl_ep_nccl_free), api, { comm = comm, device = comm.device, backend = "nccl_ep",
    algorithm = algorithm, layout = algorithm == "low_latency" and "per_rank" or nil, output = output, dtype = dtype,
    max_tokens = c.max_tokens, hidden = c.hidden, experts = c.experts, topk = c.topk }, C.dl_ep_nccl_tensor,
    { offsets = C.DL_EP_OFFSETS })
  b.blocks = o.blocks
  return b
end

return M
