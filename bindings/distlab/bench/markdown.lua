-- distlab.bench.markdown — the markdown results files of the benchmarks.
-- Every one starts with the same header, so a reader finds where, when,
-- from what code, how, and on which libraries a figure was measured:
--
--   # title
--
--   - device: NVIDIA H200 x 2 (nccl backend)     the GPU model, or cpu / meta
--   - date: 2026-11-23 16:20 UTC
--   - commit: `b45cdc9-dirty`                    git describe --always --dirty
--   - command: `NCCL_NVLS_ENABLE=0 ./distlab run -n 2 --device cuda experiments/comm/comm_bench.lua -b 8 -e 1G`
--   - libraries: CUDA runtime 13.0, driver 13.0; NCCL 2.28.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2); cuDNN not loaded; cuBLASLt not loaded
--   - (the bench's own lines: method, knobs, ...)
--
--   run_info{comm =, device =, command =} -> {device =, date =, commit =, command =, ran_as =}
--               (ran_as: this process's own command line where a wrapper's command
--               was given, written as "- ran as:" under the command)
--   device_name(device) -> "NVIDIA H200" for cuda:N, else the device's name
--   commit() -> $DISTLAB_COMMIT if set, else `git describe --always --dirty` in
--               the checkout, else "unknown (...)" (a copy without .git: set
--               DISTLAB_COMMIT=<hash> when running there)
--   command(argv) -> the command line that ran this script: the launcher's
--               (./distlab run -n N --device D script args), with the variables
--               that change what runs in front (RECORDED: DISTLAB_* but the
--               launcher's own, NCCL_*, CUDA_*, CUDNN_*, CUBLAS_*, CUBLASLT_*,
--               LD_LIBRARY_PATH), as they were when the process started
--   libraries() -> the versions of the libraries this process has loaded, read
--               when the header is written (the end of a run): the CUDA runtime
--               and driver, NCCL (ncclGetVersion of the libnccl.so.2 the
--               communicator opened), cuDNN (dl.attn.cudnn_info, where dl.attn
--               opened one), cuBLASLt (dl.gemm.stats, where dl.gemm opened it),
--               each with its file; "not loaded" for one the run never opened.
--               Nothing is opened or initialised to find them (cheap on cpu).
--   header(title, info, extra_lines) -> lines;  read_header(path) -> fields
--   table(head, rows, align) -> lines (align: a list of "l" | "r", default r
--               after the first column);  code(text), cell(text);  write(path, lines)
--
-- experiments/torch_common.py writes the same header for the PyTorch anchors.
local ffi = require "ffi"
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
-- What changes what runs, or which library is picked (torch_common.py's RECORDED is this list and TORCH_*).
local RECORDED = { "^DISTLAB_", "^NCCL_", "^CUDA_", "^CUDNN_", "^CUBLAS_", "^CUBLASLT_", "^LD_LIBRARY_PATH$" }

function M.recorded(k)
  if LAUNCHER[k] then return false end
  for _, pat in ipairs(RECORDED) do
    if k:match(pat) then return true end
  end
  return false
end

-- The environment the process started with (/proc/self/environ: what the
-- command line set, not what the library set for itself later), sorted.
local function knobs()
  local f = io.open("/proc/self/environ", "rb")
  if not f then return {} end
  local text = f:read("*a")
  f:close()
  local out = {}
  for kv in text:gmatch("[^%z]+") do
    local k, v = kv:match("^([%w_]+)=(.*)$")
    if k and M.recorded(k) then out[#out + 1] = k .. "=" .. shell_word(v) end
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
-- rank count; a command given (a wrapper script's) is the command line, and
-- the process's own (its variables and options, which a wrapper's words may
-- leave out) is kept beside it as ran_as.
function M.run_info(o)
  o = o or {}
  local device = o.device or (o.comm and o.comm.device) or core.default_device()
  local desc = o.device_desc
  if not desc then
    desc = M.device_name(device)
    if o.comm then desc = string.format("%s x %d (%s backend)", desc, o.comm.size, o.comm.backend) end
  end
  local own = M.command(o.argv)
  return { device = desc, date = M.date(), commit = M.commit(), command = o.command or own,
    ran_as = o.command and o.command ~= own and own or nil }
end

-- ---- the libraries loaded --------------------------------------------------

-- The loader's calls (glibc: in libc since 2.34, libdl before) and the CUDA
-- runtime's two version queries (libdistlab's dependency: resolved through
-- core.C), each declared alone so that a module that declared one first keeps it.
for _, decl in ipairs({ "typedef struct { const char *dli_fname; void *dli_fbase; const char *dli_sname; "
    .. "void *dli_saddr; } dl_bench_dl_info_t;", "void *dlopen(const char *file, int mode);",
    "void *dlsym(void *handle, const char *name);", "int dlclose(void *handle);",
    "int dladdr(const void *addr, dl_bench_dl_info_t *info);", "int cudaRuntimeGetVersion(int *v);",
    "int cudaDriverGetVersion(int *v);", "int ncclGetVersion(int *v);" }) do
  pcall(ffi.cdef, decl)
end
local RTLD_NOW, RTLD_NOLOAD = 2, 4

-- The file a symbol lives in, or nil.
local function file_of(ptr)
  local ok, path = pcall(function()
    local info = ffi.new("dl_bench_dl_info_t")
    if ffi.C.dladdr(ffi.cast("const void *", ptr), info) ~= 0 and info.dli_fname ~= nil then return ffi.string(info.dli_fname) end
  end)
  return ok and path or nil
end

-- fn(handle) on a library this process has already opened under one of
-- names (RTLD_NOLOAD: nothing is opened); nil when none is open.
local function with_loaded(names, fn)
  for _, name in ipairs(names) do
    local ok, h = pcall(ffi.C.dlopen, name, RTLD_NOW + RTLD_NOLOAD)
    if ok and h ~= nil then
      local ok2, v = pcall(fn, h)
      ffi.C.dlclose(h)
      if ok2 then return v end
    end
  end
end

-- 13000 -> "13.0" (cudaRuntimeGetVersion, cudaDriverGetVersion)
local function cuda_version(v) return string.format("%d.%d", math.floor(v / 1000), math.floor(v % 1000 / 10)) end
-- major * 10000 + minor * 100 + patch (cuDNN 9, cuBLASLt, NCCL >= 2.9) -> "9.14.0"; cuDNN 8's major * 1000
local function mmp(v)
  if v < 20000 then return string.format("%d.%d.%d", math.floor(v / 1000), math.floor(v % 1000 / 100), v % 100) end
  return string.format("%d.%d.%d", math.floor(v / 10000), math.floor(v % 10000 / 100), v % 100)
end

local function cuda_line()
  local C, v = core.C, ffi.new("int[1]")
  local ok, rc = pcall(function() return C.cudaRuntimeGetVersion(v) end)
  if not ok or rc ~= 0 then return "CUDA runtime: none (a build without CUDA)" end
  local rt, path = v[0], file_of(C.cudaRuntimeGetVersion)
  local line = "CUDA runtime " .. cuda_version(rt) .. (path and (" (" .. path .. ")") or "")
  v[0] = 0
  local okd, rcd = pcall(function() return C.cudaDriverGetVersion(v) end)
  if okd and rcd == 0 and v[0] > 0 then return line .. ", driver " .. cuda_version(v[0]) end
  return line .. ", no driver"
end

local function nccl_line()
  local v = with_loaded({ "libnccl.so.2" }, function(h)
    local f = ffi.C.dlsym(h, "ncclGetVersion")
    if f == nil then return nil end
    local out = ffi.new("int[1]")
    if ffi.cast("int (*)(int *)", f)(out) ~= 0 then return nil end
    return mmp(out[0]) .. " (" .. (file_of(f) or "libnccl.so.2") .. ")"
  end)
  return "NCCL " .. (v or "not loaded")
end

local function cudnn_line()
  local attn = package.loaded["distlab.attn"]
  local ok, i = pcall(function() return attn and attn.cudnn_info() end)
  if ok and i and i.version and i.version > 0 then return "cuDNN " .. mmp(i.version) .. " (" .. i.path .. ")" end
  return "cuDNN not loaded"
end

local function cublaslt_line()
  local gemm = package.loaded["distlab.gemm"]
  local ok, st = pcall(function() return gemm and gemm.stats() end)
  if not (ok and st and st.version and st.version > 0) then return "cuBLASLt not loaded" end
  local names = { "libcublasLt.so.13", "libcublasLt.so.12" }
  if os.getenv("DISTLAB_CUBLASLT") then table.insert(names, 1, os.getenv("DISTLAB_CUBLASLT")) end
  local path = with_loaded(names, function(h)
    local f = ffi.C.dlsym(h, "cublasLtGetVersion")
    return f ~= nil and file_of(f) or nil
  end)
  return "cuBLASLt " .. mmp(st.version) .. (path and (" (" .. path .. ")") or "")
end

function M.libraries()
  return table.concat({ cuda_line(), nccl_line(), cudnn_line(), cublaslt_line() }, "; ")
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
    "- commit: " .. M.code(info.commit), "- command: " .. M.code(info.command),
    "- libraries: " .. (info.libraries or M.libraries()) }
  if info.ran_as then table.insert(lines, 7, "- ran as: " .. M.code(info.ran_as)) end
  for _, l in ipairs(extra or {}) do lines[#lines + 1] = l:match("^%- ") and l or ("- " .. l) end
  return lines
end

-- The header fields of a results file: {title =, device =, date =, commit =, command =, libraries =};
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
    if k and (k == "device" or k == "date" or k == "commit" or k == "command" or k == "libraries") and not out[k] then
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
