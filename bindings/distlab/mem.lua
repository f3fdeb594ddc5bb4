-- distlab.mem — what the allocators hold, per device and per tag.
--
-- dl.mem.tag(name, fn) charges every allocation made while fn runs to `name`
-- (the innermost tag wins). dl.mem.report{unit = bytes, unit_name =} turns the
-- stats into a table per tag (now, peak, at the device's peak) and, given a
-- unit (one unit = e.g. one per-rank Q tensor), in units, so a peak can be
-- decomposed by tag. Printed, each size carries its own unit (B, KiB, MiB,
-- GiB: a 4 KiB buffer reads 4.00 KiB, not 0.00 MiB) and units keep three
-- significant digits below 0.01; the fields (peak, peak_mib, rows[i].peak,
-- .peak_mib, .peak_units, ...) stay numbers. dl.mem.format_bytes(n) is the
-- printed form.
local ffi = require "ffi"
local core = require "distlab.core"
local args = require "distlab.args"

local C, check, fail = core.C, core.check, core.fail
local M = {}

local MiB = 1048576

function M.stats(device)
  local dt, di = core.parse_device(device)
  local s = ffi.new("dl_mem_stats_t")
  check(C.dl_mem_stats(dt, di, s))
  local out = { device = core.device_name(dt, di), tags = {} }
  for _, k in ipairs({ "allocated", "allocated_peak", "reserved", "reserved_peak", "n_allocs",
    "n_frees", "n_cache_hits", "n_device_allocs", "driver_free", "driver_total", "untracked" }) do
    out[k] = tonumber(s[k])
  end
  local cur, peak, atp = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  for tag = 0, C.dl_mem_tag_count() - 1 do
    check(C.dl_mem_tag_stats(dt, di, tag, cur, peak, atp))
    if peak[0] > 0 or cur[0] > 0 then
      out.tags[ffi.string(C.dl_mem_tag_name(tag))] = { current = tonumber(cur[0]),
        peak = tonumber(peak[0]), at_peak = tonumber(atp[0]) }
    end
  end
  return out
end

function M.reset_peak(device)
  local dt, di = core.parse_device(device)
  check(C.dl_mem_reset_peak(dt, di))
end

function M.empty_cache(device)
  local dt, di = core.parse_device(device)
  check(C.dl_mem_empty_cache(dt, di))
end

-- Runs fn(...) with `name` on top of the tag stack; the tag is popped even
-- when fn fails.
function M.tag(name, fn, ...)
  if type(name) ~= "string" or name == "" then fail("mem.tag: name must be a non-empty string") end
  if type(fn) ~= "function" then fail("mem.tag: second argument must be a function") end
  check(C.dl_mem_tag_push(name))
  local res = { pcall(fn, ...) }
  check(C.dl_mem_tag_pop())
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

local Report = {}
Report.__index = Report

-- dl.mem.report{device =, unit = bytes, unit_name = "units", title =}
function M.report(opts)
  -- report("meta") is report{device = "meta"}
  if type(opts) == "string" then opts = { device = opts } end
  opts = args.options(opts, { "device", "unit", "unit_name", "title" }, "mem.report")
  local st = M.stats(opts.device)
  local rows = {}
  for name, t in pairs(st.tags) do
    rows[#rows + 1] = { tag = name, current = t.current, peak = t.peak, at_peak = t.at_peak }
  end
  table.sort(rows, function(a, b) return a.at_peak > b.at_peak or (a.at_peak == b.at_peak and a.tag < b.tag) end)
  local unit = opts.unit
  if unit ~= nil and (type(unit) ~= "number" or unit <= 0) then fail("mem.report: unit must be a positive number of bytes") end
  for _, r in ipairs(rows) do
    r.current_mib, r.peak_mib, r.at_peak_mib = r.current / MiB, r.peak / MiB, r.at_peak / MiB
    if unit then r.current_units, r.peak_units, r.at_peak_units = r.current / unit, r.peak / unit, r.at_peak / unit end
  end
  return setmetatable({ rows = rows, stats = st, unit = unit, unit_name = opts.unit_name or "units",
    title = opts.title, peak = st.allocated_peak, peak_mib = st.allocated_peak / MiB,
    peak_units = unit and st.allocated_peak / unit or nil }, Report)
end

-- Bytes as a person reads them: "0 B", "512 B", "4.00 KiB", "12.35 MiB", "1.20 GiB".
local function fmt_bytes(n)
  local a = math.abs(n)
  if a < 1024 then return string.format("%d B", n) end
  if a < MiB then return string.format("%.2f KiB", n / 1024) end
  if a < 1024 * MiB then return string.format("%.2f MiB", n / MiB) end
  return string.format("%.2f GiB", n / (1024 * MiB))
end
M.format_bytes = fmt_bytes

-- Units with two decimals, and three significant digits below 0.01 (a small buffer is not 0.00).
local function fmt_units(v)
  if v == 0 or math.abs(v) >= 0.01 then return string.format("%.2f", v) end
  return string.format("%.3g", v)
end

function Report:__tostring()
  local u = self.unit
  local lines = {}
  if self.title then lines[#lines + 1] = self.title end
  lines[#lines + 1] = string.format("memory on %s (peak allocated %s%s)", self.stats.device, fmt_bytes(self.peak),
    u and string.format(" = %s %s", fmt_units(self.peak_units), self.unit_name) or "")
  local hdr = string.format("%-20s %12s %12s %12s", "tag", "now", "peak", "@peak")
  local uw = u and math.max(10, #("@peak " .. self.unit_name))
  if u then hdr = hdr .. string.format(" %" .. uw .. "s %" .. uw .. "s", "peak " .. self.unit_name, "@peak " .. self.unit_name) end
  lines[#lines + 1] = hdr
  for _, r in ipairs(self.rows) do
    local l = string.format("%-20s %12s %12s %12s", r.tag, fmt_bytes(r.current), fmt_bytes(r.peak), fmt_bytes(r.at_peak))
    if u then l = l .. string.format(" %" .. uw .. "s %" .. uw .. "s", fmt_units(r.peak_units), fmt_units(r.at_peak_units)) end
    lines[#lines + 1] = l
  end
  local st = self.stats
  if st.driver_total and st.driver_total > 0 then
    lines[#lines + 1] = string.format("reserved %s (peak %s), untracked by distlab %s (CUDA context, NCCL, cuBLAS...), device free %s of %s",
      fmt_bytes(st.reserved), fmt_bytes(st.reserved_peak), fmt_bytes(st.untracked), fmt_bytes(st.driver_free),
      fmt_bytes(st.driver_total))
  end
  return table.concat(lines, "\n")
end

-- Keep the last `capacity` allocation events (0 turns the trace off).
function M.trace_enable(capacity)
  check(C.dl_mem_trace_enable(capacity or 65536))
end

-- The recorded events, oldest first: {t_us, device, tag, bytes, allocated}.
function M.trace(max)
  max = max or 1048576
  local buf = ffi.new("dl_mem_event_t[?]", math.min(max, 1048576))
  local n = ffi.new("int64_t[1]")
  check(C.dl_mem_trace_read(buf, math.min(max, 1048576), n))
  local out = {}
  for i = 0, tonumber(n[0]) - 1 do
    local e = buf[i]
    out[#out + 1] = { t_us = e.t_us, device = core.device_name(e.dev_type, e.dev_index),
      tag = ffi.string(C.dl_mem_tag_name(e.tag)), bytes = tonumber(e.bytes), allocated = tonumber(e.allocated) }
  end
  return out
end

return M
