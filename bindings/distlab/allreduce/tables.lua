-- The all-reduce dispatch tables distlab ships (read by
-- distlab.allreduce.table for algo = "auto" when no tuned table matches;
-- DISTLAB_AR_TABLE and the file dl.allreduce.tune writes come first). rows: the algorithm (and grid;
-- 0 = the kernels' own sizing) for sizes up to `upto` bytes; the last row
-- covers everything larger. zc_rows (none here yet; dl.allreduce.tune writes
-- them): the same for an input in the zero-copy region, run in place.
--
-- NVIDIA H200 at 2 and 4 ranks: the tables dl.allreduce.tune wrote on
-- nvidia-h200-x2 (2026-11-22 12:47, every algorithm, one_shot_lamport with one
-- vector a thread a step and two steps of look-ahead; two_shot_lamport did
-- not exist yet) and nvidia-h200-x4 (2026-11-22 13:16, every algorithm) (a
-- few grids per size, CUDA-graph timing); the sweeps in
-- experiments/results/allreduce-h200x2.md and allreduce-h200x4.md ran with
-- exactly these tables. The other entries are still PROVISIONAL: the H100
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
    date = "2026-11-22 12:47 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x2 (experiments/results/allreduce-h200x2-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot_lamport", blocks = 0, us = 3.73, at = 8192 },
      { upto = 23168, algo = "one_shot_lamport", blocks = 8, us = 3.74, at = 16384 },
      { upto = 46336, algo = "one_shot_lamport", blocks = 16, us = 3.85, at = 32768 },
      { upto = 92672, algo = "one_shot_lamport", blocks = 0, us = 3.96, at = 65536 },
      { upto = 185360, algo = "one_shot_lamport", blocks = 64, us = 4.11, at = 131072 },
      { upto = 370720, algo = "one_shot_lamport", blocks = 32, us = 4.44, at = 262144 },
      { upto = 741440, algo = "one_shot_lamport", blocks = 0, us = 5.25, at = 524288 },
      { upto = 1284224, algo = "one_shot_lamport", blocks = 132, us = 6.71, at = 1048576 },
      { upto = 5931632, algo = "one_shot_lamport", blocks = 264, us = 8.24, at = 1572864 },
      { upto = 11863280, algo = "one_shot_lamport", blocks = 0, us = 29.02, at = 8388608 },
      { algo = "one_shot_push", blocks = 0, us = 56.36, at = 16777216 },
    },
  },
  {
    device = "NVIDIA H200",
    world = 4,
    dtype = "bf16",
    date = "2026-11-22 13:16 UTC",
    source = "dl.allreduce.tune on nvidia-h200-x4 (experiments/results/allreduce-h200x4-tune.csv)",
    rows = {
      { upto = 11584, algo = "one_shot", blocks = 0, us = 5.63, at = 8192 },
      { upto = 23168, algo = "one_shot", blocks = 8, us = 5.45, at = 16384 },
      { upto = 92672, algo = "one_shot", blocks = 16, us = 5.55, at = 32768 },
      { upto = 185360, algo = "one_shot", blocks = 32, us = 6.48, at = 131072 },
      { upto = 370720, algo = "two_shot_lamport", blocks = 0, us = 8.07, at = 262144 },
      { upto = 741440, algo = "two_shot_lamport", blocks = 32, us = 9.11, at = 524288 },
      { upto = 1284224, algo = "two_shot_lamport", blocks = 64, us = 11.09, at = 1048576 },
      { upto = 2568464, algo = "two_shot_lamport", blocks = 132, us = 13.20, at = 1572864 },
      { upto = 3632368, algo = "two_shot_lamport", blocks = 264, us = 22.77, at = 3145728 },
      { upto = 5931632, algo = "two_shot_lamport", blocks = 64, us = 27.28, at = 4194304 },
      { upto = 11863280, algo = "two_shot_push", blocks = 0, us = 51.34, at = 8388608 },
      { algo = "nccl", blocks = 0, us = 96.85, at = 16777216 },
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
