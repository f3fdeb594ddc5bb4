-- The all-reduce dispatch tables distlab ships (read by
-- distlab.allreduce.table for algo = "auto" when no tuned table matches;
-- DISTLAB_AR_TABLE and the file dl.allreduce.tune writes come first). rows: the algorithm (and grid;
-- 0 = the kernels' own sizing) for sizes up to `upto` bytes; the last row
-- covers everything larger. zc_rows: the same for an input in the zero-copy
-- region, run in place (ar:choose takes them for such an input).
--
-- NVIDIA H200 at 2 and 4 ranks: the tables dl.allreduce.tune wrote on
-- nvidia-h200-x4 at d3b93ff (2026-11-27 09:42 and 09:44 UTC, every algorithm,
-- a few grids per size, CUDA-graph timing, zero-copy rows too; the 2-rank one
-- on two of the host's four GPUs; at 4 ranks the first with 48 and 64 MB in one
-- two_shot_lamport piece); the sweeps in
-- experiments/results/allreduce/allreduce-h200x2.md and allreduce-h200x4.md
-- ran with exactly these tables. The other entries are still PROVISIONAL: the H100
-- two-rank rows follow seed 002 (vLLM's sweep on H100, TP=2: one-stage custom
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
    date = "2026-11-27 09:44 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x4, 2 ranks, d3b93ff (experiments/results/allreduce/allreduce-h200x2-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 4.06, at = 8192 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 8, us = 4.07, at = 16384 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 32, us = 4.38, at = 65536 },
      { upto = 741440, algo = "one_shot_lamport", blocks = 0, us = 4.38, at = 131072 },
      { upto = 1284224, algo = "one_shot_lamport", blocks = 132, us = 6.67, at = 1048576 },
      { upto = 1816176, algo = "two_shot_lamport", blocks = 264, us = 8.24, at = 1572864 },
      { upto = 2568464, algo = "one_shot_lamport", blocks = 264, us = 9.71, at = 2097152 },
      { upto = 41028672, algo = "two_shot_lamport", blocks = 264, us = 13.13, at = 3145728 },
      { upto = 94906256, algo = "one_shot_push", blocks = 132, us = 149.05, at = 50167808 },
      { upto = 189812528, algo = "one_shot_push", blocks = 0, us = 393.42, at = 134217728 },
      { algo = "one_shot_push", blocks = 132, us = 786.45, at = 268435456 },
    },
    zc_rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 4.04, at = 8192 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 8, us = 4.06, at = 16384 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 32, us = 4.34, at = 65536 },
      { upto = 741440, algo = "one_shot_lamport", blocks = 0, us = 4.38, at = 131072 },
      { upto = 1284224, algo = "one_shot_lamport", blocks = 132, us = 6.64, at = 1048576 },
      { upto = 2568464, algo = "one_shot_lamport", blocks = 264, us = 8.27, at = 1572864 },
      { upto = 41028672, algo = "two_shot_lamport", blocks = 264, us = 13.12, at = 3145728 },
      { upto = 58023296, algo = "one_shot_push", blocks = 132, us = 148.95, at = 50167808 },
      { algo = "one_shot_push", blocks = 0, us = 196.86, at = 67108864 },
    },
  },
  {
    device = "NVIDIA H200",
    world = 4,
    dtype = "bf16",
    date = "2026-11-27 09:42 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x4, 4 ranks, d3b93ff (experiments/results/allreduce/allreduce-h200x4-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 5.92, at = 8192 },
      { upto = 23168, algo = "one_shot_lamport", blocks = 8, us = 5.92, at = 16384 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 0, us = 5.94, at = 32768 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 8, us = 5.99, at = 65536 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 32, us = 6.71, at = 131072 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 64, us = 8.12, at = 262144 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 32, us = 9.14, at = 524288 },
      { upto = 2568464, algo = "two_shot_lamport", blocks = 132, us = 13.34, at = 1572864 },
      { upto = 3632368, algo = "two_shot_lamport", blocks = 264, us = 22.85, at = 3145728 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 64, us = 27.32, at = 4194304 },
      { upto = 11863280, algo = "two_shot_lamport", blocks = 132, us = 48.18, at = 8388608 },
      { upto = 189812528, algo = "two_shot_lamport", blocks = 264, us = 86.37, at = 16777216 },
      { algo = "nccl", blocks = 0, us = 1183.89, at = 268435456 },
    },
    zc_rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 5.93, at = 8192 },
      { upto = 23168, algo = "one_shot_lamport", blocks = 8, us = 5.91, at = 16384 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 0, us = 5.94, at = 32768 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 32, us = 6.73, at = 131072 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 64, us = 8.11, at = 262144 },
      { upto = 741440, algo = "two_shot_lamport", blocks = 32, us = 9.15, at = 524288 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 0, us = 11.21, at = 1048576 },
      { upto = 2568464, algo = "two_shot_lamport", blocks = 132, us = 13.33, at = 1572864 },
      { upto = 3632368, algo = "two_shot_push", blocks = 64, us = 22.43, at = 3145728 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 64, us = 27.17, at = 4194304 },
      { upto = 11863280, algo = "two_shot_push", blocks = 0, us = 47.95, at = 8388608 },
      { algo = "two_shot_lamport", blocks = 264, us = 86.23, at = 16777216 },
    },
  },
  {
    device = "NVIDIA H100 80GB HBM3",
    world = 2,
    dtype = "bf16",
    source = "seed 002 (vLLM, H100 TP=2), not measured here",
    provisional = true,
    rows = {
      { upto = 64 * 2 ^ 20, algo = "one_shot_push", blocks = 0 },
      { algo = "nccl", blocks = 0 },
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
