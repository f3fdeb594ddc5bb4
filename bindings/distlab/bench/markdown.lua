-- distlab.bench.markdown — the markdown results files of the benchmarks.
-- Every one starts with the same header, so a reader finds where, when,
-- from what code and how a figure was measured:
--
--   # title
--
--   - device: NVIDIA H200 x 2 (nccl backend)     the GPU model, or cpu / meta
--   - date: 2026-11-23 16:20 UTC
--   - commit: b45cdc9-dirty                      git describe --always --dirty
--   - command: `./distlab run -n 2 --device cuda experiments/comm/comm_bench.lua -b 8 -e 1G`
--   - (the bench's own lines: method, knobs, ...)
--
--   run_info{comm =, device =, command =} -> {device =, date =, commit =, command =}
--   device_name(device) -> "NVIDIA H200" for cuda:N, else the device's name
--   commit() -> $DISTLAB_COMMIT if set, else `git describe --always --dirty` in
--               the checkout, else "unknown (...)" (a copy without .git: set
--               DISTLAB_COMMIT=<hash> when running there)
--   command(argv) -> the command line that ran this script: the launcher's
--               (./distlab run -n N --device D script args), with the DISTLAB_*,
--               NCCL_* and CUDA_VISIBLE_DEVICES variables set for it in front
--   header(title, info, extra_lines) -> lines;  read_header(path) -> fields
--   table(head, rows, align) -> lines (align: a list of "l" | "r", default r
--               after the first column);  code(text), cell(text);  write(path, lines)
local core = require "distlab.core"

local fail = core.fail
local M = {}

function M.date() return os.date("!%Y-%m-%d %H:%M UTC") end

function M.device_name(device)
  local i = tostring(device):match("^cuda:?(%d*)$")
  if i then return require("distlab").cuda_device_name(tonumber(i) or 0) end
  return tostring(device)
end

local commit_cache
function M.commit()
  if commit_cache then return commit_cache end
  local env = os.getenv("DISTLAB_COMMIT")
  if env and env ~= "" then
    commit_cache = env
    return env
  end
  local p = io.popen(string.format("git -C '%s' describe --always --dirty 2>/dev/null", core.root))
  local out = p and p:read("*a") or ""
  if p then p:close() end
  out = out:gsub("%s+$", "")
  commit_cache = out ~= "" and out or "unknown (no git checkout here; set DISTLAB_COMMIT=<hash> to record it)"
  return commit_cache
end

local function shell_word(s)
  s = tostring(s)
  if s ~= "" and s:match("^[%w%._/,:=+%-@%%]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end
M.shell_word = shell_word

-- The variables the launcher sets itself; the others named DISTLAB_* are the user's knobs.
local LAUNCHER = { DISTLAB_ROOT = true, DISTLAB_RANK = true, DISTLAB_WORLD_SIZE = true, DISTLAB_LOCAL_RANK = true,
  DISTLAB_LOCAL_WORLD_SIZE = true, DISTLAB_DEVICE = true, DISTLAB_JOB_ID = true }

local function knobs()
  local f = io.open("/proc/self/environ", "rb")
  if not f then return {} end
  local text = f:read("*a")
  f:close()
  local out = {}
  for kv in text:gmatch("[^%z]+") do
    local k, v = kv:match("^([%w_]+)=(.*)$")
    if k and ((k:match("^DISTLAB_") and not LAUNCHER[k]) or k:match("^NCCL_") or k == "CUDA_VISIBLE_DEVICES") then
      out[#out + 1] = k .. "=" .. shell_word(v)
    end
  end
  table.sort(out)
  return out
end

function M.command(argv)
  argv = argv or _G.arg or {}
  local script = tostring(argv[0] or "?")
  local root = core.root .. "/"
  if script:sub(1, #root) == root then script = script:sub(#root + 1) end
  local words = knobs()
  local device = os.getenv("DISTLAB_DEVICE")
  if device then -- started by ./distlab run
    local n, world = os.getenv("DISTLAB_LOCAL_WORLD_SIZE") or "1", os.getenv("DISTLAB_WORLD_SIZE") or "1"
    words[#words + 1] = "./distlab run"
    if world ~= n then
      words[#words + 1] = string.format("--device %s --world %s --rank %s", device, world, os.getenv("DISTLAB_RANK") or "0")
    else
      words[#words + 1] = string.format("-n %s --device %s", n, device)
    end
  else
    words[#words + 1] = "luajit"
  end
  words[#words + 1] = shell_word(script)
  for i = 1, #argv do words[#words + 1] = shell_word(argv[i]) end
  return table.concat(words, " ")
end

-- run_info{comm =, device =, command =, argv =}: comm names the device and the
-- rank count; a command given (a wrapper script's) replaces the reconstructed one.
function M.run_info(o)
  o = o or {}
  local device = o.device or (o.comm and o.comm.device) or core.default_device()
  local desc = o.device_desc
  if not desc then
    desc = M.device_name(device)
    if o.comm then desc = string.format("%s x %d (%s backend)", desc, o.comm.size, o.comm.backend) end
  end
  return { device = desc, date = M.date(), commit = M.commit(), command = o.command or M.command(o.argv) }
end

function M.code(s)
  s = tostring(s)
  if s:find("`", 1, true) then return "`` " .. s .. " ``" end
  return "`" .. s .. "`"
end

function M.cell(s) return (tostring(s):gsub("|", "\\|"):gsub("\n", " ")) end

function M.header(title, info, extra)
  if not (info and info.device and info.date and info.commit and info.command) then
    fail("markdown.header: info needs device, date, commit and command (markdown.run_info gives them)")
  end
  local lines = { "# " .. title, "", "- device: " .. info.device, "- date: " .. info.date,
    "- commit: " .. M.code(info.commit), "- command: " .. M.code(info.command) }
  for _, l in ipairs(extra or {}) do lines[#lines + 1] = l:match("^%- ") and l or ("- " .. l) end
  return lines
end

-- The header fields of a results file: {title =, device =, date =, commit =, command =};
-- nil, err when it cannot be read.
function M.read_header(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local out = {}
  for line in f:lines() do
    if line:match("^## ") then break end
    local title = line:match("^# (.*)$")
    if title and not out.title then out.title = title end
    local k, v = line:match("^%- (%a+): (.*)$")
    if k and (k == "device" or k == "date" or k == "commit" or k == "command") and not out[k] then
      out[k] = v:match("^`` (.*) ``$") or v:match("^`(.*)`$") or v
    end
  end
  f:close()
  return out
end

function M.table(head, rows, align)
  local sep = {}
  for i = 1, #head do
    local a = align and align[i] or (i == 1 and "l" or "r")
    sep[i] = a == "r" and "---:" or "---"
  end
  local function line(cells)
    local out = {}
    for i = 1, #head do
      local v = cells[i]
      out[i] = v == nil and "-" or M.cell(v)
    end
    return "| " .. table.concat(out, " | ") .. " |"
  end
  local lines = { line(head), "|" .. table.concat(sep, "|") .. "|" }
  for _, r in ipairs(rows) do lines[#lines + 1] = line(r) end
  return lines
end

function M.write(path, lines)
  local f, err = io.open(path, "w")
  if not f then fail("markdown: cannot write %s: %s", path, tostring(err)) end
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  return path
end

return M
