-- distlab.args — the one checker of the numbers and option tables that the
-- bindings hand to C, so that every binding refuses the same things with the
-- same words, at the caller's line (core.fail), before a value is converted:
-- a Lua number becomes an int64_t or an int32_t only once it is known to be
-- an integer in that type's range (LuaJIT would truncate 2.5 and wrap 2^63,
-- and an FFI conversion error names no argument).
--
--   args.int(v, what [, lo, hi])   an integer in [lo, hi] (default: int64)
--   args.size(v, what)             an integer >= 0 that fits an int64_t
--   args.int32(v, what [, lo])     an integer in [lo, 2^31 - 1] (lo default -2^31)
--   args.number(v, what)           a finite number (an int64_t box is taken)
--   args.options(opts, known, fn)  nil or a table whose keys are all in
--                                  `known`, a list or a set (else the error
--                                  lists them)
--   args.none_after(fn, n, ...)    no argument after the n-th
-- `what` names the value as the message shows it: "size in dimension 2",
-- "attn.fwd: max_seqlen_q".
local core = require "distlab.core"

local fail = core.fail
local M = {}

local TWO63 = 2 ^ 63

-- "2^63" for the bounds that have one, else the number.
local function bound(x)
  if x == TWO63 - 1 or x == TWO63 then return "2^63 - 1" end
  if x == -TWO63 then return "-2^63" end
  if x == 2 ^ 31 - 1 then return "2^31 - 1" end
  if x == -2 ^ 31 then return "-2^31" end
  return string.format("%.17g", x)
end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "number" then return string.format("%.17g", v) end
  return tostring(v)
end

function M.int(v, what, lo, hi)
  lo, hi = lo or -TWO63, hi or TWO63 - 1
  if type(v) == "cdata" then v = tonumber(v) end -- int64_t boxes: exact below 2^53
  if type(v) ~= "number" then
    fail("%s is %s (a %s), not an integer", what, show(v), type(v))
  end
  if v ~= v or v ~= math.floor(v) then fail("%s is %s, not an integer", what, show(v)) end
  -- doubles at 2^63 and above do not fit an int64_t (2^63 - 1 is no double)
  if v < lo or v > hi or v >= TWO63 then
    fail("%s is %s, outside %s..%s", what, show(v), bound(lo), bound(hi))
  end
  return v
end

function M.number(v, what)
  if type(v) == "cdata" then v = tonumber(v) end
  if type(v) ~= "number" then fail("%s is %s (a %s), not a number", what, show(v), type(v)) end
  if v ~= v or v == math.huge or v == -math.huge then fail("%s is %s, not a finite number", what, show(v)) end
  return v
end

function M.size(v, what) return M.int(v, what, 0) end

function M.int32(v, what, lo) return M.int(v, what, lo or -2 ^ 31, 2 ^ 31 - 1) end

function M.options(opts, known, fn)
  if opts == nil then return {} end
  if type(opts) ~= "table" then fail("%s: options must be a table, got %s", fn, show(opts)) end
  local set = {}
  if known[1] ~= nil then
    for _, k in ipairs(known) do set[k] = true end
  else
    set = known
  end
  for k in pairs(opts) do
    if not set[k] then
      local names = {}
      for n in pairs(set) do names[#names + 1] = n end
      table.sort(names)
      fail("%s: unknown option %s (known: %s)", fn, tostring(k), table.concat(names, ", "))
    end
  end
  return opts
end

function M.none_after(fn, n, ...)
  local extra = select("#", ...) - n
  if extra > 0 then
    fail("%s: %d argument%s too many (the first extra is %s)", fn, extra, extra == 1 and "" or "s",
      show((select(n + 1, ...))))
  end
end

return M
