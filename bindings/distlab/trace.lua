-- distlab.trace — a timeline of what every rank ran, in one Chrome-trace JSON
-- that Perfetto (ui.perfetto.dev) and chrome://tracing open: a process per
-- rank (pid = rank), a track per stream (tid), a slice per span with its
-- arguments (shapes, bytes), and a PNG of the same where gnuplot exists.
--
--   dl.trace.start{comm = world, wrap = true, max_spans = 200000}
--       every rank of comm (default: the world when the job has several ranks)
--   dl.trace.span(name, fn [, args], ...) -> fn(...)'s results    a span around fn
--   dl.trace.mark(name [, args])                                   an instant
--   local t = dl.trace.begin(name [, args]) ... dl.trace.finish(t)  the hooks a
--       schedule calls around its steps: begin returns nil and finish(nil) does
--       nothing while no trace runs (one table read), so a schedule keeps them always
--   dl.trace.stop{path = "trace.json", png = "trace.png" | false} -> path | nil, spans, png | nil
--       collective over the ranks of start's comm: rank 0 writes the merged JSON
--       (and the PNG: by default the path with .png, where gnuplot exists) and
--       returns their paths; every rank gets its own spans ({name, rank, tid, ts,
--       dur, args, host = {issue start, end} on cuda}, us on the merged timeline)
--   dl.trace.draw(json [, png]) -> png | nil, why    the PNG of a trace stop() wrote (drawn
--       where gnuplot exists: a GPU host's trace, here)
--   dl.trace.active() -> bool
--
-- Times. A span on a cuda stream is two device events recorded on the
-- current stream around it, so its slice is when the device ran it; its host
-- issue time goes to the rank's "host" track. Each device's events are put
-- on the host clock by an anchor: at its first span the device is
-- synchronised, an event recorded and waited for, and the host times
-- before and after bound when it happened (the midpoint is taken; the JSON's
-- otherData gives the bound). On cpu and meta, spans are host times (ops run
-- synchronously there; otherData says so). Ranks on one host share
-- CLOCK_MONOTONIC, so their timelines line up as they ran; ranks on
-- several hosts are lined up at a barrier in start (otherData says which).
--
-- wrap (default true): while the trace runs, the calls of the op modules
-- report spans without their own code knowing: dl.gemm (and grouped),
-- dl.attn's steps and merges, the communicators' collectives and
-- point-to-point ops (a dl.comm.group is one span: its ops are issued at its
-- end), ep buffers' dispatch/combine phases, all-reduce runs,
-- overlap ops and their steps (gemm, move, wait, reduce), graph replays
-- (TARGETS below). stop puts the functions back. Work inside a graph
-- capture records nothing (nothing runs then); the replay is the span.
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local args = require "distlab.args"

local C, check, fail = core.C, core.check, core.fail
local M = {}

-- the clock every process of a host shares (dl_now_us counts from the library's load)
pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } dl_trace_timespec_t;
int clock_gettime(int clk, dl_trace_timespec_t *tp);
int gethostname(char *name, size_t len);
]])
local CLOCK_MONOTONIC = 1
local ts_buf = ffi.new("dl_trace_timespec_t")
local function monotonic_us()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts_buf)
  return tonumber(ts_buf.tv_sec) * 1e6 + tonumber(ts_buf.tv_nsec) * 1e-3
end
local function hostname()
  local buf = ffi.new("char[256]")
  if ffi.C.gethostname(buf, 255) ~= 0 then return "?" end
  return ffi.string(buf)
end

local S = nil -- the running trace; nil: off

-- ---- devices and events --------------------------------------------------------------

local event_pool = {} -- device -> free dl_event_t* (kept across traces)

local function new_event(dt, di)
  local pp = ffi.new("dl_event_t*[1]")
  check(C.dl_event_new(pp, dt, di))
  return ffi.gc(pp[0], C.dl_event_free)
end

local function take_event(dev, dt, di)
  local pool = event_pool[dev]
  if pool and #pool > 0 then
    local e = pool[#pool]
    pool[#pool] = nil
    return e
  end
  return new_event(dt, di)
end

-- the anchor of cuda device dev: its events' host times follow from it (see the header)
local function anchor_of(s, dev, dt, di)
  local a = s.anchors[dev]
  if a then return a end
  check(C.dl_device_synchronize(dt, di))
  local e = new_event(dt, di)
  local h0 = C.dl_now_us()
  check(C.dl_event_record(e, nil))
  check(C.dl_event_synchronize(e, 0))
  local h1 = C.dl_now_us()
  a = { event = e, host_us = (h0 + h1) / 2, bound_us = (h1 - h0) / 2 }
  s.anchors[dev] = a
  return a
end

-- the current stream: its key (0: the default stream), its device, whether cuda
local function current()
  local so = core.stream_obj
  if so then
    return tonumber(ffi.cast("uintptr_t", so.ptr)), so.device, so.dev_type, so.dev_index
  end
  return 0, S.device, S.dev_type, S.dev_index
end

-- ---- recording -------------------------------------------------------------------------

local function open(name, a)
  local s = S
  if s.capturing > 0 then
    s.in_capture = s.in_capture + 1
    return nil
  end
  if s.n >= s.max then
    s.dropped = s.dropped + 1
    return nil
  end
  local key, dev, dt, di = current()
  local depth = s.depth[key] or 0
  s.depth[key] = depth + 1
  local sp = { name = name, args = a, key = key, dev = dev, depth = depth, h0 = C.dl_now_us() }
  if dt == C.DL_CUDA then
    anchor_of(s, dev, dt, di)
    sp.e0 = take_event(dev, dt, di)
    sp.dt, sp.di = dt, di
    check(C.dl_event_record(sp.e0, core.stream))
  end
  s.n = s.n + 1
  s.spans[s.n] = sp
  if not s.streams[key] then -- tracks: 0 the default stream, then the others as they come
    if key ~= 0 then s.nstreams = s.nstreams + 1 end
    s.streams[key] = { order = key == 0 and 0 or s.nstreams, dev = dev }
  end
  return sp
end

local function close(sp)
  if not sp then return end
  S.depth[sp.key] = sp.depth
  if sp.e0 then
    sp.e1 = take_event(sp.dev, sp.dt, sp.di)
    check(C.dl_event_record(sp.e1, core.stream))
  end
  sp.h1 = C.dl_now_us()
end

function M.active() return S ~= nil end

function M.begin(name, a)
  if not S then return nil end
  return open(name, a)
end

function M.finish(t)
  if t then close(t) end
end

local function pack(...) return { n = select("#", ...), ... } end

function M.span(name, fn, a, ...)
  if type(fn) ~= "function" then fail("trace.span: expected (name, fn [, args], ...), got a %s for fn", type(fn)) end
  if not S then return fn(...) end
  local sp = open(tostring(name), a)
  local res = pack(pcall(fn, ...))
  close(sp)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

function M.mark(name, a)
  if not S then return end
  local sp = open(tostring(name), a)
  if sp then
    sp.instant = true
    close(sp)
  end
end

-- ---- wrapping the op modules ---------------------------------------------------------

-- What a call's arguments say: shapes of its tensors (one level into tables:
-- ep's recv) and their bytes.
local function describe(...)
  local shapes, bytes = {}, 0
  local function one(t)
    shapes[#shapes + 1] = string.format("%s[%s]", t.dtype, table.concat(t.shape, ", "))
    bytes = bytes + t:nbytes()
  end
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if tensor.is_tensor(v) then
      one(v)
    elseif type(v) == "table" and getmetatable(v) == nil then
      for _, x in pairs(v) do if tensor.is_tensor(x) then one(x) end end
    end
  end
  if #shapes == 0 then return nil end
  return { shapes = shapes, bytes = bytes }
end

-- Point-to-point ops inside dl.comm.group are issued at the group's end (NCCL
-- launches them there): the group is the span, not its sends and receives.
local IN_GROUP = { ["comm.send"] = true, ["comm.recv"] = true }

local function wrapper(name, f)
  local grouped, group = IN_GROUP[name], name == "comm.group"
  return function(...)
    if not S or S.capturing > 0 or (grouped and S.grouping > 0) then return f(...) end
    local sp = open(name, describe(...))
    if group then S.grouping = S.grouping + 1 end
    local res = pack(pcall(f, ...))
    if group and S then S.grouping = S.grouping - 1 end
    close(sp)
    if not res[1] then error(res[2], 0) end
    return unpack(res, 2, res.n)
  end
end

-- module, the table in it holding the functions (nil: the module), the functions, the span prefix
local TARGETS = {
  { "distlab.gemm", nil, { run = "gemm", grouped = "gemm.grouped", grouped_dx = "gemm.grouped_dx",
    grouped_dw = "gemm.grouped_dw" } },
  { "distlab.attn", nil, { "fwd", "bwd", "merge_lse", "merge_out", "correct_grad", "merge" }, "attn." },
  { "distlab.comm", "Comm", { "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_allv",
    "broadcast", "send", "recv", "barrier" }, "comm." },
  { "distlab.comm", nil, { "group" }, "comm." },
  { "distlab.ep", "Buffer", { "dispatch", "dispatch_send", "dispatch_recv", "combine", "combine_send",
    "combine_recv" }, "ep." },
  { "distlab.allreduce", "AR", { "run" }, "allreduce." },
  { "distlab.overlap", "Op", { "run", "gemm", "move", "wait", "reduce" }, "overlap." },
  { "distlab.graph", "Graph", { "replay" }, "graph." },
}
M.TARGETS = TARGETS

local function wrap_all(s)
  for _, tg in ipairs(TARGETS) do
    local ok, mod = pcall(require, tg[1])
    local tbl = ok and (tg[2] and mod[tg[2]] or mod)
    if type(tbl) == "table" then
      for k, v in pairs(tg[3]) do
        local fname, span = type(k) == "number" and v or k, type(k) == "number" and (tg[4] .. v) or v
        local f = rawget(tbl, fname)
        if type(f) == "function" then
          local w = wrapper(span, f)
          rawset(tbl, fname, w)
          s.wrapped[#s.wrapped + 1] = { tbl, fname, f, w }
        end
      end
    end
  end
  -- nothing runs inside a graph capture: no spans there (the replay is the span)
  local ok, graph = pcall(require, "distlab.graph")
  if ok and type(graph.capture) == "function" then
    local f = graph.capture
    local w = function(...)
      local t = S
      if t then t.capturing = t.capturing + 1 end
      local res = pack(pcall(f, ...))
      if t then t.capturing = t.capturing - 1 end
      if not res[1] then error(res[2], 0) end
      return unpack(res, 2, res.n)
    end
    graph.capture = w
    s.wrapped[#s.wrapped + 1] = { graph, "capture", f, w }
  end
end

local function unwrap_all(s)
  for i = #s.wrapped, 1, -1 do
    local tbl, fname, f, w = unpack(s.wrapped[i])
    if rawget(tbl, fname) == w then rawset(tbl, fname, f) end
  end
  s.wrapped = {}
end

-- ---- start -----------------------------------------------------------------------------

local START_KEYS = { comm = true, wrap = true, max_spans = true, device = true }
local seq = 0

function M.start(opts)
  opts = args.options(opts, START_KEYS, "trace.start")
  if S then fail("trace.start: a trace is running already (trace.stop first)") end
  local comm = opts.comm
  if comm == nil then
    local cm = require "distlab.comm"
    if cm.env().world_size > 1 then comm = cm.world() end
  end
  local device = opts.device or (comm and comm.device) or core.default_device()
  local dt, di = core.parse_device(device)
  seq = seq + 1
  local s = { spans = {}, n = 0, max = args.int(opts.max_spans or 200000, "trace.start: max_spans", 1),
    dropped = 0, in_capture = 0, capturing = 0, grouping = 0, streams = {}, nstreams = 0, depth = {}, anchors = {}, wrapped = {},
    comm = comm, rank = comm and comm.rank or 0, size = comm and comm.size or 1, device = core.device_name(dt, di),
    dev_type = dt, dev_index = di, seq = seq }
  -- lined up at a barrier (used where ranks are on several hosts), and the host's clock
  if comm and comm.size > 1 then comm:barrier() end
  s.sync_us = C.dl_now_us()
  s.mono_off = monotonic_us() - C.dl_now_us()
  S = s
  if opts.wrap ~= false then wrap_all(s) end
end

-- ---- JSON --------------------------------------------------------------------------------

local ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function jstr(v)
  return '"' .. tostring(v):gsub('[%c"\\]', function(c) return ESC[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

local function json(v)
  local ty = type(v)
  if ty == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "null" end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    return string.format("%.3f", v)
  elseif ty == "string" then
    return jstr(v)
  elseif ty == "boolean" then
    return tostring(v)
  elseif ty == "table" then
    if #v > 0 or next(v) == nil then
      local parts = {}
      for i = 1, #v do parts[i] = json(v[i]) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    local parts = {}
    for i, k in ipairs(keys) do
      local x = v[k]
      if x == nil then x = v[tonumber(k)] end
      parts[i] = jstr(k) .. ":" .. json(x)
    end
    return "{" .. table.concat(parts, ",") .. "}"
  elseif tensor.is_tensor(v) then
    return jstr(string.format("%s[%s]", v.dtype, table.concat(v.shape, ", ")))
  end
  return jstr(tostring(v))
end
M.json = json

-- ---- stop --------------------------------------------------------------------------------

local HOST_TID = 1000

-- This rank's spans as records on the host's shared clock (us), its tracks,
-- and what otherData says of it.
local function collect(s)
  for _, a in pairs(s.anchors) do check(C.dl_event_synchronize(a.event, 0)) end
  local ms = ffi.new("double[1]")
  local recs = {}
  for i = 1, s.n do
    local sp = s.spans[i]
    local t0, t1 = sp.h0, sp.h1 or sp.h0
    local host
    if sp.e0 and sp.e1 then
      local a = s.anchors[sp.dev]
      check(C.dl_event_elapsed_ms(a.event, sp.e0, ms))
      t0 = a.host_us + ms[0] * 1e3
      check(C.dl_event_elapsed_ms(a.event, sp.e1, ms))
      t1 = a.host_us + ms[0] * 1e3
      host = { sp.h0 + s.mono_off, sp.h1 + s.mono_off }
    end
    for _, e in ipairs { sp.e0 or false, sp.e1 or false } do
      if e then
        local pool = event_pool[sp.dev] or {}
        event_pool[sp.dev] = pool
        pool[#pool + 1] = e
      end
    end
    local st = s.streams[sp.key]
    recs[i] = { name = sp.name, args = sp.args, tid = st.order, ts = t0 + s.mono_off,
      dur = math.max(t1 - t0, 0), host = host, instant = sp.instant, depth = sp.depth }
  end
  local tracks = {}
  for key, st in pairs(s.streams) do
    tracks[#tracks + 1] = { tid = st.order,
      name = (key == 0 and "default stream" or ("stream " .. st.order)) .. " (" .. st.dev .. ")" }
  end
  table.sort(tracks, function(a, b) return a.tid < b.tid end)
  local cuda = next(s.anchors) ~= nil
  if cuda then tracks[#tracks + 1] = { tid = HOST_TID, name = "host (issue times)" } end
  local bounds = {}
  for dev, a in pairs(s.anchors) do bounds[dev] = a.bound_us end
  local info = { rank = s.rank, device = s.device, host = hostname(), spans = s.n, dropped = s.dropped,
    in_graph_capture = s.in_capture,
    times = cuda and "device events, put on the host clock by an anchor event per device (anchor_bound_us: "
      .. "how far off it may be)" or "host times (cpu and meta run their ops synchronously)",
    anchor_bound_us = cuda and bounds or nil }
  return recs, tracks, info
end

-- the rank's records as Chrome trace events, times shifted by `shift` (us)
local function chrome_events(rank, recs, tracks, shift)
  local ev = { json({ name = "process_name", ph = "M", pid = rank, tid = 0, args = { name = "rank " .. rank } }),
    json({ name = "process_sort_index", ph = "M", pid = rank, tid = 0, args = { sort_index = rank } }) }
  for _, t in ipairs(tracks) do
    ev[#ev + 1] = json({ name = "thread_name", ph = "M", pid = rank, tid = t.tid, args = { name = t.name } })
    ev[#ev + 1] = json({ name = "thread_sort_index", ph = "M", pid = rank, tid = t.tid, args = { sort_index = t.tid } })
  end
  for _, r in ipairs(recs) do
    local cat = r.name:match("^([^.]+)") or r.name
    if r.instant then
      ev[#ev + 1] = json({ name = r.name, cat = cat, ph = "i", s = "t", pid = rank, tid = r.tid, ts = r.ts + shift,
        args = r.args or {} })
    else
      ev[#ev + 1] = json({ name = r.name, cat = cat, ph = "X", pid = rank, tid = r.tid, ts = r.ts + shift,
        dur = r.dur, args = r.args or {} })
      if r.host then
        ev[#ev + 1] = json({ name = r.name, cat = cat, ph = "X", pid = rank, tid = HOST_TID, ts = r.host[1] + shift,
          dur = math.max(r.host[2] - r.host[1], 0), args = r.args or {} })
      end
    end
  end
  return table.concat(ev, ",\n")
end

-- the rank's spans for the PNG: "tid x0_ms x1_ms category" lines
local function plot_lines(recs, shift)
  local out = {}
  for _, r in ipairs(recs) do
    if not r.instant then
      out[#out + 1] = string.format("%d %.6f %.6f %d %s", r.tid, (r.ts + shift) * 1e-3, (r.ts + shift + r.dur) * 1e-3,
        r.depth or 0, ((r.name:match("^([^.]+)") or r.name):gsub("%s", "_")))
    end
  end
  return table.concat(out, "\n")
end

-- gnuplot: one lane per (rank, track), one colour per span category
local function draw(png, ranks)
  local plot = require "distlab.bench.plot"
  if not plot.available() then return false, "no gnuplot here: " .. png .. " was not drawn" end
  local lanes, labels, cats, order = {}, {}, {}, {}
  for _, rk in ipairs(ranks) do
    for _, t in ipairs(rk.tracks) do
      if t.tid ~= HOST_TID then
        local lane = #labels
        lanes[rk.rank .. ":" .. t.tid] = lane
        labels[#labels + 1] = string.format('"r%d %s" %d', rk.rank, t.name:gsub('"', ""), lane)
      end
    end
    for line in (rk.plot .. "\n"):gmatch("([^\n]+)\n") do
      local tid, x0, x1, depth, cat = line:match("^(%d+) (%S+) (%S+) (%d+) (%S+)$")
      local lane = lanes[rk.rank .. ":" .. tid]
      if lane then
        if not cats[cat] then
          cats[cat] = {}
          order[#order + 1] = cat
        end
        local c = cats[cat]
        c[#c + 1] = string.format("%s %s %d %.3f", x0, x1, lane, math.max(0.38 - 0.09 * tonumber(depth), 0.1))
      end
    end
  end
  if #order == 0 then return false, "no spans to draw" end
  local dat = png:gsub("%.png$", "") .. ".dat"
  local f = assert(io.open(dat, "w"))
  for i, cat in ipairs(order) do
    if i > 1 then f:write("\n\n") end
    f:write(table.concat(cats[cat], "\n"), "\n")
  end
  f:close()
  local plots = {}
  for i, cat in ipairs(order) do
    plots[i] = string.format("'%s' index %d using (($1+$2)/2):3:(($2-$1)/2):4 with boxxyerror fs solid 0.8 "
      .. "noborder lc %d title '%s'", dat, i - 1, i, cat)
  end
  local script = table.concat({
    string.format("set terminal pngcairo size 1600,%d font 'sans,9'", 160 + 28 * #labels),
    string.format("set output '%s'", png),
    "set xlabel 'ms'", "set yrange [" .. (#labels - 0.4) .. ":-0.6]",
    "set ytics (" .. table.concat(labels, ", ") .. ")",
    "set key outside right", "set grid xtics",
    "plot " .. table.concat(plots, ", \\\n  "),
  }, "\n")
  local ok, note = plot.gnuplot(script, png)
  os.remove(dat)
  return ok, note
end

-- draw(json, png) -> png | nil, note: the PNG of a trace JSON that stop() wrote (on a host without
-- gnuplot: a GPU host's trace drawn here), its lanes and colours as stop() draws them; a span's
-- depth (its bar's height) from its nesting in its lane
function M.draw(path, png)
  if type(path) ~= "string" then fail("trace.draw: the trace JSON's path must be a string") end
  local f, err = io.open(path, "r")
  if not f then fail("trace.draw: cannot read %s: %s", path, tostring(err)) end
  local doc = require("distlab.json").decode(f:read("*a"), path)
  f:close()
  if type(doc) ~= "table" or type(doc.traceEvents) ~= "table" then
    fail("trace.draw: %s is not a trace JSON (no traceEvents)", path)
  end
  local byrank, list = {}, {}
  local function rank_of(pid)
    if not byrank[pid] then
      byrank[pid] = { rank = pid, tracks = {}, spans = {} }
      list[#list + 1] = byrank[pid]
    end
    return byrank[pid]
  end
  for _, e in ipairs(doc.traceEvents) do
    local rk = rank_of(e.pid)
    if e.ph == "M" and e.name == "thread_name" then
      rk.tracks[#rk.tracks + 1] = { tid = e.tid, name = e.args.name }
    elseif e.ph == "X" and e.tid ~= HOST_TID then
      rk.spans[#rk.spans + 1] = e
    end
  end
  table.sort(list, function(a, b) return a.rank < b.rank end)
  for _, rk in ipairs(list) do
    table.sort(rk.tracks, function(a, b) return a.tid < b.tid end)
    table.sort(rk.spans, function(a, b) return a.ts < b.ts or (a.ts == b.ts and a.dur > b.dur) end)
    local open, recs = {}, {} -- per lane: the ends of the spans that hold the next one
    for _, e in ipairs(rk.spans) do
      local st = open[e.tid] or {}
      open[e.tid] = st
      while #st > 0 and st[#st] <= e.ts do st[#st] = nil end
      recs[#recs + 1] = { tid = e.tid, ts = e.ts, dur = e.dur, depth = #st, name = e.name }
      st[#st + 1] = e.ts + e.dur
    end
    rk.plot = plot_lines(recs, 0)
  end
  png = png or path:gsub("%.json$", "") .. ".png"
  local ok, note = draw(png, list)
  if not ok then return nil, note end
  return png
end

local STOP_KEYS = { path = true, png = true }

function M.stop(opts)
  opts = args.options(opts, STOP_KEYS, "trace.stop")
  local s = S
  if not s then fail("trace.stop: no trace is running (trace.start first)") end
  if opts.path ~= nil and type(opts.path) ~= "string" then fail("trace.stop: path must be a string") end
  unwrap_all(s)
  S = nil
  local recs, tracks, info = collect(s)
  local first = math.huge
  for _, r in ipairs(recs) do first = math.min(first, r.ts, r.host and r.host[1] or math.huge) end
  if first == math.huge then first = s.sync_us + s.mono_off end
  -- the shift of this rank's times: one host shares CLOCK_MONOTONIC, else line up the start barriers
  local comm, multi = s.comm, s.comm and s.size > 1 and s.comm.store
  -- whole microseconds, rounded down: no span of any rank starts before the merged zero
  local mine = string.format("%s\t%.0f\t%.0f", info.host, math.floor(s.sync_us + s.mono_off), math.floor(first))
  local metas = { mine }
  local key = comm and string.format("distlab/trace/%s/%d/", comm.name, s.seq)
  if multi then
    comm.store:set(key .. "meta/" .. s.rank, mine)
    for r = 0, s.size - 1 do metas[r + 1] = comm.store:get(key .. "meta/" .. r) end
  end
  local one_host, zero, lead = true, math.huge, 0
  local h0 = metas[1]:match("^([^\t]*)")
  for _, m in ipairs(metas) do
    local h, sync, f = m:match("^([^\t]*)\t(%S+)\t(%S+)$")
    one_host = one_host and h == h0
    zero = math.min(zero, tonumber(f))
    lead = math.max(lead, tonumber(sync) - tonumber(f))
  end
  local shift = one_host and -zero or (lead + 1 - (s.sync_us + s.mono_off)) -- + 1: the rounding above
  for _, r in ipairs(recs) do
    r.ts = r.ts + shift
    if r.host then r.host = { r.host[1] + shift, r.host[2] + shift } end
    r.rank = s.rank
  end
  local events, lines = chrome_events(s.rank, recs, tracks, 0), plot_lines(recs, 0)
  info.clock = one_host and "CLOCK_MONOTONIC of one host: ranks line up as they ran"
    or "ranks on several hosts: lined up at the barrier in trace.start"
  local ranks = { { rank = s.rank, events = events, info = json(info), tracks = tracks, plot = lines } }
  if multi then
    comm.store:set(key .. "events/" .. s.rank, events)
    comm.store:set(key .. "info/" .. s.rank, ranks[1].info)
    comm.store:set(key .. "plot/" .. s.rank, lines)
    local trk = {}
    for i, t in ipairs(tracks) do trk[i] = t.tid .. "\t" .. t.name end
    comm.store:set(key .. "tracks/" .. s.rank, table.concat(trk, "\n"))
    if s.rank == 0 then
      for r = 1, s.size - 1 do
        local trk = {}
        for line in (comm.store:get(key .. "tracks/" .. r) or ""):gmatch("[^\n]+") do
          local tid, name = line:match("^(%d+)\t(.*)$")
          trk[#trk + 1] = { tid = tonumber(tid), name = name }
        end
        ranks[r + 1] = { rank = r, events = comm.store:get(key .. "events/" .. r),
          info = comm.store:get(key .. "info/" .. r), plot = comm.store:get(key .. "plot/" .. r), tracks = trk }
      end
    end
  end
  local path, png
  if s.rank == 0 then
    path = opts.path or "trace.json"
    local bodies, infos = {}, {}
    for i, rk in ipairs(ranks) do
      bodies[i] = rk.events
      infos[i] = rk.info
    end
    local f, err = io.open(path, "w")
    if not f then fail("trace.stop: cannot write %s: %s", path, tostring(err)) end
    f:write('{"displayTimeUnit":"ms",\n"otherData":{"writer":"distlab.trace","build":', jstr(ffi.string(C.dl_build_info())),
      ',"ranks":[', table.concat(infos, ",\n"), ']},\n"traceEvents":[\n', table.concat(bodies, ",\n"), "\n]}\n")
    f:close()
    if opts.png ~= false then
      png = type(opts.png) == "string" and opts.png or path:gsub("%.json$", "") .. ".png"
      local ok, note = draw(png, ranks)
      if not ok then
        io.stderr:write("trace.stop: " .. tostring(note) .. "\n")
        png = nil
      end
    end
  end
  if multi then
    comm:barrier()
    if s.rank == 0 then
      for r = 0, s.size - 1 do
        for _, part in ipairs { "meta/", "events/", "info/", "plot/", "tracks/" } do comm.store:delete(key .. part .. r) end
      end
    end
  end
  return path, recs, png
end

return M
