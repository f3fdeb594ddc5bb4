-- distlab.stream — streams and events. Every op runs on the current stream
-- (dl.current_stream(), nil = the device's default stream); dl.with_stream
-- changes it for the duration of a function. On cpu and meta the same API
-- works: ops run synchronously and events record host time.
local ffi = require "ffi"
local core = require "distlab.core"

local C, check, fail = core.C, core.check, core.fail
local M = {}

local Stream = {}
Stream.__index = Stream
Stream.__tostring = function(s) return "stream(" .. s.device .. ")" end

-- dl.stream([device], {priority = p}): a new stream (non-blocking with
-- respect to the default stream). Lower priority numbers run first.
function M.stream(device, opts)
  if type(device) == "table" then device, opts = nil, device end
  opts = require("distlab.args").options(opts, { "priority" }, "stream")
  local dt, di = core.parse_device(device)
  local pp = ffi.new("dl_stream_t*[1]")
  check(C.dl_stream_new(pp, dt, di, opts.priority or 0))
  return setmetatable({ ptr = ffi.gc(pp[0], C.dl_stream_free), device = core.device_name(dt, di),
    dev_type = dt, dev_index = di }, Stream)
end

function Stream:synchronize() check(C.dl_stream_synchronize(self.ptr, self.dev_type, self.dev_index)) end
function Stream:wait(event) check(C.dl_stream_wait_event(self.ptr, event.ptr)) return self end
function Stream:handle() return C.dl_stream_handle(self.ptr) end

function M.current_stream() return core.stream_obj end

-- Runs fn(...) with s as the current stream (nil: the default stream).
function M.with_stream(s, fn, ...)
  if s ~= nil and getmetatable(s) ~= Stream then fail("with_stream: expected a stream or nil") end
  local prev_obj, prev = core.stream_obj, core.stream
  core.stream_obj, core.stream = s, s and s.ptr or nil
  local res = { pcall(fn, ...) }
  core.stream_obj, core.stream = prev_obj, prev
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

local Event = {}
Event.__index = Event
Event.__tostring = function(e) return "event(" .. e.device .. ")" end

function M.event(device)
  local dt, di = core.parse_device(device)
  local pp = ffi.new("dl_event_t*[1]")
  check(C.dl_event_new(pp, dt, di))
  return setmetatable({ ptr = ffi.gc(pp[0], C.dl_event_free), device = core.device_name(dt, di) }, Event)
end

-- Records on s (default: the current stream).
function Event:record(s)
  check(C.dl_event_record(self.ptr, s and s.ptr or core.stream))
  return self
end
function Event:synchronize(timeout_s) check(C.dl_event_synchronize(self.ptr, timeout_s or 0)) return self end
function Event:query()
  local d = ffi.new("int[1]")
  check(C.dl_event_query(self.ptr, d))
  return d[0] == 1
end
-- Milliseconds from self to later (both recorded).
function Event:elapsed(later)
  local ms = ffi.new("double[1]")
  check(C.dl_event_elapsed_ms(self.ptr, later.ptr, ms))
  return ms[0]
end

-- Waits for all work on a device (default: the default device).
function M.synchronize(device)
  local dt, di = core.parse_device(device)
  check(C.dl_device_synchronize(dt, di))
end

return M
