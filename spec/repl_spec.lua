-- spec/repl_spec.lua — the REPL (bindings/distlab/repl*.lua, repl/) driven
-- through a pseudo-terminal as a person types (spec/repl/pty.lua: keys in,
-- screen out; Ctrl-C is the byte 0x03, which the terminal turns into SIGINT
-- for every process of the session), and the world rebuild it uses
-- (dl.comm.world{new = true}, spec/repl/renew.lua). The same sessions run on
-- cpu and, tagged #gpu / #multigpu, on cuda (ranks sharing one GPU there).
local H = require "helpers"
local pty = require "repl.pty"

-- A REPL session (args after `repl`) in a fresh HOME, its own history file,
-- unless env.HOME names one.
local function start(args, env)
  local e = { TERM = "xterm", HOME = H.tmpname("-home"), INPUTRC = "/dev/null", DISTLAB_JOB_TIMEOUT = "300" }
  for k, v in pairs(env or {}) do e[k] = v end
  os.execute("mkdir -p " .. e.HOME)
  local argv = { H.root .. "/distlab", "repl" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local P = pty.spawn(argv, { env = e, timeout = 60 })
  P.home = e.HOME
  return P
end

-- Ctrl-D: every rank leaves, with exit code 0.
local function finish(P, keep_home)
  P:send("\4")
  local done, status = P:wait(30)
  P:close()
  if not keep_home then os.execute("rm -rf " .. P.home) end
  assert.is_true(done, "the REPL did not end at Ctrl-D:\n" .. P:screen())
  assert.equal(0, status, P:screen())
end

local function sleep(s) os.execute("sleep " .. s) end

-- Waits until every file of `paths` exists (a rank got inside its input).
local function wait_files(paths)
  for _ = 1, 600 do
    local all = true
    for _, p in ipairs(paths) do
      local f = io.open(p)
      if f then f:close() else all = false end
    end
    if all then return end
    sleep(0.05)
  end
  error("no " .. table.concat(paths, ", ") .. " within 30 s")
end

local function read_file(path)
  local f = assert(io.open(path))
  local s = f:read("*a")
  f:close()
  return s
end

local function one_rank(device, tag)
  describe("distlab repl on " .. device .. ", through a terminal" .. tag, function()
    it("Ctrl-C clears the line at the prompt and stops a running loop; values are kept", function()
      local P = start { "--device", device }
      P:expect("dl> ")
      P:send("x = 41\r")
      P:expect("dl> ")
      P:send("half a li")
      sleep(0.3)
      P:send("\3")
      assert.truthy(P:expect("dl> "):find("half a li^C", 1, true))
      P:send("t = dl.zeros(4)\r")
      P:expect("dl> ")
      P:send('io.write("looping\\n") io.flush() while true do x = x + 1; t:add_(1) end\r')
      P:expect("looping")
      sleep(0.5)
      P:send("\3")
      local seen = P:expect("dl> ")
      assert.truthy(seen:find("error: stdin:1: interrupted (Ctrl-C)", 1, true), seen)
      P:send("x > 41, t:tolist()[1] > 0\r") -- what the loop did is kept
      assert.truthy(P:expect("dl> "):find("true\ttrue", 1, true), P:screen())
      P:send("for i = 1, 1e12 do end\r") -- a loop LuaJIT would compile
      sleep(0.5)
      P:send("\3")
      assert.truthy(P:expect("dl> "):find("interrupted (Ctrl-C)", 1, true), P:screen())
      P:send("x + 1 > 42\r")
      assert.truthy(P:expect("dl> "):find("true", 1, true), P:screen())
      finish(P)
    end)

    it("Tab completes globals, fields and methods from the live objects", function()
      local P = start { "--device", device }
      P:expect("dl> ")
      P:send("a_long_name = dl.ones(2, 3)\r")
      P:expect("dl> ")
      P:send("a_lo\t")
      P:expect("a_long_name")
      P:send(":nar\t")
      P:expect(":narrow(")
      P:send("2, 2, 1)\r")
      assert.truthy(P:expect("dl> "):find("shape=[2, 1]", 1, true), P:screen())
      P:send("dl.at\t")
      P:expect("dl.attn")
      P:send(".f\t")
      P:expect(".fwd(")
      P:send("\3")
      P:expect("dl> ")
      P:send("a_long_name.sh\t")
      P:expect("a_long_name.shape")
      P:send("\r")
      assert.truthy(P:expect("dl> "):find("{ 2, 3 }", 1, true), P:screen())
      finish(P)
    end)

    it("?x: a function's and a module's documentation, a tensor, a communicator; _ is the last result", function()
      local P = start { "--device", device }
      P:expect("dl> ")
      P:send("?dl.attn.fwd\r")
      local seen = P:expect("dl> ")
      assert.truthy(seen:find("dl.attn.fwd(q, k, v, opts)    bindings/distlab/attn.lua:", 1, true), seen)
      assert.truthy(seen:find("out, lse[, max_logit] = attn.fwd(q, k, v, opts)", 1, true), seen)
      P:send(":help dl.mem\r")
      seen = P:expect("dl> ")
      assert.truthy(seen:find("module distlab.mem    bindings/distlab/mem.lua", 1, true), seen)
      assert.truthy(seen:find("dl.mem.tag(name, fn) charges every allocation", 1, true), seen)
      P:send("x = dl.arange(12):view(3, 4):transpose(1, 2)\r")
      P:expect("dl> ")
      P:send("?x\r")
      seen = P:expect("dl> ")
      assert.truthy(seen:find("tensor: shape [4, 3], dtype i64, device " .. device, 1, true), seen)
      assert.truthy(seen:find("strides [1, 4] (elements), storage offset 0, not contiguous", 1, true), seen)
      P:send("?world\r")
      seen = P:expect("dl> ")
      assert.truthy(seen:find("configuration:", 1, true), seen)
      assert.truthy(seen:find('backend = "', 1, true) and seen:find("failed = false", 1, true), seen)
      P:send("?dl.C.dl_sigint_take\r")
      assert.truthy(P:expect("dl> "):find("int dl_sigint_take(void);", 1, true), P:screen())
      P:send("?docs\r")
      seen = P:expect("dl> ")
      assert.truthy(seen:find("knobs", 1, true) and seen:find("docs/repl.md", 1, true), seen)
      P:send(":help knobs\r")
      seen = P:expect("dl> ")
      assert.truthy(seen:find("# Knobs", 1, true) and seen:find("`DISTLAB_TIMEOUT`", 1, true), seen)
      P:send("x:size(1) * 10\r")
      assert.truthy(P:expect("dl> "):find("40", 1, true))
      P:send("_ + 2\r")
      assert.truthy(P:expect("dl> "):find("42", 1, true), P:screen())
      P:send("print('no value')\r") -- no result: `_` stays
      P:expect("dl> ")
      P:send("_\r")
      assert.truthy(P:expect("dl> "):find("42", 1, true), P:screen())
      finish(P)
    end)

    it("keeps each line once in ~/.distlab_history, also when the file had duplicates", function()
      local home = H.tmpname("-home")
      os.execute("mkdir -p " .. home)
      H.write(home .. "/.distlab_history", "old = 1\nold = 1\nx = 1\nold = 1\n")
      local P = start({ "--device", device }, { HOME = home })
      P:expect("dl> ")
      for _, l in ipairs { "x = 1", "y = 2", "x = 1", "?x", "x = 1" } do
        P:send(l .. "\r")
        P:expect("dl> ")
      end
      finish(P, true)
      assert.equal("old = 1\ny = 2\n?x\nx = 1\n", read_file(home .. "/.distlab_history"))
      os.execute("rm -rf " .. home)
    end)
  end)
end

-- timeout: DISTLAB_TIMEOUT of the sessions where a collective is left waiting
local function several_ranks(device, tag, n, timeout)
  local prompt = string.format("dl[%d]> ", n)
  describe(string.format("distlab repl -n %d on %s, through a terminal%s", n, device, tag), function()
    it(":help and the other :commands on every rank, :ranks and :on, an error on one rank", function()
      local P = start { "-n", tostring(n), "--device", device }
      P:expect(prompt)
      P:send(":help\r")
      local seen = P:expect(prompt)
      assert.truthy(seen:find("distlab REPL — `dl` is require", 1, true), seen)
      assert.falsy(seen:find("[0] ", 1, true), seen) -- every rank printed the same: once
      P:send("x = rank * 10\r")
      P:expect(prompt)
      P:send(":on 1 x = nil + 1\r")
      seen = P:expect(prompt)
      assert.truthy(seen:find("[1] error: stdin:1: attempt to perform arithmetic on a nil value", 1, true), seen)
      P:send("x\r")
      seen = P:expect(prompt)
      assert.truthy(seen:find("[0] 0\n", 1, true) and seen:find("[1] 10\n", 1, true), seen)
      P:send(":ranks 1\r")
      P:expect("dl[1 of " .. n .. "]> ")
      P:send("x + 1\r")
      assert.truthy(P:expect("dl[1 of " .. n .. "]> "):find("[1] 11", 1, true), P:screen())
      P:send(":ranks all\r")
      P:expect(prompt)
      P:send("?x\r")
      seen = P:expect(prompt)
      assert.truthy(seen:find("[0] number: 0", 1, true), seen)
      P:send(":nothing\r")
      assert.truthy(P:expect(prompt):find("unknown command :nothing (:help)", 1, true), P:screen())
      P:send("half a li\3")
      P:expect(prompt)
      P:send("x\r") -- a Ctrl-C at the prompt stops nothing on the other ranks
      seen = P:expect(prompt)
      assert.truthy(seen:find("[1] 10\n", 1, true), seen)
      finish(P)
    end)

    it("output mostly alike prints once, the lines that differ per rank; io.write's text ends its line", function()
      local P = start { "-n", tostring(n), "--device", device }
      P:expect(prompt)
      P:send("?world\r")
      local seen = P:expect(prompt)
      local _, configs = seen:gsub("configuration:", "")
      assert.equal(1, configs, seen) -- issue 54: every line twice, as one line differs
      for r = 0, n - 1 do
        assert.truthy(seen:find(string.format("[%d]   rank = %d\n", r, r), 1, true), seen)
      end
      P:send("io.write('abc')\r")
      seen = P:expect(prompt)
      assert.truthy(seen:find("\nabc\r?\n", 1) and not seen:find("abcfile", 1, true), seen)
      P:send("io.write(rank == 0 and 'x' or 'yz') x = 1\r")
      seen = P:expect(prompt)
      local others = {} -- ranks 1..n-1 print alike: one line, labelled with all of them ("[1,2,3] yz")
      for r = 1, n - 1 do others[#others + 1] = tostring(r) end
      assert.truthy(seen:find("[0] x\n", 1, true) and seen:find("[" .. table.concat(others, ",") .. "] yz\n", 1, true),
        seen)
      finish(P)
    end)

    it("Ctrl-C stops a loop on every rank; each keeps its values", function()
      local P = start { "-n", tostring(n), "--device", device }
      P:expect(prompt)
      local dir = H.tmpname("-started")
      os.execute("mkdir -p " .. dir)
      P:send(string.format('x = 0; io.open("%s/" .. rank, "w"):close() while true do x = x + 1 end\r', dir))
      local files = {}
      for r = 0, n - 1 do files[#files + 1] = dir .. "/" .. r end
      wait_files(files)
      sleep(0.3)
      P:send("\3")
      local seen = P:expect(prompt)
      assert.truthy(seen:find("error: stdin:1: interrupted (Ctrl-C)", 1, true), seen)
      assert.falsy(seen:find("[1]", 1, true), seen)
      P:send("x > 0\r")
      seen = P:expect(prompt)
      assert.truthy(seen:find("true", 1, true) and not seen:find("false", 1, true), seen)
      os.execute("rm -rf " .. dir)
      finish(P)
    end)

    -- with the comm's debug check on (always on for ipc) the lone rank waits in a store get,
    -- which the abort cannot reach: the second Ctrl-C ends that wait itself
    for _, debug in ipairs { "0", "1" } do
    it("a collective on one rank: Ctrl-C twice aborts the world at once (debug check " .. debug ..
      "), :reset makes a new one that works", function()
      local P = start({ "-n", tostring(n), "--device", device },
        { DISTLAB_TIMEOUT = tostring(timeout * 5), DISTLAB_COMM_DEBUG = debug })
      local t0 = os.time()
      P:expect(prompt)
      P:send("t = dl.ones(4)\r")
      P:expect(prompt)
      P:send("world:all_reduce(t):tolist()[1]\r")
      assert.truthy(P:expect(prompt):find("\n" .. n .. "\n", 1, true), P:screen())
      local mark = H.tmpname("-in")
      P:send(string.format(':on 1 io.open("%s", "w"):close() world:all_reduce(t) t:tolist()\r', mark))
      wait_files { mark }
      sleep(0.3)
      P:send("\3")
      P:expect("Ctrl-C again aborts the world communicator")
      P:send("\3")
      local seen = P:expect(prompt)
      assert.truthy(seen:find("[1] error: ", 1, true), seen)
      -- the idle rank's abort ends a wait on shared memory; a store wait ends by itself, and the
      -- idle rank, which got the same Ctrl-C, aborts its world all the same
      if debug == "1" then assert.truthy(seen:find("stopped by Ctrl-C (twice)", 1, true), seen) end
      assert.truthy(seen:find("is aborted, so waits in it end", 1, true), seen)
      assert.falsy(seen:find("timed out", 1, true) or seen:find("did not arrive within", 1, true), seen)
      assert.is_true(os.time() - t0 < timeout * 5 - 1, "the wait ran to its timeout")
      assert.truthy(seen:find(":reset makes a new one on every rank", 1, true), seen)
      -- a second Ctrl-C that reached the idle rank after the input ended clears its prompt's
      -- line and shows a new prompt: read past it
      sleep(0.3)
      P:send('"sy" .. "nc"\r')
      P:expect("\n\"sync\"\n")
      P:expect(prompt)
      P:send("world:all_reduce(t)\r") -- refused at once on every rank: the world has failed
      seen = P:expect(prompt)
      assert.truthy(seen:find("[0] error: ", 1, true) and seen:find("failed", 1, true), seen)
      P:send(":reset\r")
      seen = P:expect(prompt)
      assert.truthy(seen:find("a new world: comm 'w%d+' %(%a+, " .. n .. " ranks, %a+%)\n"), seen)
      P:send("t:fill_(rank + 1) return world:all_reduce(t):tolist()[1]\r")
      assert.truthy(P:expect(prompt):find("\n" .. n * (n + 1) / 2 .. "\n", 1, true), P:screen())
      os.remove(mark)
      finish(P)
    end)
    end

    it("a collective on one rank that times out, then :reset", function()
      local P = start({ "-n", tostring(n), "--device", device }, { DISTLAB_TIMEOUT = tostring(timeout) })
      P:expect(prompt)
      P:send("t = dl.ones(4)\r")
      P:expect(prompt)
      P:send(":on 1 world:all_reduce(t) t:tolist()\r")
      local seen = P:expect(prompt)
      assert.truthy(seen:find("[1] error: ", 1, true), seen)
      P:send(":reset\r")
      P:expect("a new world")
      P:expect(prompt)
      P:send("world:all_reduce(t):tolist()[1]\r")
      assert.truthy(P:expect(prompt):find("\n" .. n .. "\n", 1, true), P:screen())
      finish(P)
    end)
  end)
end

describe("repl completion and help, in process", function()
  local complete = require "distlab.repl.complete"
  local help = require "distlab.repl.help"
  local dl = require "distlab"

  it("completes from live objects without calling an __index that may be collective", function()
    local env = { dl = dl, s = "text", t = dl.ones(2), _hidden = 1, fun_value = print }
    setmetatable(env, { __index = function() error("the completer called __index") end })
    local world = { rank = 0, all_reduce = function() end }
    local extra = { names = { "world" }, get = function(k) return k == "world" and world or nil end }
    local function has(word, want)
      local got = complete.candidates(word, env, extra)
      for _, w in ipairs(got) do if w == want then return true end end
      error(string.format("%q: no %q among %s", word, want, table.concat(got, " ")))
    end
    has("dl.at", "dl.attn")                   -- a module not loaded yet
    has("dl.allreduce.ru", "dl.allreduce.run(")
    has("t:nar", "t:narrow(")
    has("t.sh", "t.shape")
    has("s:up", "s:upper(")
    has("wor", "world")
    has("world:all", "world:all_reduce(")
    has("fun", "function")
    has("fun", "fun_value(")
    has("_h", "_hidden")
    assert.same({}, complete.candidates("h", env, extra))          -- _hidden only after "_"
    assert.same({}, complete.candidates("world:ra", env, extra))   -- ":" offers methods only
    assert.same({}, complete.candidates("nothing.x", env, extra))
  end)

  it("describes tensors, functions, modules and C functions of the ABI", function()
    local x = dl.arange(6):view(2, 3)
    local text = help.describe(x:narrow(2, 2, 2), "y")
    assert.truthy(text:find("shape [2, 2], dtype i64, device cpu", 1, true), text)
    assert.truthy(text:find("strides [3, 1] (elements), storage offset 1, not contiguous", 1, true), text)
    text = help.describe(dl.mem.report, "dl.mem.report")
    assert.truthy(text:find("dl.mem.report(", 1, true) and text:find("bindings/distlab/mem.lua:", 1, true), text)
    text = help.describe(dl.comm, "dl.comm")
    assert.truthy(text:find("module distlab.comm", 1, true) and text:find("world{new = true", 1, true), text)
    text = help.describe(dl.C.dl_store_delete_prefix, "dl.C.dl_store_delete_prefix")
    assert.truthy(text:find("Deletes every key that begins with prefix", 1, true), text)
  end)

  it("?docs lists the pages of docs/, ?docs.<name> and :help <name> show one, ?DISTLAB_X a knob", function()
    local docs = require "distlab.repl.docs"
    local none = function() return false end
    local names = {}
    for _, pg in ipairs(docs.pages()) do names[pg.name] = pg end
    for _, want in ipairs { "modules", "knobs", "gpu", "repl", "launcher", "benchmarks", "checks" } do
      assert.truthy(names[want], "no docs/" .. want .. ".md")
    end
    assert.equal("The REPL: `./distlab repl`", names.repl.title)
    local index = docs.lookup("docs", none)
    for name, pg in pairs(names) do
      assert.truthy(index:find(name, 1, true) and index:find(pg.path, 1, true), index)
    end
    local page = docs.lookup("docs.knobs", none)
    assert.truthy(page:find("^docs/knobs.md\n\n# Knobs"), page)
    assert.equal(page, docs.lookup("knobs", none))
    -- a global of the name shadows the page; docs itself is reserved
    assert.is_nil(docs.lookup("knobs", function(n) return n == "knobs" end))
    assert.equal(index, docs.lookup("docs", function() return true end))
    assert.truthy(docs.lookup("docs.nothing", none):find("no page 'nothing' in docs/\n", 1, true))
    assert.is_nil(docs.lookup("nothing", none))
    assert.is_nil(docs.lookup("dl.attn", none))
    local knob = docs.lookup("DISTLAB_TIMEOUT", none)
    assert.truthy(knob:find("| variable |", 1, true) and knob:find("| `DISTLAB_TIMEOUT` | 120 |", 1, true), knob)
    assert.truthy(docs.lookup("DISTLAB_" .. "NOTHING", none):find("not in docs/knobs.md", 1, true))
  end)
end)

-- docs/repl.md shows two sessions as spec/repl/transcript.lua typed them:
-- type them again and compare, but for the build in the banner and the line
-- numbers of file:line (the code moves under them).
describe("docs/repl.md's sessions", function()
  local function normal(text)
    local out = {}
    for l in (text .. "\n"):gmatch("([^\n]*)\n") do
      l = l:gsub("^(distlab REPL )%b()", "%1(build)"):gsub("([%w_]+%.%a+):%d+", "%1:N"):gsub("%s+$", "")
      out[#out + 1] = l
    end
    while #out > 0 and (out[#out] == "" or out[#out]:match("^dl%S*>$")) do out[#out] = nil end
    return table.concat(out, "\n")
  end
  local f = assert(io.open(H.root .. "/docs/repl.md"))
  local doc = f:read("*a")
  f:close()
  local blocks = {}
  for b in doc:gmatch("```\n(distlab REPL .-)```") do blocks[#blocks + 1] = b end

  for i, ranks in ipairs { 1, 2 } do
    it("on " .. ranks .. " rank(s), typed again, as the page shows it", function()
      assert.truthy(blocks[i], "docs/repl.md has " .. #blocks .. " sessions")
      local p = io.popen(string.format("cd %q && luajit spec/repl/transcript.lua cpu %d 2>&1; echo \"__rc=$?\"", H.root, ranks))
      local out = p:read("*a")
      p:close()
      assert.truthy(out:find("__rc=0", 1, true), out)
      assert.equal(normal(blocks[i]), normal(out:gsub("__rc=%d+%s*$", "")))
    end)
  end
end)

one_rank("cpu", "")
several_ranks("cpu", "", 2, 3)
one_rank("cuda", " #gpu")
several_ranks("cuda", " #multigpu", H.gpu_ranks, 10)

describe("dl.comm.world{new = true}", function()
  for _, n in ipairs { 1, 2, 3 } do
    it(n .. " rank(s): a failed world is aborted and replaced under one agreed name, its keys deleted", function()
      local rc, out = H.distlab("run -n " .. n .. " --device cpu spec/repl/renew.lua")
      assert.equal(0, rc, out)
      local _, k = out:gsub("renew ok: rank %d, w %-> w%d", "")
      assert.equal(n, k, out)
    end)
  end
end)
