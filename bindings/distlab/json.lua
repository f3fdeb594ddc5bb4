-- distlab.json — the JSON that file headers need (safetensors): decode and
-- encode objects, arrays, strings (with \u escapes, surrogate pairs too),
-- numbers, true, false and null (json.null).
--
--   json.decode(text[, what]) -> value     what names the text in errors
--   json.encode(value) -> text             tables with [1] are arrays, others
--                                          objects with their keys sorted
-- Decoding keeps integers exact up to 2^53 (a byte offset past that is an
-- error where it is read, not here). Errors give the byte where it broke.
local M = {}

M.null = setmetatable({}, { __tostring = function() return "null" end })

local escapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xc0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xe0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xf0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

function M.decode(s, what)
  what = what or "JSON"
  local pos = 1
  local function fail(msg) error(string.format("%s: %s at byte %d", what, msg, pos - 1), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    pos = pos + 1
    local out = {}
    while true do
      local a, b = s:find('["\\%c]', pos)
      if not a then fail("unterminated string") end
      out[#out + 1] = s:sub(pos, a - 1)
      local c = s:sub(a, a)
      pos = a + 1
      if c == '"' then return table.concat(out) end
      if c ~= "\\" then fail("control character in a string") end
      local e = s:sub(pos, pos)
      if escapes[e] then
        out[#out + 1], pos = escapes[e], pos + 1
      elseif e == "u" then
        local hex = s:match("^%x%x%x%x", pos + 1)
        if not hex then fail("bad \\u escape") end
        local cp = tonumber(hex, 16)
        pos = pos + 5
        if cp >= 0xd800 and cp < 0xdc00 then
          local lo = s:match("^\\u(%x%x%x%x)", pos)
          if lo and tonumber(lo, 16) >= 0xdc00 and tonumber(lo, 16) < 0xe000 then
            cp = 0x10000 + (cp - 0xd800) * 1024 + tonumber(lo, 16) - 0xdc00
            pos = pos + 6
          end
        end
        out[#out + 1] = utf8(cp)
      else
        fail("bad escape \\" .. e)
      end
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      pos = pos + 1
      local obj = {}
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1 return obj end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("expected a key") end
        local k = str()
        ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        if obj[k] ~= nil then fail(string.format("key %q given twice", k)) end
        obj[k] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      pos = pos + 1
      local arr = {}
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1 return arr end
      while true do
        arr[#arr + 1] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    end
    for lit, v in pairs { ["true"] = true, ["false"] = false, null = M.null } do
      if s:sub(pos, pos + #lit - 1) == lit then
        pos = pos + #lit
        return v
      end
    end
    local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    if not num or num == "" or num == "-" then fail("unexpected " .. (c == "" and "end" or string.format("%q", c))) end
    pos = pos + #num
    local n = tonumber(num)
    if not n then fail("bad number " .. num) end
    return n
  end
  local v = value()
  ws()
  if pos <= #s then fail("trailing characters") end
  return v
end

local function quote(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    for k, v in pairs(escapes) do if v == c and k ~= "/" then return "\\" .. k end end
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

function M.encode(v)
  local t = type(v)
  if v == M.null or v == nil then return "null" end
  if t == "boolean" then return tostring(v) end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then error("json.encode: " .. tostring(v) .. " has no JSON form", 2) end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    return string.format("%.17g", v)
  end
  if t == "string" then return quote(v) end
  if t ~= "table" then error("json.encode: a " .. t .. " has no JSON form", 2) end
  if v[1] ~= nil or next(v) == nil and getmetatable(v) == M.array then
    local parts = {}
    for i = 1, #v do parts[i] = M.encode(v[i]) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do
    if type(k) ~= "string" then error("json.encode: object keys must be strings, got " .. type(k), 2) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = quote(k) .. ":" .. M.encode(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- setmetatable({}, json.array) encodes as [] rather than {}.
M.array = {}

return M
