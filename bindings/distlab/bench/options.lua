-- distlab.bench.options — typed command-line options for benchmarks.
--
--   local p = options.new({
--     { "sizes", "sizes", "8..64M", "message sizes in bytes" },     name, type, default, help
--     { "iters", "int", 20, "timed repetitions", short = "n" },
--     { "ops", "list", "all_reduce,all_gather", "ops to run", values = { "all_reduce", ... } },
--     { "raw", "flag", nil, "also time raw NCCL calls" },
--   }, { program = "comm_bench", usage = "./distlab run -n 2 experiments/comm/comm_bench.lua [options]",
--        about = "what it measures, how" })
--   local opt, given = p:parse(arg)   -> opt.sizes, opt.iters, ...; opt.help when --help
--                                was given; given[key] = true for the options on the line
--   p:help() -> the text --help prints
--
-- Forms: --name value, --name=value, -s value (a short name, or a one-letter name),
-- --flag. A dash in a name reads as an underscore in opt (--report-only ->
-- opt.report_only). Types: string, number, int, size (bytes: 64K, 16M),
-- sizes (a size list, distlab.bench.sizes), list (comma-separated words;
-- `values` limits them), counts (comma-separated positive integers, as
-- numbers), choice (one of `values`), flag (true when given).
-- Defaults go through the same parsing as arguments; a default of nil
-- leaves the option nil. An unknown option, a missing or a malformed value
-- is an error that names the option and says where the list is (--help).
local core = require "distlab.core"
local sizes = require "distlab.bench.sizes"

local fail = core.fail
local M = {}
local Parser = {}
Parser.__index = Parser

local function words(s)
  local out = {}
  for w in tostring(s):gmatch("[^,%s]+") do out[#out + 1] = w end
  return out
end

local function one_of(v, values)
  for _, x in ipairs(values) do if v == x then return true end end
  return false
end

local TYPES = {
  string = function(v) return v end,
  number = function(v)
    local n = tonumber(v)
    if not n then return nil, "a number" end
    return n
  end,
  int = function(v)
    local n = tonumber(v)
    if not n or n ~= math.floor(n) then return nil, "an integer" end
    return n
  end,
  size = function(v)
    local ok, n = pcall(sizes.parse_one, v)
    if not ok then return nil, "a size (e.g. 8, 64K, 16M, 1G)" end
    return n
  end,
  sizes = function(v)
    local ok, list = pcall(sizes.parse, v)
    if not ok then return nil, "a size list (e.g. 8K,1M,64M or 8..1G or 8K..1M:4)" end
    return list
  end,
  list = function(v, o)
    local list = words(v)
    if #list == 0 then return nil, "a comma-separated list" end
    if o.values then
      for _, w in ipairs(list) do
        if not one_of(w, o.values) then return nil, "a list of " .. table.concat(o.values, ", ") end
      end
    end
    return list
  end,
  counts = function(v)
    local list = words(v)
    if #list == 0 then return nil, "a comma-separated list of positive integers" end
    for i, w in ipairs(list) do
      local n = tonumber(w)
      if not n or n < 1 or n ~= math.floor(n) then return nil, "a comma-separated list of positive integers" end
      list[i] = n
    end
    return list
  end,
  choice = function(v, o)
    if not one_of(v, o.values) then return nil, "one of " .. table.concat(o.values, ", ") end
    return v
  end,
  flag = function() return true end,
}

-- options.new(spec, {program =, usage =, about =}) -> parser
function M.new(spec, info)
  info = info or {}
  local p = setmetatable({ list = {}, by_long = {}, by_short = {}, program = info.program or "bench",
    usage = info.usage, about = info.about }, Parser)
  for _, s in ipairs(spec) do
    local o = { name = s[1] or s.name, type = s[2] or s.type or "string", default = s[3], help = s[4] or s.help or "",
      short = s.short, values = s.values, meta = s.meta }
    if s.default ~= nil then o.default = s.default end
    if type(o.name) ~= "string" or not o.name:match("^[%a][%w_-]*$") then
      fail("options: bad option name %s", tostring(o.name))
    end
    if not TYPES[o.type] then fail("options: --%s has an unknown type %s", o.name, tostring(o.type)) end
    if (o.type == "choice") and not o.values then fail("options: --%s (choice) needs values", o.name) end
    if p.by_long[o.name] then fail("options: --%s is declared twice", o.name) end
    if o.short and (p.by_short[o.short] or #o.short ~= 1) then fail("options: bad or repeated short name -%s", o.short) end
    o.key = o.name:gsub("-", "_")
    p.list[#p.list + 1] = o
    p.by_long[o.name] = o
    if o.short then p.by_short[o.short] = o end
  end
  return p
end

function Parser:error(fmt, ...)
  error(string.format("%s: " .. fmt .. " (--help lists the options)", self.program, ...), 0)
end

local function convert(p, o, v, from)
  local x, want = TYPES[o.type](v, o)
  if x == nil then p:error("%s --%s takes %s, got '%s'", from, o.name, want, tostring(v)) end
  return x
end

-- parser:parse(argv) -> opt, given (argv: a list of strings, e.g. the script's `arg`)
function Parser:parse(argv)
  local opt, given = {}, {}
  for _, o in ipairs(self.list) do
    if o.default ~= nil and o.type ~= "flag" then opt[o.key] = convert(self, o, o.default, "the default of")
    elseif o.type == "flag" then opt[o.key] = o.default and true or false end
  end
  argv = argv or {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local name, value = a:match("^%-%-([^=]+)=(.*)$")
    if not name then name = a:match("^%-%-(.+)$") end
    local o
    if name then
      if name == "help" then
        opt.help = true
        i = i + 1
        goto continue
      end
      o = self.by_long[name] or self.by_long[name:gsub("_", "-")]
    elseif a:match("^%-%a$") then
      o = self.by_short[a:sub(2)] or self.by_long[a:sub(2)] -- a one-letter name takes one dash too
      if a == "-h" and not o then
        opt.help = true
        i = i + 1
        goto continue
      end
    else
      self:error("unexpected argument '%s' (every argument is an option: --name value)", a)
    end
    if not o then self:error("unknown option %s", name and ("--" .. name) or a) end
    given[o.key] = true
    if o.type == "flag" then
      if value ~= nil then self:error("--%s takes no value", o.name) end
      opt[o.key] = true
      i = i + 1
    else
      if value == nil then
        value = argv[i + 1]
        if value == nil then self:error("--%s needs a value", o.name) end
        i = i + 2
      else
        i = i + 1
      end
      opt[o.key] = convert(self, o, value, "option")
    end
    ::continue::
  end
  return opt, given
end

function Parser:help()
  local lines = {}
  if self.usage then lines[#lines + 1] = "usage: " .. self.usage end
  if self.about then lines[#lines + 1] = self.about end
  lines[#lines + 1] = "options:"
  local width = 0
  local heads = {}
  for k, o in ipairs(self.list) do
    local arg_name = o.type == "flag" and "" or (" " .. (o.meta or o.type:upper()))
    local long = #o.name == 1 and ("-" .. o.name) or ("--" .. o.name)
    heads[k] = (o.short and ("-" .. o.short .. ", ") or "    ") .. long .. arg_name
    width = math.max(width, #heads[k])
  end
  for k, o in ipairs(self.list) do
    local extra = {}
    if o.values then extra[#extra + 1] = "one of " .. table.concat(o.values, ", ") end
    if o.default ~= nil and o.type ~= "flag" then extra[#extra + 1] = "default " .. tostring(o.default) end
    local tail = #extra > 0 and (" (" .. table.concat(extra, "; ") .. ")") or ""
    lines[#lines + 1] = string.format("  %-" .. width .. "s  %s%s", heads[k], o.help, tail)
  end
  lines[#lines + 1] = string.format("  %-" .. width .. "s  %s", "-h, --help", "this text")
  return table.concat(lines, "\n")
end

return M
