-- The benchmark harness (distlab.bench): options, size lists, stats and
-- timing, busbw factors, the stdout table, CSV (read back by Python's csv
-- module, and Python's CSV read back by ours), the markdown header, and one
-- benchmark end to end on 2 cpu ranks writing to a temporary --out folder.
local dl = require "distlab"
local H = require "helpers"
local bench = dl.bench

local function err(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local sh, run, read = H.sh, H.run, H.read

local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local function unhex(s) return (s:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)) end

-- Python's csv module reads path; returns its rows (lists of strings).
local PY_READ = [[
import csv, sys
with open(sys.argv[1], newline="") as f:
    for row in csv.reader(f):
        print(" ".join("x" + c.encode().hex() for c in row))
]]
local function python_rows(path)
  local rc, out = run("python3 -c " .. sh(PY_READ) .. " " .. sh(path))
  assert.equal(0, rc, "python3's csv module could not read " .. path .. ":\n" .. out)
  local rows = {}
  for line in out:gmatch("[^\n]+") do
    local r = {}
    for c in line:gmatch("x(%x*)") do r[#r + 1] = unhex(c) end
    rows[#rows + 1] = r
  end
  return rows
end

-- Cells that need quoting, and some that do not.
local CELLS = {
  { "shape", "name", "note", "n", "x" },
  { "(32, 8192)", "all_gather, overlap", 'say "hi"', "3", "" },
  { "a\nb", "a2a, overlap", "line\r\nbreak", "-1", "nan" },
  { " padded ", '""', "plain", "0.5", "," },
}

describe("bench options", function()
  local p = bench.options.new({
    { "sizes", "sizes", "8..64", "bytes" },
    { "iters", "int", 20, "timed calls", short = "n" },
    { "b", "size", 8, "smallest size" },
    { "ratio", "number", 0.5, "a number" },
    { "ops", "list", "a,b", "ops", values = { "a", "b", "c" } },
    { "layout", "choice", "bshd", "layout", values = { "bshd", "thd" } },
    { "raw", "flag", nil, "a flag" },
    { "report-only", "string", nil, "a file" },
  }, { program = "t", usage = "t [options]", about = "A test." })

  it("gives typed defaults and reads every form of argument", function()
    local o, given = p:parse({})
    assert.same({ 8, 16, 32, 64 }, o.sizes)
    assert.equal(20, o.iters)
    assert.equal(8, o.b)
    assert.same({ "a", "b" }, o.ops)
    assert.is_false(o.raw)
    assert.is_nil(o.report_only)
    assert.same({}, given)
    o, given = p:parse({ "--sizes", "1K,2K", "-n", "5", "-b", "64K", "--ratio=2.5", "--ops=c,a", "--layout", "thd",
      "--raw", "--report-only", "f.csv" })
    assert.same({ 1024, 2048 }, o.sizes)
    assert.equal(5, o.iters)
    assert.equal(65536, o.b)
    assert.equal(2.5, o.ratio)
    assert.same({ "c", "a" }, o.ops)
    assert.equal("thd", o.layout)
    assert.is_true(o.raw)
    assert.equal("f.csv", o.report_only)
    assert.is_true(given.report_only and given.iters and true)
    assert.is_true(p:parse({ "--help" }).help)
  end)

  it("refuses what it does not know, naming the option", function()
    assert.matches("t: unknown option %-%-bogus %(%-%-help lists the options%)", err(p.parse, p, { "--bogus", "1" }))
    assert.matches("unknown option %-x", err(p.parse, p, { "-x" }))
    assert.matches("%-%-iters takes an integer, got '1.5'", err(p.parse, p, { "--iters", "1.5" }))
    assert.matches("%-%-iters needs a value", err(p.parse, p, { "--iters" }))
    assert.matches("%-%-ops takes a list of a, b, c, got 'a,d'", err(p.parse, p, { "--ops", "a,d" }))
    assert.matches("%-%-layout takes one of bshd, thd, got 'sbhd'", err(p.parse, p, { "--layout", "sbhd" }))
    assert.matches("%-%-b takes a size", err(p.parse, p, { "-b", "8X" }))
    assert.matches("%-%-sizes takes a size list", err(p.parse, p, { "--sizes", "1K..8" }))
    assert.matches("%-%-raw takes no value", err(p.parse, p, { "--raw=yes" }))
    assert.matches("unexpected argument 'out'", err(p.parse, p, { "out" }))
    assert.matches("declared twice", err(bench.options.new, { { "a", "int" }, { "a", "int" } }))
    assert.matches("unknown type", err(bench.options.new, { { "a", "float" } }))
  end)

  it("reads counts as positive integers and refuses anything else, naming the option", function()
    local q = bench.options.new({ { "B", "counts", "1,32", "tokens" } }, { program = "t" })
    assert.same({ 1, 32 }, q:parse({}).B)
    assert.same({ 4, 128, 512 }, q:parse({ "--B", "4,128,512" }).B)
    for _, bad in ipairs { "0", "-2", "1.5", "x", "4,y", "," } do
      assert.matches("%-%-B takes a comma%-separated list of positive integers", err(q.parse, q, { "--B", bad }))
    end
  end)

  it("lists every option with its default in --help", function()
    local text = p:help()
    assert.matches("^usage: t %[options%]\nA test%.", text)
    assert.matches("%-n, %-%-iters INT +timed calls %(default 20%)", text)
    assert.matches("\n +%-b SIZE +smallest size %(default 8%)", text)
    assert.matches("%-%-ops LIST +ops %(one of a, b, c; default a,b%)", text)
    assert.matches("%-%-raw +a flag\n", text)
    assert.matches("%-h, %-%-help", text)
  end)
end)

describe("bench sizes", function()
  local S = bench.sizes
  it("parses lists, suffixes and ranges", function()
    assert.same({ 8192, 1048576, 67108864 }, S.parse("8K,1M,64M"))
    assert.same({ 8, 16, 32, 64, 128 }, S.parse("8..128"))
    assert.same({ 8192, 32768, 131072, 524288 }, S.parse("8K..1M:4"))
    assert.same({ 8, 16, 1024, 3 }, S.parse("8..16, 1KiB 3"))
    assert.same({ 2 ^ 30, 2 ^ 40 }, S.parse("1g,1TB"))
    assert.same({ 8, 16 }, S.parse("8..31"))
    assert.same({ 5 }, S.parse(5))
    assert.equal(65536, S.parse_one("64K"))
    assert.same({ 4, 8, 16 }, S.range(4, 16))
  end)
  it("refuses malformed sizes with an example", function()
    for _, bad in ipairs({ "8X", "1.5M", "-8", "8iB", "", "1..", "..8", "64..8", "8..64:1", "8..64:x", "8:64" }) do
      assert.matches("e%.g%. 8, 64K", err(S.parse, bad))
    end
  end)
  it("prints sizes for tables", function()
    assert.equal("8 KB", S.human(8192))
    assert.equal("512 KB", S.human(524288))
    assert.equal("1.50 MB", S.human(1.5 * 2 ^ 20))
    assert.equal("1.00 GB", S.human(2 ^ 30))
    assert.equal("512 B", S.human(512))
    assert.equal("64K", S.short(65536))
    assert.equal("1G", S.short(2 ^ 30))
    assert.equal("1000", S.short(1000))
  end)
end)

describe("bench stats and timing", function()
  it("median, min, max, mean", function()
    local s = bench.stats({ 5, 1, 3 })
    assert.same({ 1, 3, 5 }, s.times)
    assert.equal(3, s.median)
    assert.equal(1, s.min)
    assert.equal(5, s.max)
    assert.equal(3, s.mean)
    assert.equal(3, s.iters)
    assert.equal(2.5, bench.stats({ 4, 1, 2, 3 }).median)
    assert.matches("no times", err(bench.stats, {}))
  end)

  it("an anchor's figure from its runs: the mean, or the best where the runs are more than 5% apart", function()
    local v, wide = bench.anchor({ 100, 104 }, "high")
    assert.equal(102, v)
    assert.is_false(wide)
    v, wide = bench.anchor({ 316, 454 }, "high") -- FA4's d 64 causal 4k forward in one call
    assert.equal(454, v)
    assert.is_true(wide)
    v, wide = bench.anchor({ 1.3, 1.0 }, "low") -- times: the shortest
    assert.equal(1.0, v)
    assert.is_true(wide)
    assert.equal(2.0, (bench.anchor({ nil, 2.0 }, "low"))) -- a run without the figure is skipped
    assert.is_nil((bench.anchor({}, "high")))
    assert.matches('better must be "high" or "low"', err(bench.anchor, { 1 }, "fast"))
  end)

  it("times a function with events, a graph replay, a loop and the host clock (cpu)", function()
    local t = dl.zeros({ 16 }, { device = "cpu" })
    local calls = 0
    local fn = function()
      calls = calls + 1
      t:add_(1)
    end
    local e = bench.timing.events(fn, { warmup = 2, iters = 5, device = "cpu" })
    assert.equal(5, e.iters)
    assert.equal(7, calls)
    assert.is_true(e.min <= e.median and e.median <= e.max and e.min >= 0)
    -- on cpu a time is the host's, and the stats say so (issue 54: dl.bench said nothing of it)
    assert.equal("host time per call on cpu (no device events: the work runs in the call)", e.method)
    assert.matches("^median %S+ ms %(min %S+, max %S+%) over 5, host time per call on cpu", tostring(e))
    calls = 0
    local before = 0
    local g = bench.timing.graph(fn, { ops = 4, warmup = 2, replays = 3, device = "cpu",
      before = function() before = before + 1 end })
    assert.equal(3, g.iters)
    assert.equal(4 * (2 + 3), calls) -- cpu: capture records nothing, each replay calls the ops
    assert.equal(1, before)
    assert.matches("^host time per call on cpu", g.method)
    calls = 0
    local dev_us, host_us = bench.timing.loop_once(fn, 10, { device = "cpu" })
    assert.equal(10, calls)
    assert.is_true(dev_us >= 0 and host_us >= 0)
    calls = 0
    local syncs = 0
    local hst = bench.timing.host(fn, { warmup = 3, batch = 4, batches = 5, sync = function() syncs = syncs + 1 end })
    assert.equal(5, hst.iters)
    assert.equal(3 + 20, calls)
    assert.equal(6, syncs)
    assert.equal(t:narrow(1, 1, 1):item(), 7 + 20 + 10 + 23)
    assert.matches("iters must be an integer >= 1", err(bench.timing.events, fn, { iters = 0 }))
    assert.matches("min_ms must be a number >= 0", err(bench.timing.events, fn, { min_ms = "1" }))
  end)

  it("fills warm_ms and min_ms with calls, from a first estimate", function()
    local calls = 0
    local spin = function() -- about 2 ms of host time a call
      calls = calls + 1
      local t0 = tonumber(dl.now_us())
      while tonumber(dl.now_us()) - t0 < 2000 do end
    end
    local e = bench.timing.events(spin, { warmup = 1, iters = 2, warm_ms = 20, min_ms = 40, device = "cpu" })
    -- est >= 2 ms: warm-up <= 10 calls and >= 1; timed >= 2 and <= 20, and the timed work fills 40 ms
    assert.is_true(e.iters >= 2 and e.iters <= 20, tostring(e.iters))
    assert.is_true(e.iters * e.median >= 40 * 0.5, string.format("%d x %.3f ms", e.iters, e.median))
    assert.is_true(calls >= 5 + 1 + e.iters and calls <= 5 + 10 + e.iters, tostring(calls))
    calls = 0
    e = bench.timing.events(spin, { warmup = 1, iters = 4, min_ms = 0, device = "cpu" })
    assert.equal(4, e.iters) -- the floor holds
    assert.equal(2.5, bench.timing.over_ranks(nil, 2.5))
    assert.same({ 1, 2 }, bench.timing.over_ranks(nil, { 1, 2 }, "sum"))
  end)

  it("dl.bench and graph.bench keep their old calls", function()
    local t = dl.zeros({ 4 }, { device = "cpu" })
    local r = dl.bench(function() t:add_(1) end, { warmup = 1, iters = 4, device = "cpu" })
    assert.equal(4, r.iters)
    assert.equal(4, require("distlab.bench").bench(function() end, { iters = 4, device = "cpu" }).iters)
    assert.equal(3, dl.graph.bench(function() t:add_(1) end, { ops = 2, warmup = 1, replays = 3, device = "cpu" }).iters)
  end)
end)

describe("bench busbw", function()
  it("has nccl-tests' factors", function()
    local B = bench.busbw
    assert.equal(1, B.factor("all_reduce", 2))
    assert.equal(1.75, B.factor("all_reduce", 8))
    assert.equal(0.75, B.factor("all_gather", 4))
    assert.equal(0.75, B.factor("reduce_scatter", 4))
    assert.equal(0.875, B.factor("all_to_all", 8))
    for _, op in ipairs({ "broadcast", "reduce", "send", "recv", "sendrecv" }) do assert.equal(1, B.factor(op, 8)) end
    assert.equal(0, B.factor("all_gather", 1))
    assert.equal(100, B.algbw(1e6, 10)) -- 1 MB in 10 us: 100 GB/s
    assert.equal(150, B.busbw("all_reduce", 4, 1e6, 10))
    assert.matches("no nccl%-tests factor for gather", err(B.factor, "gather", 2))
  end)
end)

describe("bench table", function()
  it("prints an nccl-tests-style header and aligned rows", function()
    local lines = {}
    local out = { write = function(_, ...) for i = 1, select("#", ...) do lines[#lines + 1] = select(i, ...) end end,
      flush = function() end }
    local t = bench.table.new({ { "size", "%8d", unit = "(B)" }, { "op", "%-10s" }, { "time", "%8.2f", unit = "(us)" },
      { "#wrong", "%6d" } }, { out = out })
    t:header("a title")
    t:row({ 8, "all_reduce", 1.234, 0 })
    t:row({ size = 16, op = "x", time = 0 / 0 })
    local text = table.concat(lines)
    assert.equal(table.concat({
      "# a title",
      "#   size op             time #wrong",
      "#    (B)                (us)       ",
      "       8 all_reduce     1.23      0",
      "      16 x               nan      -", "" }, "\n"), text)
    local quiet = bench.table.new({ { "a", "%d" } }, { out = out, quiet = true })
    quiet:row({ 1 })
    assert.equal(text, table.concat(lines))
  end)
end)

describe("bench csv", function()
  local C = bench.csv
  it("quotes only what must be quoted", function()
    assert.equal("(32, 8192)", C.parse(C.line({ "(32, 8192)" }))[1][1])
    assert.equal('"(32, 8192)","a ""b""",plain,3,1.5,\n', C.line({ "(32, 8192)", 'a "b"', "plain", 3, 1.5, nil }, 6))
    assert.equal("1,,3\n", C.line({ 1, nil, 3 }))
    assert.same({ { "a", "b" }, { "1", "" }, { "x,y", 'q"' } }, C.parse('a,b\r\n1,\n"x,y","q"""'))
    assert.matches("never closed", err(C.parse, '"abc'))
    assert.matches("inside an unquoted field", err(C.parse, 'a"b,c'))
  end)

  it("writes what Python's csv module reads back cell for cell", function()
    local path = H.tmpname(".csv")
    local w = C.writer(path, CELLS[1])
    for i = 2, #CELLS do w:row(CELLS[i]) end
    w:row({ shape = "(1, 2)", name = "by name", n = 7 })
    w:close()
    local rows = python_rows(path)
    assert.equal(#CELLS + 1, #rows)
    for i = 1, #CELLS do assert.same(CELLS[i], rows[i]) end
    assert.same({ "(1, 2)", "by name", "", "7", "" }, rows[#rows])
    local head, recs = C.read(path)
    assert.same(CELLS[1], head)
    assert.equal("a2a, overlap", recs[2].name)
    assert.equal("line\r\nbreak", recs[2].note)
    os.remove(path)
  end)

  it("reads what Python's csv module writes", function()
    local path = H.tmpname(".csv")
    local args = {}
    for _, r in ipairs(CELLS) do
      local cells = {}
      for i, c in ipairs(r) do cells[i] = hex(c) end
      args[#args + 1] = sh(table.concat(cells, ":"))
    end
    local script = [[
import csv, sys
with open(sys.argv[1], "w", newline="") as f:
    w = csv.writer(f)
    for a in sys.argv[2:]:
        w.writerow([bytes.fromhex(c).decode() for c in a.split(":")])
]]
    local rc, out = run("python3 -c " .. sh(script) .. " " .. sh(path) .. " " .. table.concat(args, " "))
    assert.equal(0, rc, out)
    local head, recs = C.read(path)
    assert.same(CELLS[1], head)
    for i = 2, #CELLS do
      for k, name in ipairs(CELLS[1]) do assert.equal(CELLS[i][k], recs[i - 1][name]) end
    end
    assert.is_nil(C.number("nan"))
    assert.equal(0.5, C.number("0.5"))
    os.remove(path)
  end)
end)

describe("bench markdown", function()
  local M = bench.markdown
  it("heads a results file with device, date, commit and command", function()
    local info = M.run_info({ device = "cpu", command = "./distlab run -n 2 --device cpu x.lua --out 'a b'" })
    assert.equal("cpu", info.device)
    assert.matches("^%d%d%d%d%-%d%d%-%d%d %d%d:%d%d UTC$", info.date)
    local rc, described = run("git -C " .. sh(dl.root) .. " describe --always --dirty")
    if rc == 0 and os.getenv("DISTLAB_COMMIT") == nil then assert.equal(described:gsub("%s+$", ""), info.commit) end
    local path = H.tmpname(".md")
    M.write(path, M.header("A title", info, { "method: x", "- knob: y" }))
    local text = read(path)
    assert.matches("^# A title\n\n%- device: cpu\n%- date: [^\n]+ UTC\n%- commit: `[^`\n]+`\n%- command: `%./distlab run %-n 2 " ..
      "%-%-device cpu x%.lua %-%-out 'a b'`\n%- ran as: `[^\n]+`\n%- libraries: [^\n]+\n%- method: x\n%- knob: y\n$", text)
    -- the command given (a wrapper's words) is the command; this process's own line is kept beside it
    assert.equal(M.command(), info.ran_as)
    assert.is_nil(M.run_info({ device = "cpu" }).ran_as)
    assert.equal(M.command(), M.run_info({ device = "cpu" }).command)
    local back = M.read_header(path)
    assert.same({ title = "A title", device = "cpu", date = info.date, commit = info.commit, command = info.command,
      libraries = M.libraries() }, back)
    assert.matches("needs device, date, commit and command", err(M.header, "t", { device = "cpu" }))
    os.remove(path)
  end)

  it("rebuilds the command that ran this process", function()
    local c = M.command({ [0] = dl.root .. "/experiments/comm/comm_bench.lua", "-b", "8", "--device-name", "NVIDIA H200" })
    assert.matches("experiments/comm/comm_bench%.lua %-b 8 %-%-device%-name 'NVIDIA H200'$", c)
    assert.is_nil(c:find(dl.root, 1, true))
  end)

  it("records the variables that change a run, and no others", function()
    for _, k in ipairs({ "DISTLAB_AR_TABLE", "DISTLAB_CUDNN", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES",
      "CUDA_LAUNCH_BLOCKING", "CUDNN_LOGLEVEL_DBG", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_LOG_LEVEL", "LD_LIBRARY_PATH" }) do
      assert.is_true(M.recorded(k), k)
    end
    for _, k in ipairs({ "DISTLAB_RANK", "DISTLAB_ROOT", "DISTLAB_JOB_ID", "HOME", "PATH", "LD_PRELOAD_X", "XCUDA_Y" }) do
      assert.is_false(M.recorded(k), k)
    end
    local rc, out = run("env CUDNN_SPEC_X=1 LD_LIBRARY_PATH=/nowhere NCCL_SPEC_Y='a b' luajit -e " ..
      sh("package.path = " .. string.format("%q", dl.root .. "/bindings/?.lua;" .. dl.root .. "/bindings/?/init.lua;")
        .. " .. package.path; io.write(require('distlab').bench.markdown.command({ [0] = 'x.lua', '--y' }))"))
    assert.equal(0, rc, out)
    assert.matches("CUDNN_SPEC_X=1 ", out, 1, true)
    assert.matches("LD_LIBRARY_PATH=/nowhere ", out, 1, true)
    assert.matches("NCCL_SPEC_Y='a b' ", out, 1, true)
    assert.matches("luajit x%.lua %-%-y$", out)
  end)

  it("lists the libraries loaded: CUDA runtime and driver, NCCL, cuDNN, cuBLASLt, 'not loaded' for the others", function()
    local line = M.libraries()
    assert.matches("^CUDA runtime [^;]+; NCCL [^;]+; cuDNN [^;]+; cuBLASLt [^;]+$", line)
    -- nothing is opened to find them: a library opened after the first look shows up in the next
    local ffi = require "ffi"
    if line:match("NCCL not loaded") then
      local h = ffi.C.dlopen("libnccl.so.2", 2) -- RTLD_NOW; kept open (the process may load it for good later)
      if h ~= nil then assert.matches("; NCCL %d+%.%d+%.%d+ %(/[^)]*libnccl[^)]*%);", M.libraries()) end
    end
    if not package.loaded["distlab.gemm"] or dl.gemm.stats().version == 0 then
      assert.matches("cuBLASLt not loaded$", M.libraries())
    end
    -- a header given the line (torch_common.py's, or a wrapper's) writes it as it is
    local lines = M.header("t", { device = "cpu", date = "d", commit = "c", command = "x", libraries = "torch 9" })
    assert.equal("- libraries: torch 9", lines[7])
  end)

  it("experiments/torch_common.py heads, writes and times the PyTorch anchors as distlab.bench does", function()
    -- its own tests (no torch needed): the header lines, the recorded variables, CSV cells, the mean of
    -- runs, the timing methods on the host clock, and every *_torch.py answering --help
    local rc, out = run("python3 " .. sh(dl.root .. "/experiments/test_torch_common.py"))
    if rc == 127 then return pending("no python3 here") end
    assert.equal(0, rc, out)
    assert.matches("\n%d+ passed, 0 failed\n", out)
  end)

  it("makes tables whose cells cannot break them", function()
    assert.same({ "| a | b |", "|---|---:|", "| x\\|y | - |" }, M.table({ "a", "b" }, { { "x|y", nil } }))
    assert.equal("`` a`b ``", M.code("a`b"))
  end)
end)

describe("bench harness end to end on 2 cpu ranks", function()
  it("comm_bench writes a CSV that Python reads and markdown naming device, date, commit, command", function()
    local dir = H.tmpname("-bench")
    local args = "-b 8 -e 1K --ops all_reduce,all_gather --tag spec --out " .. dir
    local rc, out = H.distlab("run -n 2 --device cpu experiments/comm/comm_bench.lua " .. args)
    assert.equal(0, rc, out)
    assert.matches("#%s+size%s+count%s+type%s+op%s+time%s+algbw%s+busbw%s+#wrong", out)
    local rows = python_rows(dir .. "/comm-spec.csv")
    assert.same({ "impl", "op", "bytes", "count", "dtype", "iters", "time_us", "algbw_GBps", "busbw_GBps", "wrong",
      "host_us", "raw_us", "raw_host_us" }, rows[1])
    assert.equal(1 + 2 * 8, #rows) -- 8 B .. 1 KiB doubling, two ops
    for i = 2, #rows do
      assert.equal(13, #rows[i])
      assert.equal("0", rows[i][10])
      assert.is_true(tonumber(rows[i][7]) > 0)
    end
    local head = bench.markdown.read_header(dir .. "/comm-spec.md")
    assert.equal("cpu x 2 (shm backend)", head.device)
    assert.matches("UTC$", head.date)
    assert.truthy(head.commit and #head.commit > 0)
    -- the DISTLAB_* variables set for the run come first (the spec helper sets DISTLAB_JOB_TIMEOUT)
    local want = "./distlab run -n 2 --device cpu experiments/comm/comm_bench.lua " .. args
    local prefix = head.command:sub(1, #head.command - #want)
    assert.equal(want, head.command:sub(#prefix + 1))
    assert.matches("DISTLAB_JOB_TIMEOUT=%d+ ", prefix)
    assert.is_nil((prefix:gsub("[%w_]+=%S+ ", "")):match("%S"), head.command)
    run("rm -rf " .. sh(dir))
  end)

  it("--help exits 0, a bad option exits 2 with its error", function()
    local rc, out = H.distlab("run -n 2 --device cpu experiments/comm/comm_bench.lua --help")
    assert.equal(0, rc, out)
    assert.matches("usage: %./distlab run", out)
    assert.matches("%-%-out DIR", out)
    rc, out = H.distlab("run -n 2 --device cpu experiments/comm/comm_bench.lua --ops all_reduce,bogus")
    assert.equal(2, rc, out)
    assert.matches("comm_bench: option %-%-ops takes a list of all_reduce", out)
  end)

  it("wrong data after timing end the run with exit code 1", function()
    local rc, out = H.distlab("run -n 2 --device cpu spec/bench/wrong.lua --wrong 3")
    assert.equal(1, rc, out)
    assert.matches("wrong_bench: 6 wrong elements", out)
    assert.is_nil(out:find("not reached", 1, true))
    rc, out = H.distlab("run -n 2 --device cpu spec/bench/wrong.lua --wrong 0")
    assert.equal(0, rc, out)
    assert.matches("checked: 0 wrong over 2 ranks", out)
  end)

  it("a count from C (an int64_t, as a count read from a C struct) is a count too", function()
    local rc, out = H.distlab("run -n 2 --device cpu spec/bench/wrong.lua --wrong 2 --int64")
    assert.equal(1, rc, out)
    assert.matches("wrong_bench: 4 wrong elements", out)
    rc, out = H.distlab("run -n 2 --device cpu spec/bench/wrong.lua --wrong 0 --int64")
    assert.equal(0, rc, out)
    assert.matches("checked: 0 wrong over 2 ranks", out)
  end)
end)

describe("allreduce_sweep on 2 cpu ranks", function()
  it("says its cpu method (host time, no CUDA graph) in the markdown and on the plot's axis", function()
    local dir = H.tmpname("")
    assert.equal(0, (os.execute("mkdir -p " .. dir .. "/bin")))
    -- a gnuplot that keeps the script it was given
    H.write(dir .. "/bin/gnuplot", "#!/bin/sh\ncat > " .. dir .. "/plot.gp\n")
    os.execute("chmod +x " .. dir .. "/bin/gnuplot")
    local rc, out = H.distlab("run -n 2 --device cpu experiments/allreduce/allreduce_sweep.lua --quick --plot --out "
      .. dir, "PATH=" .. dir .. "/bin:$PATH")
    local md = io.open(dir .. "/allreduce-cpux2.md"):read("*a")
    local gp = io.open(dir .. "/plot.gp"):read("*a")
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.truthy(md:find("no graphs on cpu: a replay calls 10 back-to-back all-reduces (host time)", 1, true), md)
    assert.truthy(gp:find('set ylabel "us per all-reduce (host time, 10 calls a replay, median)"', 1, true), gp)
    assert.is_nil(gp:find("CUDA graph", 1, true))
  end)
end)

describe("bench harness says how long a run takes", function()
  it("prints case i/N with the time so far and left on stderr (--progress 0: every case)", function()
    local dir = H.tmpname("")
    local rc, out = H.distlab("run -n 2 --device cpu experiments/allreduce/allreduce_sweep.lua --quick --progress 0 --out "
      .. dir)
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.matches("allreduce_sweep: case 1/2 %(8 KB%), %d+ s so far\n", out)
    assert.matches("allreduce_sweep: case 2/2 %(64 KB%), %d+ s so far, about %d+ s left\n", out)
    rc, out = H.distlab("run -n 2 --device cpu experiments/allreduce/allreduce_sweep.lua --quick --out " .. dir)
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.is_nil(out:find("case 1/2", 1, true), "a run shorter than --progress's 10 s says nothing of its cases")
  end)

  it("on cpu warns when the ranks outnumber the cores", function()
    -- --bind 0:1: each rank may run on one core (its affinity, which nproc reads)
    local dir = H.tmpname("")
    local rc, out = H.distlab("run -n 2 --bind 0:1 --device cpu spec/bench/wrong.lua --wrong 0 --out " .. dir)
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.truthy(out:find("wrong_bench: 2 ranks on 1 core of this host", 1, true), out)
    rc, out = H.distlab("run -n 1 --device cpu spec/bench/wrong.lua --wrong 0 --out " .. dir)
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.is_nil(out:find("of this host: the ranks take turns", 1, true), out)
  end)
end)
