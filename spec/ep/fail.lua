-- spec/ep/fail.lua <mode> — errors, each printed as "ERR: <message>" (and
-- "AFTER: <message>" for what follows) for spec/ep_spec.lua to read.
--   timeout   2 ranks: rank 1 skips a dispatch; rank 0's dispatch ends
--             within the timeout (on cuda the kernel ends by itself and
--             ep:check() reports it) naming the phase, rank 0 and peer 1;
--             the buffer then refuses work
--   badid     1 rank: an expert id >= E drops that selection and is reported
--   repeat    1 rank: an expert a token picked already, the same
--             once (the token, k and the id) by dispatch_send (cpu),
--             dispatch_recv or check() (cuda); the next dispatch works
--   args      1 rank: bad options and inputs, calls out of order, a stale
--             handle: one ERR line each, naming what was wrong
--   disagree  2 ranks given different buffers: an error on every rank
--   knob      1 rank, a bad DISTLAB_EP_PDL or DISTLAB_EP_LAMPORT_MAX_ROWS in
--             the environment: the buffer's making fails naming the variable
--   lamport   2 ranks whose DISTLAB_EP_LAMPORT_MAX_ROWS put a per_rank,
--             rank_major buffer in Lamport slots (its dispatch's and
--             combine's) on one rank and not on the other: an error on every rank
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local X = dofile(dir .. "/common.lua")
local dl = require "distlab"

local mode = arg[1]
local o = { B = 4, H = 128, E = 2 * X.N, K = 2, layout = "per_rank", output = "expert_major", dtype = "bf16" }

local function say(tag, ok, err)
  io.stdout:write(tag .. ": " .. (ok and "(no error)" or tostring(err)) .. "\n")
  io.stdout:flush()
end

local function pair(ep, call, route)
  local inp = X.inputs(o, call, X.me, route or "random", 4)
  local recv, h = ep:dispatch(X.tensors(inp, o))
  ep:combine(X.expert_outputs(o, recv), h)
  ep:check()
end

if mode == "timeout" then
  local ep = X.buffer(o)
  pair(ep, 1)
  X.w:barrier()
  local store = dl.comm.store()
  if X.me == 1 then
    store:set_timeout(X.timeout * 4 + 10)
    store:wait("ep-fail-done")
    os.exit(0)
  end
  local ok, err = pcall(function() pair(ep, 2) end)
  say("ERR", ok, err)
  local ok2, err2 = pcall(function() pair(ep, 3) end)
  say("AFTER", ok2, err2)
  store:set("ep-fail-done", "")
  os.exit((not ok and not ok2) and 0 or 1)
elseif mode == "badid" or mode == "repeat" then
  local ep = X.buffer(o)
  local inp = X.inputs(o, 1, 0, "random", 4)
  if mode == "badid" then
    inp.idx[3][2] = o.E + 5
  else -- token 2 picks its first expert again
    inp.idx[3][1] = 1
    inp.idx[3][2] = 1
  end
  -- the id is reported once, by the call that sees the record: dispatch_send
  -- on cpu (the twin words it at the end of the call); on cuda the next
  -- call whose host side reads the record (dispatch_recv) or check(). Each
  -- of those runs its phase first, so the protocol goes on either way.
  local errs = {}
  local function try(fn)
    local ok, e = pcall(fn)
    if not ok then errs[#errs + 1] = e end
  end
  try(function() ep:dispatch_send(X.tensors(inp, o)) end)
  try(function() ep:dispatch_recv({ ep = ep, call = ep.calls }) end)
  try(function() ep:check() end)
  say("ERR", #errs == 0, table.concat(errs, " | "))
  local ok2, err2 = pcall(function() pair(ep, 2) end)
  say("AFTER", ok2, err2)
  os.exit((#errs == 1 and ok2) and 0 or 1)
elseif mode == "knob" then
  local ok, err = pcall(X.buffer, { B = 4, H = 128, E = 2 * X.N, K = 2 })
  say("ERR", ok, err)
  os.exit(ok and 1 or 0)
elseif mode == "lamport" then
  local ffi = require "ffi"
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  ffi.C.setenv("DISTLAB_EP_LAMPORT_MAX_ROWS", X.me == 0 and "0" or "1024", 1)
  local ok, err = pcall(X.buffer, { B = 4, H = 128, E = 2 * X.N, K = 2, layout = "per_rank", output = "rank_major" })
  say("ERR", ok, err)
  X.w:barrier()
  os.exit(ok and 1 or 0)
elseif mode == "disagree" then
  local ok, err = pcall(X.buffer, { B = 4, H = 128 + 128 * X.me, E = 2 * X.N, K = 2 })
  say("ERR", ok, err)
  X.w:barrier()
  os.exit(ok and 1 or 0)
end

-- args: one ERR line per bad call
local function try(name, fn, ...)
  local ok, err = pcall(fn, ...)
  say("ERR " .. name, ok, err)
end
local ep = X.buffer(o)
local x, idx, w = X.tensors(X.inputs(o, 1, 0, "random", 4), o)
local dev = X.w.device
try("T>B", function() ep:dispatch(dl.zeros({ 5, 128 }, { dtype = "bf16", device = dev }), dl.zeros({ 5, 2 }, { dtype = "i32", device = dev }), dl.zeros({ 5, 2 }, { device = dev })) end)
try("x dtype", function() ep:dispatch(x:f32(), idx, w) end)
try("x shape", function() ep:dispatch(dl.zeros({ 4, 64 }, { dtype = "bf16", device = dev }), idx, w) end)
try("idx dtype", function() ep:dispatch(x, idx:to("i64"), w) end)
try("weights shape", function() ep:dispatch(x, idx, dl.zeros({ 4, 3 }, { device = dev })) end)
try("fp8 hidden", function() dl.ep.buffer { comm = X.w, max_tokens = 4, hidden = 200, experts = 2, topk = 1, dtype = "fp8" } end)
try("experts", function() dl.ep.buffer { comm = dl.comm.meta(3, 0), max_tokens = 4, hidden = 128, experts = 4, topk = 1 } end)
try("topk", function() dl.ep.buffer { comm = X.w, max_tokens = 4, hidden = 128, experts = 64, topk = 25 } end)
try("layout", function() dl.ep.buffer { comm = X.w, max_tokens = 4, hidden = 128, experts = 2, topk = 1, layout = "per_token" } end)
try("option", function() dl.ep.buffer { comm = X.w, max_tokens = 4, hidden = 128, experts = 2, topk = 1, max_token = 4 } end)
try("combine first", function() ep:combine_send(ep.tensors.x, { ep = ep, call = ep.calls }) end)
try("recv first", function() ep:dispatch_recv({ ep = ep, call = ep.calls }) end)
local recv, h = ep:dispatch(x, idx, w)
try("y shape", function() ep:combine(dl.zeros({ 4, 128 }, { dtype = "bf16", device = dev }), h) end)
try("send twice", function() ep:dispatch_send(x, idx, w); ep:dispatch_send(x, idx, w) end)
ep:dispatch_recv({ ep = ep, call = ep.calls })
local _, h2 = ep:dispatch(x, idx, w)
try("stale handle", function() ep:combine(X.expert_outputs(o, recv), h) end)
ep:combine(X.expert_outputs(o, recv), h2)
ep:check()
print("args done")
