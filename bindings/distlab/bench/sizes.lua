-- distlab.bench.sizes — lists of sizes as benchmarks take them on the
-- command line, and sizes as tables print them.
--
--   parse_one("64K") -> 65536        an integer with an optional binary suffix:
--                                    K, M, G, T (also KB/KiB, ..., any case)
--   parse("8K,1M,64M") -> {8192, 1048576, 67108864}
--   parse("8..1G")     -> 8, 16, 32, ..., 1G: a range doubles from its start up
--                         to its end (both included when the end is on the way)
--   parse("8K..1M:4")  -> 8K, 32K, 128K, 512K: the factor after the colon
--                         (nccl-tests' -b/-e/-f); items mix: "8..256K,1M,64M..1G"
--   range(first, last[, factor = 2]) -> the same list from numbers
--   human(bytes) -> "8 KB", "0.50 MB", "1.00 GB" (the all-reduce tables' sizes)
--   short(bytes) -> "8K", "64M", "1G"; the exact number when not a whole K/M/G
-- Items are separated by commas or spaces; every error names the item.
local core = require "distlab.core"

local fail = core.fail
local M = {}

local UNIT = { [""] = 1, k = 2 ^ 10, m = 2 ^ 20, g = 2 ^ 30, t = 2 ^ 40 }
local EXAMPLES = "(e.g. 8, 64K, 16M, 1G, 8K,1M or 8..1G or 8K..1M:4)"

function M.parse_one(s)
  if type(s) == "number" then s = tostring(s) end
  if type(s) ~= "string" then fail("bad size %s %s", tostring(s), EXAMPLES) end
  local n, unit, rest = s:match("^%s*(%d+)%s*([KkMmGgTt]?)(%a*)%s*$")
  rest = rest and rest:lower()
  if not n or not (rest == "" or rest == "b" or (rest == "ib" and unit ~= "")) then
    fail("bad size '%s' %s", s, EXAMPLES)
  end
  return tonumber(n) * UNIT[unit:lower()]
end

function M.range(first, last, factor)
  factor = factor or 2
  if type(factor) ~= "number" or factor ~= math.floor(factor) or factor < 2 then
    fail("bad size range: the factor must be an integer >= 2, got %s %s", tostring(factor), EXAMPLES)
  end
  if first < 1 or last < first then
    fail("bad size range %s..%s: the start must be at least 1 and not above the end %s", M.short(first), M.short(last),
      EXAMPLES)
  end
  local out, s = {}, first
  while s <= last do
    out[#out + 1] = s
    s = s * factor
  end
  return out
end

function M.parse(text)
  if type(text) == "number" then return { text } end
  if type(text) ~= "string" then fail("bad size list %s %s", tostring(text), EXAMPLES) end
  local out = {}
  for item in text:gmatch("[^,%s]+") do
    local a, b, f = item:match("^([^.:]+)%.%.([^.:]+):?(%d*)$")
    if a then
      for _, s in ipairs(M.range(M.parse_one(a), M.parse_one(b), f ~= "" and tonumber(f) or 2)) do out[#out + 1] = s end
    elseif item:find("..", 1, true) or item:find(":", 1, true) then
      fail("bad size range '%s' %s", item, EXAMPLES)
    else
      out[#out + 1] = M.parse_one(item)
    end
  end
  if #out == 0 then fail("empty size list '%s' %s", text, EXAMPLES) end
  return out
end

function M.human(b)
  if b >= 2 ^ 30 then return string.format("%.2f GB", b / 2 ^ 30) end
  if b >= 2 ^ 20 then return string.format("%.2f MB", b / 2 ^ 20) end
  if b % 1024 == 0 then return string.format("%d KB", b / 1024) end
  if b >= 1024 then return string.format("%.2f KB", b / 1024) end
  return string.format("%d B", b)
end

function M.short(b)
  for _, u in ipairs({ { "T", 2 ^ 40 }, { "G", 2 ^ 30 }, { "M", 2 ^ 20 }, { "K", 2 ^ 10 } }) do
    if b >= u[2] and b % u[2] == 0 then return string.format("%d%s", b / u[2], u[1]) end
  end
  return string.format("%d", b)
end

return M
