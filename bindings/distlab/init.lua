-- distlab — `local dl = require "distlab"`.
--
-- One table gathers the modules: tensors and their factories, the math a
-- reference needs (distlab.tensor_math: softmax, topk, sort, gather,
-- scatter_add, cat, bincount), files and bytes (distlab.io: dl.load,
-- dl.save, dl.from_bytes), comparisons, streams and events, memory
-- accounting and the benchmark harness. Modules
-- of later layers (comm, attn, cp, ...) load lazily on first use:
-- dl.comm, dl.attn, ... are required from bindings/distlab/<name>.lua.
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local create = require "distlab.create"
local compare = require "distlab.compare"
local tensor_math = require "distlab.tensor_math"
local files = require "distlab.io"
local stream = require "distlab.stream"
local bench = require "distlab.bench"

local dl = {
  C = core.C,
  check = core.check,
  fail = core.fail,
  try = core.try,
  root = core.root,
  libpath = core.libpath,
  mem = require "distlab.mem",
  is_tensor = tensor.is_tensor,
  manual_seed = tensor.manual_seed,
  default_device = core.default_device,
  set_default_device = core.set_default_device,
  current_stream = stream.current_stream,
  with_stream = stream.with_stream,
  stream = stream.stream,
  event = stream.event,
  synchronize = stream.synchronize,
  bench = bench, -- callable: dl.bench(fn, opts); dl.bench.harness, dl.bench.csv, ... are its parts
}

for k, v in pairs(create) do dl[k] = v end
for k, v in pairs(tensor_math) do dl[k] = v end
dl.load, dl.save, dl.from_bytes = files.load, files.save, files.from_bytes
dl.rel_err, dl.max_abs_diff, dl.allclose = compare.rel_err, compare.max_abs_diff, compare.allclose
dl.compare, dl.mismatch_report = compare.compare, compare.mismatch_report

function dl.build_info() return require("ffi").string(core.C.dl_build_info()) end

-- Host time in microseconds (monotonic, since the library loaded): for timing host work.
function dl.now_us() return core.C.dl_now_us() end

-- Number of CUDA devices and, when 0, why.
dl.cuda_device_count = core.cuda_count

function dl.cuda_device_name(i)
  local buf = require("ffi").new("char[256]")
  core.check(core.C.dl_cuda_device_name(i or 0, buf, 256))
  return require("ffi").string(buf)
end

setmetatable(dl, {
  __index = function(t, k)
    if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then return nil end
    local ok, mod = pcall(require, "distlab." .. k)
    if ok then
      rawset(t, k, mod)
      return mod
    end
    if not tostring(mod):find("module 'distlab." .. k .. "' not found", 1, true) then error(mod, 2) end
    return nil
  end,
})

return dl
