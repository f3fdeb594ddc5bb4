-- distlab.repl.help — what `?x` (or `:help x`) shows about a value.
--
--   help.describe(value, expr) -> text
--
-- A distlab module: its documentation, the comment at the top of its file,
-- and its names. A function: its parameters, where it is defined, the
-- comment above the definition and the lines of its module's header that
-- name it (with their continuation lines). A C function of the ABI
-- (dl.C.dl_...): its declaration and comment in core/include/distlab.h. A
-- tensor: shape, dtype, device, strides, offset, contiguity and storage. An
-- object (a communicator, a CP attention, an all-reduce, a symmetric
-- buffer): its configuration (the fields it holds, and info() where it has
-- one), its methods and its module's header. Anything else: pretty-printed.
local ffi = require "ffi"
local core = require "distlab.core"
local pretty = require "distlab.pretty"
local tensor = require "distlab.tensor"
local complete = require "distlab.repl.complete"

local M = {}

local lines_of = {} -- path -> the file's lines (read once)
local function read_lines(path)
  if lines_of[path] == nil then
    local f = io.open(path)
    local t = {}
    if f then
      for l in f:lines() do t[#t + 1] = l end
      f:close()
    end
    lines_of[path] = t
  end
  return lines_of[path]
end

local function rel(path)
  local root = core.root:gsub("/+$", "") .. "/"
  return path:sub(1, #root) == root and path:sub(#root + 1) or path
end

-- The comment block that opens a Lua file, "-- " taken off.
local function header(path)
  local out = {}
  for _, l in ipairs(read_lines(path)) do
    local body = l:match("^%-%- ?(.*)$")
    if not body then break end
    out[#out + 1] = body
  end
  return out
end

-- The comment lines (Lua "--" or C "/* */") right above line n.
local function comment_above(path, n)
  local lines, out = read_lines(path), {}
  local i = n - 1
  while i >= 1 do
    local l = lines[i]
    local body = l:match("^%s*%-%- ?(.*)$") or l:match("^%s*/?%*+/? ?(.-)%s*%*?/?$")
    if not body or l:match("^%s*$") then break end
    table.insert(out, 1, body)
    i = i - 1
  end
  return out
end

-- The header lines that name `name` as a field or method (attn.fwd(,
-- t:narrow, dl.mem.tag(, .comm =), each with the lines indented deeper that
-- follow it.
local function mentions(lines, name)
  local out, i = {}, 1
  local pat = "[%.:]" .. name:gsub("%p", "%%%0") .. "[%s%(%{=,]"
  while i <= #lines do
    local l = " " .. lines[i] .. " "
    if l:find(pat) then
      local indent = #lines[i]:match("^%s*")
      out[#out + 1] = lines[i]
      i = i + 1
      while i <= #lines and lines[i]:match("^%s*") and #lines[i]:match("^%s*") > indent
        and not (" " .. lines[i] .. " "):find(pat) do
        out[#out + 1] = lines[i]
        i = i + 1
      end
    else
      i = i + 1
    end
  end
  return out
end

local function indent(lines, pad)
  local out = {}
  for i, l in ipairs(lines) do out[i] = pad .. l end
  return table.concat(out, "\n")
end

local function source_of(fn)
  local info = debug.getinfo(fn, "S")
  if info.what == "Lua" and info.source:sub(1, 1) == "@" then return info.source:sub(2), info.linedefined end
end

-- The module a table is, by its name in package.loaded, and its file.
local function module_of(t)
  local best
  for name, v in pairs(package.loaded) do
    if v == t and (not best or #name < #best) then best = name end
  end
  if best then return best, package.searchpath(best, package.path) end
end

local function last_name(expr) return expr and expr:match("([%a_][%w_]*)%s*$") end

-- ---- values -----------------------------------------------------------------

-- One short line for a value inside a description.
local function short(v)
  if tensor.is_tensor(v) then
    return string.format("tensor [%s] %s on %s", table.concat(v.shape, ", "), v.dtype, v.device)
  end
  if type(v) ~= "table" then return pretty.format(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  local name = module_of(v)
  if name then return "module " .. name end
  local s = pretty.format(v, 1)
  if #s <= 100 and not s:find("\n") then return s end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return string.format("a table of %d entries", n)
end

local function tensor_text(t)
  local nbytes, refs = ffi.new("int64_t[1]"), ffi.new("int32_t[1]")
  collectgarbage() -- views that are garbage already do not count
  core.check(core.C.dl_tensor_storage_info(t, nbytes, refs))
  local shares = refs[0] > 1 and string.format(", shared with %d other tensor(s) (views)", refs[0] - 1) or ""
  return table.concat({
    string.format("tensor: shape [%s], dtype %s, device %s", table.concat(t.shape, ", "), t.dtype, t.device),
    string.format("  strides [%s] (elements), storage offset %d, %s", table.concat(t:stride(), ", "),
      t:storage_offset(), t:is_contiguous() and "contiguous" or "not contiguous"),
    string.format("  %d elements of %d bytes = %d bytes; storage %d bytes%s", t:numel(), t:element_size(),
      t:nbytes(), tonumber(nbytes[0]), shares),
  }, "\n")
end

local function signature(fn, name)
  local info = debug.getinfo(fn, "u")
  local params = {}
  for i = 1, info.nparams or 0 do params[i] = debug.getlocal(fn, i) or "?" end
  if info.isvararg then params[#params + 1] = "..." end
  return string.format("%s(%s)", name or "function", table.concat(params, ", "))
end

local function function_text(fn, expr)
  local path, line = source_of(fn)
  if not path then
    local info = debug.getinfo(fn, "S")
    if info.what == "C" then return "a built-in function (see the Lua 5.1 manual or LuaJIT's extensions)" end
    return signature(fn, expr) .. "    defined at " .. info.short_src .. ":" .. info.linedefined .. " (typed in)"
  end
  local name = last_name(expr)
  local out = { signature(fn, expr) .. "    " .. rel(path) .. ":" .. line }
  local above = comment_above(path, line)
  if #above > 0 then out[#out + 1] = indent(above, "  ") end
  local named = name and mentions(header(path), name) or {}
  if #named > 0 then
    out[#out + 1] = "  from the header of " .. rel(path) .. ":"
    out[#out + 1] = indent(named, "    ")
  end
  if #above == 0 and #named == 0 then out[#out + 1] = "  (no comment; " .. (header(path)[1] or rel(path)) .. ")" end
  return table.concat(out, "\n")
end

-- dl.C.dl_xxx: the declaration in the ABI header and the comment above it.
local function c_function_text(v, expr)
  local name = last_name(expr)
  local path = core.root .. "/core/include/distlab.h"
  for i, l in ipairs(read_lines(path)) do
    if name and l:find("[%s%*]" .. name .. "%(") then
      local out = { l .. "    " .. rel(path) .. ":" .. i }
      local above = comment_above(path, i)
      if #above > 0 then out[#out + 1] = indent(above, "  ") end
      return table.concat(out, "\n")
    end
  end
  return tostring(v) .. " (" .. tostring(ffi.typeof(v)) .. ")"
end

local function sorted_names(t, want)
  local out = {}
  for k, v in pairs(t) do
    if type(k) == "string" and want(v) then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

local function module_text(t, name, path)
  local out = { "module " .. name .. "    " .. rel(path) }
  out[#out + 1] = indent(header(path), "  ")
  local fns = sorted_names(t, function(v) return type(v) == "function" end)
  local rest = sorted_names(t, function(v) return type(v) ~= "function" end)
  if #fns > 0 then out[#out + 1] = "functions: " .. table.concat(fns, ", ") end
  if #rest > 0 then out[#out + 1] = "fields: " .. table.concat(rest, ", ") end
  if name == "distlab" then
    out[#out + 1] = "modules (loaded on first use): " .. table.concat(complete.modules(), ", ")
  end
  return table.concat(out, "\n")
end

-- The methods table of an object: its metatable's __index when a table.
local function methods_of(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and type(mt.__index) == "table" and mt.__index or nil
end

-- A field that is configuration, not a handle (the C pointer, the store).
local function setting(x)
  if type(x) == "function" or type(x) == "cdata" and not tensor.is_tensor(x) then return false end
  local mt = type(x) == "table" and getmetatable(x)
  return not (mt and not mt.__tostring and type(rawget(x, "ptr")) == "cdata")
end

local function object_text(v, methods)
  local out = { short(v) }
  local fields = {}
  for _, k in ipairs(sorted_names(v, setting)) do fields[#fields + 1] = "  " .. k .. " = " .. short(v[k]) end
  if #fields > 0 then out[#out + 1] = "configuration:\n" .. table.concat(fields, "\n") end
  if type(methods.info) == "function" then
    local ok, info = pcall(methods.info, v)
    if ok then out[#out + 1] = "info(): " .. pretty.format(info) end
  end
  local names = {}
  for _, k in ipairs(sorted_names(methods, function(x) return type(x) == "function" end)) do
    if k:sub(1, 2) ~= "__" then names[#names + 1] = k end
  end
  out[#out + 1] = "methods: " .. table.concat(names, ", ")
  local path = names[1] and source_of(methods[names[1]])
  if path then out[#out + 1] = "from " .. rel(path) .. ":\n" .. indent(header(path), "  ") end
  return table.concat(out, "\n")
end

function M.describe(v, expr)
  if tensor.is_tensor(v) then return tensor_text(v) end
  local tv = type(v)
  if tv == "function" then return function_text(v, expr) end
  if tv == "cdata" then
    if tostring(ffi.typeof(v)):find("%(") then return c_function_text(v, expr) end
    return tostring(v) .. " (" .. tostring(ffi.typeof(v)) .. ")"
  end
  if tv == "table" then
    local name, path = module_of(v)
    if name and path then return module_text(v, name, path) end
    local methods = methods_of(v)
    if methods then return object_text(v, methods) end
  end
  return tv .. ": " .. pretty.format(v)
end

return M
