-- The launcher starts N ranks with their environment, and a failing rank ends
-- the whole job with its error and a non-zero exit code.
local H = require "helpers"

local function lines_of(out)
  local t = {}
  for l in out:gmatch("[^\n]+") do if l:match("^rank=") then t[#t + 1] = l end end
  table.sort(t)
  return t
end

describe("distlab run", function()
  for _, n in ipairs({ 2, 4 }) do
    it("starts " .. n .. " cpu ranks with rank, world and job variables", function()
      local rc, out = H.distlab("run -n " .. n .. " --device cpu spec/launcher/ranks.lua")
      assert.equal(0, rc, out)
      local l = lines_of(out)
      assert.equal(n, #l, out)
      local job, port
      for r = 0, n - 1 do
        local rank, world, lr, dev, j, p = l[r + 1]:match("rank=(%d+) world=(%d+) local=(%d+) device=(%S+) job=(%x+) port=(%d+)")
        assert.equal(r, tonumber(rank))
        assert.equal(n, tonumber(world))
        assert.equal(r, tonumber(lr))
        assert.equal("cpu", dev)
        job, port = job or j, port or p
        assert.equal(job, j)
        assert.equal(port, p)
      end
    end)
  end

  it("stops the job when a rank raises an error, and reports it", function()
    local t0 = os.time()
    local rc, out = H.distlab("run -n 4 --device cpu spec/launcher/ranks.lua 2")
    assert.is_true(os.time() - t0 < 30, "the healthy ranks were not stopped")
    assert.equal(1, rc, out)
    assert.truthy(out:find("rank 2 of 4 failed (exit code 1)", 1, true), out)
    assert.truthy(out:find("narrow: elements 3..3 out of range", 1, true), out)
  end)

  it("stops the job when a rank exits early with a code", function()
    local rc, out = H.distlab("run -n 2 --device cpu spec/launcher/ranks.lua 0 exit")
    assert.equal(3, rc, out)
    assert.truthy(out:find("rank 0 of 2 failed (exit code 3)", 1, true), out)
  end)

  it("names the rank that failed first, also when the others fail before it ends", function()
    local rc, out = H.distlab("run -n 3 --device cpu spec/launcher/blame.lua")
    assert.equal(1, rc, out)
    assert.truthy(out:find("distlab run: rank 0 of 3 failed (exit code 1)", 1, true), out)
    assert.truthy(out:find("rank 0's error:\n  [^\n]*rank 0: corrupt input %(the first failure%)"), out)
  end)

  it("leaves no process behind (ranks, timers), however the job ends", function()
    for _, args in ipairs { "-n 3 --device cpu spec/launcher/ranks.lua 1", "-n 2 --device cpu spec/launcher/ranks.lua 0 exit",
      "-n 2 --device cpu --timeout 1 spec/launcher/ranks.lua -1 hang", "-n 3 --device cpu spec/launcher/blame.lua" } do
      -- the launcher in a session of its own: whatever it started is in it
      local p = io.popen(string.format("cd %q && setsid bash -c 'echo SID=$$; exec ./distlab run %s' 2>&1", H.root, args))
      local out = p:read("*a")
      p:close()
      local sid = assert(tonumber(out:match("SID=(%d+)")), out)
      p = io.popen("ps -eo sid=,pid=,args=")
      local left = {}
      for l in p:lines() do
        if tonumber(l:match("^%s*(%d+)")) == sid then left[#left + 1] = l end
      end
      p:close()
      assert.same({}, left, args .. "\n" .. out)
    end
  end)

  it("stops a job that runs past its --timeout", function()
    local t0 = os.time()
    local rc, out = H.distlab("run -n 2 --device cpu --timeout 2 spec/launcher/ranks.lua -1 hang")
    assert.is_true(os.time() - t0 < 15)
    assert.is_true(rc ~= 0, out)
    assert.truthy(out:find("job timed out after 2 s", 1, true), out)
  end)

  it("pretends to be one rank of a large meta job", function()
    local rc, out = H.distlab("run --device meta --world 64 --rank 5 spec/launcher/ranks.lua")
    assert.equal(0, rc, out)
    assert.truthy(out:find("rank=5 world=64 local=0 device=meta", 1, true), out)
  end)

  it("binds rank r to its own cores with --bind FIRST:PER", function()
    local p = io.popen("nproc --all")
    local ncpu = tonumber(p:read("*a")) or 1
    p:close()
    local n = math.min(2, ncpu)
    local rc, out = H.distlab("run -n " .. n .. " --bind 0:1 --device cpu spec/launcher/cores.lua")
    assert.equal(0, rc, out)
    for r = 0, n - 1 do assert.truthy(out:find("rank=" .. r .. " cores=" .. r .. "\n", 1, true), out) end
    if ncpu >= 2 then
      rc, out = H.distlab("run -n 1 --bind 0:2 --device cpu spec/launcher/cores.lua")
      assert.equal(0, rc, out)
      assert.truthy(out:find("rank=0 cores=0-1\n", 1, true), out)
    end
    rc, out = H.distlab("run -n 2 --bind 2 --device cpu spec/launcher/cores.lua")
    assert.equal(2, rc)
    assert.truthy(out:find("--bind needs FIRST:PER", 1, true), out)
    rc, out = H.distlab("run -n 2 --bind 0:100000 --device cpu spec/launcher/cores.lua")
    assert.equal(2, rc)
    assert.truthy(out:find("this host has 0..", 1, true), out)
  end)

  -- a fake nvidia-smi that lists `gpus` GPUs, first on the PATH
  local function fake_gpus(gpus)
    local dir = H.tmpname("-bin")
    os.execute("mkdir -p " .. dir)
    local lines = {}
    for g = 0, gpus - 1 do lines[#lines + 1] = string.format("echo 'GPU %d: Fake GPU (UUID: GPU-%d)'", g, g) end
    H.write(dir .. "/nvidia-smi", "#!/bin/sh\n" .. table.concat(lines, "\n") .. "\n")
    os.execute("chmod +x " .. dir .. "/nvidia-smi")
    return dir, "PATH=" .. dir .. ":$PATH"
  end

  it("places more cuda ranks than GPUs round-robin, and says so once", function()
    local dir, env = fake_gpus(2)
    local rc, out = H.distlab("run -n 5 --device cuda spec/launcher/ranks.lua", env)
    assert.equal(0, rc, out)
    local l = lines_of(out)
    assert.equal(5, #l, out)
    for r = 0, 4 do
      assert.truthy(l[r + 1]:find("rank=" .. r .. " world=5 local=" .. r .. " device=cuda:" .. r % 2 .. " ", 1, true), out)
    end
    local _, notes = out:gsub("5 ranks on 2 GPU%(s%), rank r on cuda:%(r mod 2%)", "")
    assert.equal(1, notes, out)
    assert.truthy(out:find("a correctness mode: timings mean nothing", 1, true), out)
    -- as many ranks as GPUs: a GPU each, by local rank, and nothing said
    rc, out = H.distlab("run -n 2 --device cuda spec/launcher/ranks.lua", env)
    assert.equal(0, rc, out)
    l = lines_of(out)
    assert.truthy(l[1]:find("device=cuda:0 ", 1, true) and l[2]:find("device=cuda:1 ", 1, true), out)
    assert.falsy(out:find("correctness mode", 1, true), out)
    os.execute("rm -rf " .. dir)
  end)

  it("refuses bad arguments", function()
    local rc, out = H.distlab("run -n 0 spec/launcher/ranks.lua")
    assert.equal(2, rc)
    assert.truthy(out:find("-n needs a positive integer", 1, true))
    rc, out = H.distlab("run --device cpu --world 4 spec/launcher/ranks.lua")
    assert.equal(2, rc)
    assert.truthy(out:find("only with --device meta", 1, true))
    rc, out = H.distlab("run nothing_here.lua")
    assert.equal(2, rc)
    assert.truthy(out:find("no such script", 1, true))
  end)
end)

describe("distlab repl", function()
  it("evaluates expressions, statements, multi-line chunks and :commands", function()
    local input = H.write(H.tmpname(".txt"),
      "x = dl.arange(6):view(2, 3)\nx:select(1, 2)\nfor i = 1, 2 do\nprint('line', i)\nend\n{a = 1}\n:help\nx:narrow(1, 9, 1)\n1 +\n2\n:quit\n")
    local rc, out = H.distlab("repl --device cpu < " .. input, "TERM=dumb")
    os.remove(input)
    assert.equal(0, rc, out)
    assert.truthy(out:find("tensor([3, 4, 5], shape=[3], dtype=i64, device=cpu)", 1, true), out)
    assert.truthy(out:find("line\t2", 1, true), out)
    assert.truthy(out:find("{ a = 1 }", 1, true), out)
    assert.truthy(out:find(":mem", 1, true), out)
    assert.truthy(out:find("error: stdin:1: narrow: elements 9..9 out of range", 1, true), out)
    assert.truthy(out:find("\n3\n", 1, true), out)
  end)
end)
