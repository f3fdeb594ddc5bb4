-- distlab.bench.table — the nccl-tests-style table a benchmark prints as it
-- runs: '#' lines first (what ran, where), a header whose columns line up
-- with the rows, then one row per case, flushed at once so a run cut short
-- keeps what it measured.
--
--   local t = btable.new({
--     { "size", "%12d", unit = "(B)" }, { "count", "%12d", unit = "(elements)" },
--     { "type", "%6s" }, { "op", "%-15s" }, { "time", "%10.2f", unit = "(us)" },
--     { "algbw", "%8.2f", unit = "(GB/s)" }, { "busbw", "%8.2f", unit = "(GB/s)" },
--     { "#wrong", "%6d" },
--   }, { out = io.stdout, quiet = rank ~= 0 })
--   t:header("distlab comm_bench: cpu x 2")     '#' lines, then the column names and units
--   t:row({ 8, 2, "f32", "all_reduce", 12.5, 0.0, 0.0, 0 })   or a map by column name
--   t:line(row) -> the text of a row, without printing it
-- A nil cell prints as "-". Widths come from the formats ("%-15s": 15, left).
local M = {}
local Table = {}
Table.__index = Table

function M.new(columns, opts)
  opts = require("distlab.args").options(opts, { "out", "quiet" }, "bench.table")
  local t = setmetatable({ cols = {}, out = opts.out or io.stdout, quiet = opts.quiet }, Table)
  for i, c in ipairs(columns) do
    local fmt = c[2] or c.fmt or "%s"
    local left, width = fmt:match("^%%(%-?)(%d*)")
    t.cols[i] = { name = c[1] or c.name, fmt = fmt, unit = c.unit, left = left == "-", width = tonumber(width) or 0 }
  end
  return t
end

local function pad(s, width, left)
  if left then return s .. string.rep(" ", width - #s) end
  return string.rep(" ", width - #s) .. s
end

-- The header: each column's name (and unit line when any column has one),
-- starting with '#' like nccl-tests' (the '#' takes the first column's first space).
function Table:head_lines()
  local names, units, any_unit = {}, {}, false
  for i, c in ipairs(self.cols) do
    local w = math.max(c.width, #c.name)
    c.width = w
    names[i] = pad(c.name, w, c.left)
    units[i] = pad(c.unit or "", w, c.left)
    any_unit = any_unit or c.unit ~= nil
  end
  local function hashed(cells)
    local s = table.concat(cells, " ")
    return "#" .. (s:sub(1, 1) == " " and s:sub(2) or s)
  end
  local out = { hashed(names) }
  if any_unit then out[2] = hashed(units) end
  return out
end

function Table:header(...)
  if self.quiet then return end
  for i = 1, select("#", ...) do self.out:write("# ", (select(i, ...)), "\n") end
  for _, l in ipairs(self:head_lines()) do self.out:write(l, "\n") end
  self.out:flush()
end

function Table:line(row)
  local cells = {}
  for i, c in ipairs(self.cols) do
    local v = row[i]
    if v == nil then v = row[c.name] end
    local s
    if v == nil then s = "-"
    elseif type(v) == "number" and c.fmt:match("d$") and (v ~= math.floor(v) or math.abs(v) == math.huge) then
      s = string.format("%.2f", v) -- not an integer (nan, inf, a fraction): %d would raise
    else s = string.format(c.fmt, v) end
    cells[i] = pad(s, c.width, c.left)
  end
  return table.concat(cells, " ")
end

function Table:row(row)
  if self.quiet then return end
  self.out:write(self:line(row), "\n")
  self.out:flush()
end

return M
