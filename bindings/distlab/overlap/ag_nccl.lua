-- distlab.overlap.ag_nccl — the baseline all-gather + GEMM ("nccl_then_gemm"):
-- the communicator's all-gather (NCCL on GPUs of their own; the ipc or shm
-- communicator where ranks share a GPU or run on cpu) into a full A, then
-- one GEMM of [m, k] x [k, n]. Nothing overlaps. Memory: the gathered A,
-- m x k elements, made once (tag "overlap_buffers").
local M = { baseline = true }

function M.setup(X)
  X.full = require("distlab.tensor").empty({ X.sh.m, X.sh.k }, { dtype = X.dtype, device = X.device })
end

function M.run(X, a, b, c)
  X:on(0, function()
    X.comm:all_gather(X.full, a)
    X:gemm(X.full, b, c)
  end)
end

return M
