-- distlab.repl.complete — Tab completion from the live objects.
--
--   complete.candidates(word, env, extra) -> full words that can replace word
--
-- word is what precedes the cursor up to a break (dl.at, t:nar, wor); env
-- the globals; extra = {names = {...}, get = fn(name)}: the names the REPL
-- provides through env's __index (world) and how to read one without that
-- __index (which may make a communicator: a collective).
-- The path before the last '.' or ':' is walked with rawget, through
-- metatables whose __index is a table (methods), tensors' methods and
-- fields, strings' methods, and distlab's modules, which load on first use
-- (their names come from the files under bindings/distlab/). Functions get
-- a "(" appended; names starting with "_" are offered only after a "_".
local tensor = require "distlab.tensor"
local core = require "distlab.core"

local M = {}

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto",
  "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }
local TENSOR_FIELDS = { "shape", "dtype", "device", "ndim" }

-- distlab's module names (files and folders under bindings/distlab/), once;
-- not the REPL's own files: requiring repl.lua would start a REPL.
local modules
function M.modules()
  if not modules then
    modules = {}
    local seen = { init = true, repl = true, repl_multi = true }
    local p = io.popen("ls -1 '" .. core.root .. "/bindings/distlab' 2>/dev/null")
    for f in p:lines() do
      local name = f:match("^([%a_][%w_]*)%.lua$") or f:match("^([%a_][%w_]*)$")
      if name and not seen[name] then modules[#modules + 1] = name end
      if name then seen[name] = true end
    end
    p:close()
  end
  return modules
end

-- The members of v (name -> value, where known) for completion.
local function members(v)
  local out = {}
  local function add_table(t, depth)
    for k, x in pairs(t) do
      if type(k) == "string" and out[k] == nil then out[k] = x end
    end
    local mt = getmetatable(t)
    if depth < 8 and type(mt) == "table" and type(mt.__index) == "table" then add_table(mt.__index, depth + 1) end
  end
  if tensor.is_tensor(v) then
    add_table(tensor.methods, 0)
    for _, k in ipairs(TENSOR_FIELDS) do out[k] = 0 end
  elseif type(v) == "string" then
    add_table(string, 0)
  elseif type(v) == "table" then
    add_table(v, 0)
    if v == package.loaded["distlab"] then
      for _, m in ipairs(M.modules()) do out[m] = out[m] or true end
    end
  end
  return out
end

-- v[k] without calling an __index function, except distlab's module loader.
local function field(v, k)
  if tensor.is_tensor(v) then return tensor.methods[k] end
  if type(v) == "string" then return string[k] end
  if type(v) ~= "table" then return nil end
  local x = rawget(v, k)
  if x == nil and v == package.loaded["distlab"] and not k:match("^repl") then
    local ok, m = pcall(function() return v[k] end)
    return ok and m or nil
  end
  if x == nil then
    local mt = getmetatable(v)
    if type(mt) == "table" and type(mt.__index) == "table" then return field(mt.__index, k) end
  end
  return x
end

local function offer(out, prefix, name, value, partial, methods_only)
  if name:sub(1, #partial) ~= partial then return end
  if name:sub(1, 1) == "_" and partial:sub(1, 1) ~= "_" then return end
  if not name:match("^[%a_][%w_]*$") then return end
  if methods_only and type(value) ~= "function" then return end
  out[#out + 1] = prefix .. name .. (type(value) == "function" and "(" or "")
end

function M.candidates(word, env, extra)
  local out = {}
  local path, sep, partial = word:match("^([%a_][%w_%.]*)([%.:])([%a_]?[%w_]*)$")
  if not path then
    partial = word:match("^[%a_][%w_]*$") or (word == "" and "")
    if not partial then return out end
    for name, value in pairs(members(env)) do offer(out, "", name, value, partial) end
    for _, name in ipairs(extra and extra.names or {}) do
      if rawget(env, name) == nil then offer(out, "", name, extra.get(name), partial) end
    end
    for _, k in ipairs(KEYWORDS) do offer(out, "", k, nil, partial) end
    table.sort(out)
    return out
  end
  local v
  for name in path:gmatch("[^%.]+") do
    if v == nil then
      v = rawget(env, name)
      if v == nil and extra then v = extra.get(name) end
    else
      v = field(v, name)
    end
    if v == nil then return out end
  end
  for name, value in pairs(members(v)) do offer(out, path .. sep, name, value, partial, sep == ":") end
  table.sort(out)
  return out
end

return M
