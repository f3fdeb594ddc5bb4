-- Run by spec/launcher_spec.lua under `distlab run -n N`: prints what this rank
-- sees, and fails on request (rank given in arg[1]) to test job teardown.
local dl = require "distlab"
local rank = tonumber(os.getenv("DISTLAB_RANK"))
local fail_rank = tonumber(arg[1] or "-1")
local mode = arg[2] or "error"
if mode == "hang" then
  while true do end
end
if rank == fail_rank then
  if mode == "exit" then os.exit(3) end
  dl.zeros(2):narrow(1, 3, 1) -- a real distlab error
end
if fail_rank >= 0 then
  -- the healthy ranks would run for a long time: the launcher must stop them
  local t0 = os.time()
  while os.time() - t0 < 60 do end
end
io.write(string.format("rank=%s world=%s local=%s device=%s job=%s port=%s\n", os.getenv("DISTLAB_RANK"),
  os.getenv("DISTLAB_WORLD_SIZE"), os.getenv("DISTLAB_LOCAL_RANK"), dl.default_device(),
  os.getenv("DISTLAB_JOB_ID"), os.getenv("MASTER_PORT")))
