-- A rank killed in the middle of an op (spec/comm/kill.lua): every survivor
-- ends with a clear error within a second of the death, whatever it was
-- waiting on (collectives, the custom all-reduce, CP forward and backward,
-- debug mode's store checks, a symmetric buffer's flags, the overlap ops),
-- and the launcher's headline names the rank that died. SPEC_KILL_TRIALS
-- trials per op (4 by default, so CI stays quick; scripts/faults.sh runs 20
-- on cpu, scripts/gpu/faults.sh 20 on one GPU with ranks sharing it),
-- alternately 2 and 3 ranks, the victim the last rank or (every fourth
-- trial) rank 0, which serves the store. SPEC_KILL_DEVICE picks the device
-- (cpu by default). Then a dead rank that its parent never reaps (a zombie,
-- which kill(pid, 0) calls alive).
local H = require "helpers"
local comm_run = H.ranks("comm")

local trials = tonumber(os.getenv("SPEC_KILL_TRIALS") or "") or 4
local device = os.getenv("SPEC_KILL_DEVICE") or "cpu"
local ops = { "collectives", "allreduce", "cp", "debug", "symm", "overlap" }

-- Every survivor's line: {rank, seconds after the death, message}.
local function survivors(out)
  local t = {}
  for r, s, msg in out:gmatch("SURVIVOR (%d+) (%-?[%d.]+) ([^\n]*)") do
    t[#t + 1] = { tonumber(r), tonumber(s), msg }
  end
  return t
end

-- The error names the death: the victim's exit, a rank that gave up after
-- seeing it, or (rank 0 dead) the store it served gone.
local function names_death(msg, victim)
  return msg:find("rank " .. victim .. " %(pid %d+%) has exited") or msg:find("rank %d+ gave up") or
    (victim == 0 and msg:find("did rank 0 exit%?")) or nil
end

-- Or it names the exit of a survivor whose own error names the death: a
-- rank descheduled through both deaths (CI has 2 cores) finds the victim
-- and a survivor that gave up and exited meanwhile dead at one look, and
-- an object that holds no record of why that survivor gave up (it failed
-- in another) can only name it. The launcher's headline names the victim.
local function names_death_or_survivor(msg, victim, s)
  if names_death(msg, victim) then return true end
  local r = tonumber(msg:match("rank (%d+) %(pid %d+%) has exited"))
  for _, x in ipairs(s) do
    if x[1] == r and x[3]:match("^ERR: ") and names_death(x[3], victim) then return true end
  end
  return nil
end

local function trial(n, op, seed)
  local rc, out = comm_run(n, device, "kill.lua", op .. " " .. seed)
  local victim = seed % 4 == 0 and 0 or n - 1
  assert.truthy(out:find("VICTIM " .. victim .. " dies in", 1, true), out)
  local s = survivors(out)
  assert.equal(n - 1, #s, "every survivor reports (seed " .. seed .. "):\n" .. out)
  local worst = 0
  for _, x in ipairs(s) do
    assert.truthy(x[3]:match("^ERR: ") and names_death_or_survivor(x[3], victim, s),
      "a clear error naming the death (seed " .. seed .. "):\n" .. out)
    assert.is_true(x[2] <= 1.0, string.format("rank %d noticed after %.3f s (seed %d):\n%s", x[1], x[2], seed, out))
    worst = math.max(worst, x[2])
  end
  assert.equal(142, rc, out) -- the victim's SIGALRM
  assert.truthy(out:find("distlab run: rank " .. victim .. " of " .. n .. " failed (exit code 142)", 1, true), out)
  return worst
end

describe("a rank killed mid-op on " .. device, function()
  for _, op in ipairs(ops) do
    it(op .. ": every survivor fails within 1 s, the launcher names the dead rank (" .. trials .. " trials)", function()
      local worst = 0
      for seed = 1, trials do worst = math.max(worst, trial(seed % 2 == 0 and 2 or 3, op, seed)) end
      print(string.format("    %s on %s: slowest survivor %.3f s after the death, over %d trials", op, device,
        worst, trials))
    end)
  end
end)

describe("a rank stopped through a death (SIGSTOP, then continued)", function()
  it("finds the victim and a survivor that gave up dead at one look: symm names the survivor and the victim", function()
    -- rank 2 stops rank 0 just before it dies; rank 1 gives up and exits;
    -- rank 0, continued 0.4 s later, finds ranks 1 and 2 dead at once and
    -- names the lowest (unless rank 1 had not exited yet: then rank 2)
    local chained, outs = 0, {}
    for seed = 1, 3 do
      local rc, out = comm_run(3, device, "kill.lua", "symm " .. 2 * seed - 1, "KILL_STOP_RANK0=0.4")
      local s = survivors(out)
      assert.equal(2, #s, out)
      for _, x in ipairs(s) do
        assert.truthy(x[3]:match("^ERR: ") and names_death(x[3], 2), out)
        if x[1] == 0 and x[3]:find("rank 1 (pid", 1, true) then
          assert.truthy(x[3]:find("rank 1 %(pid %d+%) has exited .*; it gave up after rank 2 %(pid %d+%) has exited"), out)
          chained = chained + 1
        end
      end
      assert.equal(142, rc, out)
      outs[#outs + 1] = out
    end
    assert.is_true(chained >= 1, "rank 0 never found both dead at once:\n" .. table.concat(outs, "\n"))
  end)
end)

describe("a dead rank nobody reaps (a zombie)", function()
  it("still counts as gone: its peer fails within 1 s", function()
    -- bash starts the victim (rank 1) and then becomes the survivor (rank 0)
    -- by exec: the survivor is the victim's parent and never waits for it
    for _, op in ipairs { "collectives", "allreduce" } do
      local cmd = string.format("cd %q && DISTLAB_WORLD_SIZE=2 DISTLAB_LOCAL_WORLD_SIZE=2 DISTLAB_DEVICE=cpu " ..
        "DISTLAB_JOB_ID=zombie$$ MASTER_ADDR=127.0.0.1 MASTER_PORT=$((21000 + $$ %% 8000)) " ..
        "bash -c 'DISTLAB_RANK=1 DISTLAB_LOCAL_RANK=1 luajit spec/comm/kill.lua %s 1 & " ..
        "DISTLAB_RANK=0 DISTLAB_LOCAL_RANK=0 exec luajit spec/comm/kill.lua %s 1' 2>&1", H.root, op, op)
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      local s = survivors(out)
      assert.equal(1, #s, out)
      assert.truthy(s[1][3]:find("rank 1 %(pid %d+%) has exited"), out)
      assert.is_true(s[1][2] <= 1.0, out)
    end
  end)
end)
