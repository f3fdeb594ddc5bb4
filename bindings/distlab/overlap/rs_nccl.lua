-- distlab.overlap.rs_nccl — the baseline GEMM + reduce-scatter ("gemm_then_nccl"):
-- one GEMM of the rank's columns, [m, k/d] x [k/d, n], into a full partial
-- C, then the communicator's reduce-scatter (NCCL on GPUs of their own:
-- bf16/f16 summed in fp32) of its m/d-row blocks. Nothing overlaps. Memory:
-- the partial C, m x n elements, made once (tag "overlap_buffers").
local M = { baseline = true }

function M.setup(X)
  X.partial = require("distlab.tensor").empty({ X.sh.m, X.sh.n }, { dtype = X.out, device = X.device })
end

function M.run(X, a, b, c)
  X:on(0, function()
    X:gemm(a, b, X.partial)
    X.comm:reduce_scatter(c, X.partial)
  end)
end

return M
