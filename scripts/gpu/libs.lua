-- scripts/gpu/libs.lua — the libraries distlab loads at run time on this host, as a results
-- file names them: one rank on cuda opens each (an NCCL world of one rank, a GEMM through
-- cuBLASLt, an attention step with backend "auto", which opens cuDNN), then prints
--   lib distlab: <build info>
--   lib device: <GPU 0>
--   lib loaded: <distlab.bench.markdown's libraries line: CUDA runtime and driver, NCCL,
--               cuDNN, cuBLASLt, each with its version and file>
--   lib cudnn pick: <which libcudnn and why, every candidate: dl.attn.cudnn_info().pick>
-- scripts/gpu/suite.sh runs it under the environment of its specs:
--   ./distlab run -n 1 --device cuda scripts/gpu/libs.lua
local dl = require "distlab"
local markdown = require "distlab.bench.markdown"

-- each opened on its own: one that fails says why and the others still report
local function open(what, fn)
  local ok, err = pcall(fn)
  if not ok then print(string.format("lib %s: failed to open: %s", what, tostring(err):match("[^\n]*"))) end
end

print("lib distlab: " .. dl.build_info())
open("device", function() print("lib device: " .. dl.cuda_device_name(0)) end)
open("NCCL", function() dl.comm.world() end)
open("cuBLASLt", function()
  local a = dl.ones({ 64, 64 }, { dtype = "bf16", device = "cuda" })
  dl.gemm(a, a)
end)
open("cuDNN", function()
  local q = dl.ones({ 1, 128, 2, 64 }, { dtype = "bf16", device = "cuda" })
  local b = dl.attn.backends(q, q, q, { backend = "auto" })
  if b.fwd ~= "cudnn" then error(b.fwd_why) end
  dl.attn.fwd(q, q, q, { backend = "cudnn" })
end)
print("lib loaded: " .. markdown.libraries())
print("lib cudnn pick: " .. dl.attn.cudnn_info().pick)
