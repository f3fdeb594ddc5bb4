-- distlab.pretty — readable text for any Lua value: tensors through their
-- __tostring, tables as nested { key = value } with sorted keys and a depth
-- limit, numbers with up to 6 significant digits.
local M = {}

local function key_str(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return k end
  return "[" .. M.format(k, 0, 0) .. "]"
end

function M.format(v, depth, indent)
  depth, indent = depth or 3, indent or 0
  local tv = type(v)
  if tv == "string" then return string.format("%q", v) end
  if tv == "number" then
    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
    return string.format("%.6g", v)
  end
  if tv ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if depth <= 0 then return "{...}" end
  local n = #v
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    if type(a) == type(b) and (type(a) == "string" or type(a) == "number") then return a < b end
    return type(a) < type(b)
  end)
  local parts = {}
  for i = 1, n do parts[#parts + 1] = M.format(v[i], depth - 1, indent + 2) end
  for _, k in ipairs(keys) do parts[#parts + 1] = key_str(k) .. " = " .. M.format(v[k], depth - 1, indent + 2) end
  local one = "{ " .. table.concat(parts, ", ") .. " }"
  if #parts == 0 then return "{}" end
  if #one <= 100 and not one:find("\n") then return one end
  local pad = string.rep(" ", indent + 2)
  return "{\n" .. pad .. table.concat(parts, ",\n" .. pad) .. "\n" .. string.rep(" ", indent) .. "}"
end

function M.print(...)
  local out = {}
  for i = 1, select("#", ...) do out[i] = M.format((select(i, ...))) end
  print(table.concat(out, "\t"))
end

return M
