-- The all-reduce dispatch tables distlab ships (read by
-- distlab.allreduce.table for algo = "auto" when no tuned table matches;
-- DISTLAB_AR_TABLE and the file dl.allreduce.tune writes come first). rows: the algorithm (and grid;
-- 0 = the kernels' own sizing) for sizes up to `upto` bytes; the last row
-- covers everything larger. zc_rows: the same for an input in the zero-copy
-- region, run in place (ar:choose takes them for such an input).
--
-- NVIDIA H200 at 2 and 4 ranks: the tables dl.allreduce.tune wrote (every
-- algorithm, a few grids per size, CUDA-graph timing, zero-copy rows too), at
-- 4 ranks on nvidia-h200-x4 at c573283 (2026-11-28 06:43 UTC: the 4-rank
-- kernels of HEAD, whose PTX is c573283's; allreduce/history/allreduce-h200-issue26.md), at 2
-- ranks on nvidia-h200-x2 at d47665d (07:10 UTC). The
-- sweeps in experiments/results/allreduce/history/allreduce-h200x2.md and
-- allreduce-h200x4.md ran with exactly these tables. Since c573283 a grid of a
-- Lamport kernel means blocks that shrink to the positions they get (the
-- core's shape_for), which the H100 tables below were not tuned with: their
-- Lamport rows with explicit grids are provisional until re-tuned. NVIDIA H100
-- 80GB HBM3 at 2 and 4 ranks: the tables dl.allreduce.tune wrote on 4 H100s at
-- 3d94e80 (2026-11-27 17:48 and 17:50 UTC, the same way; allreduce-h100x2.md
-- and allreduce-h100x4.md ran with them). The other entries are still PROVISIONAL: the generic rows for 2
-- ranks follow seed 002 (vLLM's sweep on H100, TP=2: one-stage custom
-- all-reduce fastest up to 64 MB, NCCL even at 64 MB), with the push one-shot
-- in its place; the generic rows for 4, 6 and 8 ranks follow the same seed's
-- TP=4/6 tables (one-stage up to ~1 MB, two-stage to 16-32 MB, then NCCL)
-- and its B200 TP=8 table. `NRANKS=N scripts/gpu/allreduce.sh sweep`
-- measures the real ones; replace these entries with its output.
return {
  {
    device = "NVIDIA H200",
    world = 2,
    dtype = "bf16",
    date = "2026-11-28 07:10 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x2, 2 ranks, d47665d (experiments/results/allreduce/history/allreduce-h200x2-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 16, us = 3.58, at = 8192 },
      { upto = 23168, algo = "one_shot_lamport", blocks = 32, us = 3.61, at = 16384 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 64, us = 3.67, at = 32768 },
      { upto = 741440, algo = "one_shot_lamport", blocks = 132, us = 4.98, at = 524288 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 264, us = 6.48, at = 1048576 },
      { upto = 2568464, algo = "one_shot_lamport", blocks = 264, us = 8.10, at = 1572864 },
      { upto = 3632368, algo = "one_shot_lamport", blocks = 0, us = 13.19, at = 3145728 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 198, us = 15.90, at = 4194304 },
      { upto = 41028672, algo = "one_shot_lamport", blocks = 264, us = 27.69, at = 8388608 },
      { upto = 58023296, algo = "one_shot_push", blocks = 132, us = 148.62, at = 50167808 },
      { upto = 94906256, algo = "one_shot_push", blocks = 0, us = 196.62, at = 67108864 },
      { upto = 189812528, algo = "one_shot_push", blocks = 132, us = 392.56, at = 134217728 },
      { upto = 759250112, algo = "one_shot_push", blocks = 0, us = 785.41, at = 268435456 },
      { algo = "one_shot_push", blocks = 132, us = 3138.91, at = 1073741824 },
    },
    zc_rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 16, us = 3.55, at = 8192 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 32, us = 3.60, at = 16384 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 64, us = 3.85, at = 65536 },
      { upto = 741440, algo = "one_shot_lamport", blocks = 132, us = 4.98, at = 524288 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 264, us = 6.51, at = 1048576 },
      { upto = 2568464, algo = "one_shot_lamport", blocks = 264, us = 8.17, at = 1572864 },
      { upto = 3632368, algo = "one_shot_lamport", blocks = 132, us = 13.10, at = 3145728 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 198, us = 15.89, at = 4194304 },
      { upto = 41028672, algo = "one_shot_lamport", blocks = 264, us = 27.73, at = 8388608 },
      { upto = 58023296, algo = "one_shot_push", blocks = 132, us = 148.67, at = 50167808 },
      { algo = "one_shot_push", blocks = 0, us = 196.46, at = 67108864 },
    },
  },
  {
    device = "NVIDIA H200",
    world = 4,
    dtype = "bf16",
    date = "2026-11-28 06:43 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x4, 4 ranks, c573283 (experiments/results/allreduce/history/allreduce-h200x4-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 8, us = 4.50, at = 8192 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 32, us = 4.51, at = 16384 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 64, us = 5.80, at = 131072 },
      { upto = 741440, algo = "two_shot_lamport", blocks = 64, us = 7.11, at = 262144 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 132, us = 10.09, at = 1048576 },
      { upto = 2568464, algo = "two_shot_lamport", blocks = 64, us = 12.00, at = 1572864 },
      { upto = 3632368, algo = "two_shot_lamport", blocks = 132, us = 19.65, at = 3145728 },
      { upto = 11863280, algo = "two_shot_lamport", blocks = 0, us = 24.15, at = 4194304 },
      { upto = 189812528, algo = "two_shot_lamport", blocks = 264, us = 79.01, at = 16777216 },
      { algo = "nccl", blocks = 0, us = 1185.41, at = 268435456 },
    },
    zc_rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 8, us = 4.50, at = 8192 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 32, us = 4.51, at = 16384 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 64, us = 4.95, at = 65536 },
      { upto = 1816176, algo = "two_shot_lamport", blocks = 64, us = 7.13, at = 262144 },
      { upto = 2568464, algo = "two_shot_lamport", blocks = 0, us = 14.61, at = 2097152 },
      { upto = 3632368, algo = "two_shot_lamport", blocks = 132, us = 19.60, at = 3145728 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 264, us = 24.15, at = 4194304 },
      { upto = 11863280, algo = "two_shot_lamport", blocks = 0, us = 42.04, at = 8388608 },
      { algo = "two_shot_lamport", blocks = 264, us = 79.04, at = 16777216 },
    },
  },
  {
    device = "NVIDIA H100 80GB HBM3",
    world = 2,
    dtype = "bf16",
    date = "2026-11-27 17:50 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x4 (the lease gave 4 H100s), 2 ranks, 3d94e80 (experiments/results/allreduce/history/allreduce-h100x2-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 4.10, at = 8192 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 8, us = 4.15, at = 16384 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 0, us = 4.49, at = 65536 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 16, us = 4.38, at = 131072 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 0, us = 4.57, at = 262144 },
      { upto = 741440, algo = "one_shot_lamport", blocks = 132, us = 5.31, at = 524288 },
      { upto = 1284224, algo = "one_shot_lamport", blocks = 0, us = 6.69, at = 1048576 },
      { upto = 1816176, algo = "two_shot_lamport", blocks = 264, us = 8.32, at = 1572864 },
      { upto = 2568464, algo = "one_shot_lamport", blocks = 264, us = 9.79, at = 2097152 },
      { upto = 41028672, algo = "two_shot_lamport", blocks = 264, us = 12.76, at = 3145728 },
      { upto = 58023296, algo = "one_shot_push", blocks = 132, us = 148.59, at = 50167808 },
      { upto = 94906256, algo = "one_shot_push", blocks = 0, us = 195.23, at = 67108864 },
      { upto = 379625056, algo = "one_shot_push", blocks = 132, us = 390.17, at = 134217728 },
      { upto = 759250112, algo = "one_shot_push", blocks = 0, us = 1557.45, at = 536870912 },
      { algo = "one_shot_push", blocks = 132, us = 3116.54, at = 1073741824 },
    },
    zc_rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 4.15, at = 8192 },
      { upto = 23168, algo = "one_shot_lamport", blocks = 8, us = 4.12, at = 16384 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 16, us = 4.25, at = 32768 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 0, us = 4.41, at = 65536 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 32, us = 4.56, at = 262144 },
      { upto = 741440, algo = "one_shot_lamport", blocks = 132, us = 5.23, at = 524288 },
      { upto = 1284224, algo = "one_shot_lamport", blocks = 0, us = 6.72, at = 1048576 },
      { upto = 1816176, algo = "two_shot_lamport", blocks = 264, us = 8.32, at = 1572864 },
      { upto = 2568464, algo = "one_shot_lamport", blocks = 264, us = 9.79, at = 2097152 },
      { upto = 41028672, algo = "two_shot_lamport", blocks = 264, us = 12.76, at = 3145728 },
      { algo = "one_shot_push", blocks = 132, us = 148.71, at = 50167808 },
    },
  },
  {
    device = "NVIDIA H100 80GB HBM3",
    world = 4,
    dtype = "bf16",
    date = "2026-11-27 17:48 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x4 (the lease gave 4 H100s), 4 ranks, 3d94e80 (experiments/results/allreduce/history/allreduce-h100x4-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 6.00, at = 8192 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 8, us = 5.94, at = 16384 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 32, us = 6.82, at = 131072 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 64, us = 8.16, at = 262144 },
      { upto = 741440, algo = "two_shot_lamport", blocks = 32, us = 9.54, at = 524288 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 64, us = 11.21, at = 1048576 },
      { upto = 1816176, algo = "two_shot_lamport", blocks = 132, us = 13.32, at = 1572864 },
      { upto = 2568464, algo = "two_shot_lamport", blocks = 198, us = 15.70, at = 2097152 },
      { upto = 3632368, algo = "two_shot_lamport", blocks = 264, us = 22.04, at = 3145728 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 64, us = 27.16, at = 4194304 },
      { upto = 11863280, algo = "two_shot_lamport", blocks = 0, us = 45.82, at = 8388608 },
      { upto = 23726560, algo = "two_shot_lamport", blocks = 264, us = 84.82, at = 16777216 },
      { upto = 41028672, algo = "two_shot_lamport", blocks = 132, us = 161.56, at = 33554432 },
      { upto = 189812528, algo = "two_shot_lamport", blocks = 264, us = 232.06, at = 50167808 },
      { algo = "nccl", blocks = 0, us = 1189.62, at = 268435456 },
    },
    zc_rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 6.04, at = 8192 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 8, us = 5.96, at = 16384 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 32, us = 6.08, at = 65536 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 64, us = 8.13, at = 262144 },
      { upto = 741440, algo = "two_shot_lamport", blocks = 32, us = 9.53, at = 524288 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 64, us = 11.23, at = 1048576 },
      { upto = 1816176, algo = "two_shot_lamport", blocks = 132, us = 13.33, at = 1572864 },
      { upto = 3632368, algo = "two_shot_lamport", blocks = 198, us = 15.75, at = 2097152 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 64, us = 26.89, at = 4194304 },
      { upto = 11863280, algo = "two_shot_lamport", blocks = 0, us = 45.90, at = 8388608 },
      { upto = 23726560, algo = "two_shot_lamport", blocks = 264, us = 84.75, at = 16777216 },
      { upto = 41028672, algo = "two_shot_lamport", blocks = 132, us = 161.96, at = 33554432 },
      { algo = "two_shot_lamport", blocks = 264, us = 232.41, at = 50167808 },
    },
  },
  {
    device = "*",
    world = 2,
    dtype = "bf16",
    source = "seed 002 (vLLM, H100 TP=2)",
    provisional = true,
    rows = {
      { upto = 64 * 2 ^ 20, algo = "one_shot_push", blocks = 0 },
      { algo = "nccl", blocks = 0 },
    },
  },
  {
    device = "*",
    world = 4,
    dtype = "bf16",
    source = "seed 002 (vLLM, H100 TP=4)",
    provisional = true,
    rows = {
      { upto = 2 ^ 20, algo = "one_shot", blocks = 0 },
      { upto = 32 * 2 ^ 20, algo = "two_shot", blocks = 0 },
      { algo = "nccl", blocks = 0 },
    },
  },
  {
    device = "*",
    world = 6,
    dtype = "bf16",
    source = "seed 002 (vLLM, H100 TP=6)",
    provisional = true,
    rows = {
      { upto = 512 * 1024, algo = "one_shot", blocks = 0 },
      { upto = 16 * 2 ^ 20, algo = "two_shot", blocks = 0 },
      { algo = "nccl", blocks = 0 },
    },
  },
  {
    device = "*",
    world = 8,
    dtype = "bf16",
    source = "seed 002 (vLLM, B200 TP=8; H100 TP=8 was not published)",
    provisional = true,
    rows = {
      { upto = 512 * 1024, algo = "one_shot", blocks = 0 },
      { upto = 8 * 2 ^ 20, algo = "two_shot", blocks = 0 },
      { algo = "nccl", blocks = 0 },
    },
  },
}
