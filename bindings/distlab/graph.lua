-- distlab.graph — capture work once, replay it many times.
--
--   local g = dl.graph.capture(function() ... end)   ops issued inside are recorded
--   g:replay()          on the current stream (any stream of the device)
--   g:nodes()           how many nodes were captured (cuda)
--   g:free()
--   dl.graph.bench(fn, {ops = 10, warmup = 5, replays = 50}) -> stats per op
--
-- cuda: a CUDA graph. fn runs once, on a capture stream of its own that is
-- the current stream meanwhile; nothing executes during capture, every
-- kernel is recorded with its arguments, and a replay runs them again. So
-- fn must only issue work on the current stream (no host reads of results,
-- no synchronisation), and the tensors it uses must outlive the graph: the
-- graph keeps fn and what fn returns. distlab's all-reduce kernels keep their
-- counters on the device, so replays stay correct; NCCL is capturable too.
-- A graph that captured NCCL work is released when that communicator is
-- freed (NCCL cannot destroy a communicator a live graph holds); it then
-- refuses to replay, saying why.
-- cpu and meta: there are no graphs; capture only keeps fn (nothing runs,
-- as on cuda) and replay calls it, on the current stream. Same results,
-- host timing.
local ffi = require "ffi"
local core = require "distlab.core"
local stream = require "distlab.stream"

local C, check, fail = core.C, core.check, core.fail

local M = {}
local Graph = {}
Graph.__index = Graph
Graph.__tostring = function(g)
  return string.format("graph(%s, %s)", g.device, g.ptr ~= nil and (g:nodes() .. " nodes") or "recorded Lua")
end

local function is_cuda(device) return device:match("^cuda") ~= nil end

-- dl.graph.capture(fn, {device = d}) -> graph
function M.capture(fn, opts)
  if type(fn) ~= "function" then fail("graph.capture: expected a function") end
  opts = require("distlab.args").options(opts, { "device" }, "graph.capture")
  local cur = stream.current_stream()
  local device = opts.device or (cur and cur.device) or core.default_device()
  if not is_cuda(device) then return setmetatable({ fn = fn, device = device }, Graph) end
  local s = stream.stream(device)
  local pp = ffi.new("dl_graph_t*[1]")
  check(C.dl_graph_begin(pp, s.ptr))
  local g = ffi.gc(pp[0], C.dl_graph_free)
  local res = { pcall(stream.with_stream, s, fn) }
  local rc = C.dl_graph_end(g)
  if not res[1] then
    C.dl_graph_free(ffi.gc(g, nil))
    error(res[2], 0)
  end
  if rc < 0 then
    C.dl_graph_free(ffi.gc(g, nil))
    check(rc)
  end
  table.remove(res, 1)
  return setmetatable({ ptr = g, fn = fn, keep = res, stream = s, device = device }, Graph)
end

function Graph:replay(s)
  if self.ptr == nil and not self.fn then fail("replay of a freed graph") end
  if self.ptr == nil then
    self.fn()
    return self
  end
  check(C.dl_graph_replay(self.ptr, s and s.ptr or core.stream))
  return self
end

function Graph:nodes()
  if self.ptr == nil then return 0 end
  local n = ffi.new("int64_t[1]")
  check(C.dl_graph_nodes(self.ptr, n))
  return tonumber(n[0])
end

function Graph:free()
  if self.ptr ~= nil then C.dl_graph_free(ffi.gc(self.ptr, nil)) end
  self.ptr, self.fn, self.keep = nil, nil, nil
end

-- Time fn the way vLLM's benchmark times its all-reduces: a graph of `ops`
-- back-to-back calls of fn, `warmup` replays, then `replays` replays each
-- between two events; ms per call. The method lives in the benchmark
-- harness (distlab.bench.timing.graph), which documents it.
function M.bench(fn, opts) return require("distlab.bench.timing").graph(fn, opts) end

M.Graph = Graph
return M
