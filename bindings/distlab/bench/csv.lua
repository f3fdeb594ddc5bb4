-- distlab.bench.csv — CSV as RFC 4180 has it, so that Python's csv module,
-- pandas, gnuplot and spreadsheets read what the benchmarks write, and the
-- benchmarks read what Python writes.
--
--   field(v) -> text      nil -> empty; a field holding a comma, a double
--                         quote, CR or LF (or leading/trailing blanks) is
--                         quoted, its quotes doubled: (32, 8192) -> "(32, 8192)"
--   line(cells[, n]) -> text   the first n fields (default: up to the last non-nil)
--                         joined by commas, ending in "\n"
--   writer(path, header) -> w   w:row(cells or a map by header name), w:close();
--                         every row is flushed (a run cut short keeps its rows)
--   write(path, header, rows)
--   parse(text) -> rows   lists of strings; quoted fields may hold commas,
--                         doubled quotes and line breaks; CRLF or LF
--   read(path) -> header, records   records are maps by header name, values
--                         strings; nil, err when the file cannot be read
--   number(s) -> the number in a cell, or nil (empty, "nan", text)
-- Numbers are written as given: format them first (string.format("%.3f", x))
-- to choose their precision; a bare number is written with %.17g, or %d
-- when it is an integer.
local core = require "distlab.core"

local fail = core.fail
local M = {}

function M.field(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    return string.format("%.17g", v)
  end
  local s = tostring(v)
  if s:find('[,"\r\n]') or s:match("^%s") or s:match("%s$") then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

function M.line(cells, n)
  local out = {}
  for i = 1, n or table.maxn(cells) do out[i] = M.field(cells[i]) end
  return table.concat(out, ",") .. "\n"
end

local Writer = {}
Writer.__index = Writer

function M.writer(path, header)
  local f, err = io.open(path, "w")
  if not f then fail("csv: cannot write %s: %s", path, tostring(err)) end
  local w = setmetatable({ f = f, header = header, path = path }, Writer)
  f:write(M.line(header))
  f:flush()
  return w
end

function Writer:row(r)
  local cells = r
  if r[1] == nil and next(r) ~= nil then -- a map by column name
    cells = {}
    for i, name in ipairs(self.header) do cells[i] = r[name] end
  end
  self.f:write(M.line(cells, #self.header))
  self.f:flush()
end

function Writer:close()
  if self.f then self.f:close() end
  self.f = nil
end

function M.write(path, header, rows)
  local w = M.writer(path, header)
  for _, r in ipairs(rows) do w:row(r) end
  w:close()
  return path
end

-- RFC 4180, section 2: records end in CRLF (LF accepted), fields are
-- separated by commas, a field in double quotes may hold anything, a
-- double quote inside it doubled. A text that ends without a line break
-- ends its last record all the same.
function M.parse(text)
  local rows, row, i, n = {}, {}, 1, #text
  if n == 0 then return rows end
  while true do
    local c = text:sub(i, i)
    local value
    if c == '"' then
      local parts = {}
      local j = i + 1
      while true do
        local q = text:find('"', j, true)
        if not q then fail("csv: a quoted field opened at byte %d is never closed", i) end
        parts[#parts + 1] = text:sub(j, q - 1)
        if text:sub(q + 1, q + 1) == '"' then
          parts[#parts + 1] = '"'
          j = q + 2
        else
          i = q + 1
          break
        end
      end
      value = table.concat(parts)
      local nx = text:sub(i, i)
      if nx ~= "," and nx ~= "\n" and nx ~= "\r" and nx ~= "" then
        fail("csv: text after the closing quote of a field, at byte %d", i)
      end
    else
      local j = text:find("[,\r\n]", i) or n + 1
      value = text:sub(i, j - 1)
      if value:find('"', 1, true) then fail("csv: a double quote inside an unquoted field, at byte %d", i) end
      i = j
    end
    row[#row + 1] = value
    local sep = text:sub(i, i)
    if sep == "," then
      i = i + 1
    else
      rows[#rows + 1] = row
      row = {}
      if sep == "\r" and text:sub(i + 1, i + 1) == "\n" then i = i + 2 else i = i + 1 end
      if i > n then break end
    end
  end
  return rows
end

function M.read(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local text = f:read("*a")
  f:close()
  local rows = M.parse(text)
  local header = table.remove(rows, 1)
  if not header then return nil, path .. " is empty" end
  local records = {}
  for k, r in ipairs(rows) do
    if #r ~= #header and not (#r == 1 and r[1] == "") then
      fail("csv: %s, record %d has %d fields, its header %d", path, k, #r, #header)
    end
    local rec = {}
    for c, name in ipairs(header) do rec[name] = r[c] end
    if not (#r == 1 and r[1] == "") then records[#records + 1] = rec end
  end
  return header, records
end

function M.number(s)
  local v = tonumber(s)
  if v and v == v then return v end
  return nil
end

return M
