-- The all-reduce dispatch tables distlab ships (read by distlab.allreduce
-- for algo = "auto" when no tuned table matches; DISTLAB_AR_TABLE and the
-- file dl.allreduce.tune writes come first). rows: the algorithm (and grid;
-- 0 = the kernels' own sizing) for sizes up to `upto` bytes; the last row
-- covers everything larger.
--
-- NVIDIA H200 at 2 ranks: measured (experiments/results/allreduce-h200x2.md,
-- 2026-11-22, vLLM's graph method, every algorithm at its default grid):
-- one_shot_push is the fastest from 1 MB to 1 GB and at 8 KB, one_shot from
-- 16 KB to 512 KB (the two tie at 512 KB). The other entries are still
-- PROVISIONAL. The H100 two-rank rows follow seed 002 (vLLM's sweep on H100, TP=2: one-stage
-- custom all-reduce fastest up to 64 MB, NCCL even at 64 MB), with the push
-- one-shot, which needs no copy into the staging buffer, in its place; the
-- generic rows for 4, 6 and 8 ranks follow the same seed's TP=4/6 tables
-- (one-stage up to ~1 MB, two-stage to 16-32 MB, then NCCL) and its B200
-- TP=8 table. `scripts/gpu/allreduce.sh` measures the real ones with
-- dl.allreduce.tune; replace these entries with its output.
return {
  {
    device = "NVIDIA H200",
    world = 2,
    dtype = "bf16",
    date = "2026-11-22",
    source = "experiments/results/allreduce-h200x2.md (measured sweep, default grids)",
    rows = {
      { upto = 8 * 1024, algo = "one_shot_push", blocks = 0 },
      { upto = 512 * 1024, algo = "one_shot", blocks = 0 },
      { algo = "one_shot_push", blocks = 0 },
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
