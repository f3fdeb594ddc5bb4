-- distlab.bench.plot — PNGs with gnuplot, where gnuplot exists (gnuplot-nox
-- on Debian; the GPU hosts may lack it). Where it does not, nothing is
-- drawn and the caller gets a note saying how to draw it elsewhere.
--
--   available() -> bool
--   gnuplot(script, png) -> true | false, note    runs the gnuplot script text
--   script(path, args, png) -> true | false, note  runs a plot script of the
--                            repository (e.g. experiments/allreduce/allreduce_plot.sh)
local core = require "distlab.core"

local M = {}

local function sh(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function M.available()
  local ok = os.execute("command -v gnuplot >/dev/null 2>&1")
  return ok == 0 or ok == true
end

local function missing(png, how)
  return false, string.format("no gnuplot here: %s was not drawn (%s where gnuplot-nox is installed)", png, how)
end

function M.gnuplot(script, png)
  if not M.available() then return missing(png, "run the gnuplot script again") end
  local ok = os.execute("gnuplot <<'DISTLAB_GNUPLOT_EOF'\n" .. script .. "\nDISTLAB_GNUPLOT_EOF\n")
  if ok == 0 or ok == true then return true end
  return false, "gnuplot failed drawing " .. png
end

function M.script(path, args, png)
  local cmd = { sh(core.root .. "/" .. path) }
  for _, a in ipairs(args or {}) do cmd[#cmd + 1] = sh(a) end
  local line = path .. " " .. table.concat(args or {}, " ")
  if not M.available() then return missing(png, line) end
  local ok = os.execute(table.concat(cmd, " "))
  if ok == 0 or ok == true then return true end
  return false, line .. " failed"
end

return M
