-- Tracing (distlab.trace): spans, marks and hooks in one process, wrapped ops
-- that report themselves and are put back at stop, and, with 2 and 4 cpu
-- ranks (spec/trace/ranks.lua), one merged Chrome-trace JSON that Python's
-- json module parses, with spans for every rank and every stream and the
-- arguments given, plus its PNG where gnuplot exists.
local dl = require "distlab"
local H = require "helpers"

-- python3 reads the JSON and prints one line per (pid, tid) with its span names
local SUMMARY = [[
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
lanes = {}
for e in ev:
    if e["ph"] in ("X", "i"):
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
        lanes.setdefault((e["pid"], e["tid"]), set()).add(e["name"])
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
for (pid, tid), ns in sorted(lanes.items()):
    print("LANE %d %d %s | %s" % (pid, tid, names.get((pid, tid), "?"), ",".join(sorted(ns))))
print("RANKS %d" % len(d["otherData"]["ranks"]))
print("TIMES %s" % d["otherData"]["ranks"][0]["times"])
hooks = [e["args"] for e in ev if e["name"] == "hook.step"]
if hooks:  # only the traces that made one (the cuda spec's has side.step alone)
    print("ARGS %s" % json.dumps(hooks[0]))
]]

local function summary(path)
  local py = H.write(H.tmpname(".py"), SUMMARY)
  local p = io.popen(string.format("python3 %q %q 2>&1; echo __rc=$?", py, path))
  local out = p:read("*a")
  p:close()
  os.remove(py)
  assert.truthy(out:find("__rc=0"), "python3 could not read " .. path .. ":\n" .. out)
  return out
end

describe("dl.trace in one process", function()
  it("records spans, marks and hook spans, and writes JSON that Python parses", function()
    assert.is_false(dl.trace.active())
    assert.is_nil(dl.trace.begin("off"))
    dl.trace.finish(nil)
    assert.equal(5, dl.trace.span("off", function(a) return a + 2 end, nil, 3))
    dl.trace.start()
    assert.is_true(dl.trace.active())
    local a, b = dl.trace.span("outer", function(u, v) return u * 2, v end, { bytes = 8, shape = { 2, 3 } }, 21, "x")
    assert.equal(42, a)
    assert.equal("x", b)
    local t = dl.trace.begin("hook.step", { step = 1 })
    dl.gemm(dl.randn({ 8, 8 }, { dtype = "bf16" }), dl.randn({ 8, 8 }, { dtype = "bf16" }))
    dl.trace.finish(t)
    dl.trace.mark("here")
    local ok, err = pcall(dl.trace.span, "failing", function() error("boom") end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom"), err)
    local path = H.tmpname(".json")
    local p, spans = dl.trace.stop { path = path, png = false }
    assert.equal(path, p)
    assert.is_false(dl.trace.active())
    local names = {}
    for _, s in ipairs(spans) do names[#names + 1] = s.name end
    assert.same({ "outer", "hook.step", "gemm", "here", "failing" }, names)
    for _, s in ipairs(spans) do
      assert.is_true(s.ts >= 0 and s.dur >= 0, s.name)
    end
    assert.is_true(spans[3].ts >= spans[2].ts and spans[3].ts + spans[3].dur <= spans[2].ts + spans[2].dur + 1,
      "the gemm inside the hook's span")
    assert.same({ "bf16[8, 8]", "bf16[8, 8]" }, spans[3].args.shapes)
    local out = summary(path)
    os.remove(path)
    assert.truthy(out:find("LANE 0 0 default stream %(cpu%) | failing,gemm,here,hook.step,outer"), out)
    assert.truthy(out:find("TIMES host times", 1, true), out)
  end)

  it("puts the wrapped functions back at stop, and refuses misuse", function()
    local gemm, grouped = dl.gemm.run, dl.gemm.grouped
    dl.trace.start()
    assert.are_not.equal(gemm, dl.gemm.run)
    local ok, err = pcall(dl.trace.start)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("a trace is running already"), err)
    -- errors of a wrapped op still point at the caller's line
    ok, err = pcall(function() dl.gemm(dl.randn({ 4, 4 }, { dtype = "bf16" }), dl.randn({ 5, 4 }, { dtype = "bf16" })) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("trace_spec.lua:%d+:"), err)
    dl.trace.stop { path = H.tmpname(".json"), png = false }
    assert.equal(gemm, dl.gemm.run)
    assert.equal(grouped, dl.gemm.grouped)
    ok, err = pcall(dl.trace.stop)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("no trace is running"), err)
    ok, err = pcall(dl.trace.start, { wrapp = false })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown option wrapp"), err)
    dl.trace.start { wrap = false }
    assert.equal(gemm, dl.gemm.run)
    local path, spans = dl.trace.stop { path = H.tmpname(".json"), png = false }
    os.remove(path)
    assert.same({}, spans)
  end)

  it("writes what it is given as JSON: strings with quotes and newlines, nested tables, numbers", function()
    local j = dl.trace.json({ a = "x\"y\n", b = { 1, 2.5, { c = true } }, n = 0 / 0 })
    assert.equal('{"a":"x\\"y\\n","b":[1,2.500,{"c":true}],"n":null}', j)
  end)
end)

describe("dl.trace over cpu ranks", function()
  for _, n in ipairs { 2, 4 } do
    it("merges " .. n .. " ranks into one JSON with spans for every rank and stream", function()
      local path = H.tmpname(".json")
      local png = H.has_command("gnuplot") and H.tmpname(".png") or nil
      local rc, out = H.distlab(string.format("run -n %d --device cpu spec/trace/ranks.lua %s %s", n, path, png or ""))
      assert.equal(0, rc, out)
      assert.truthy(out:find("RANK 0 path=" .. path, 1, true), out)
      local s = summary(path)
      assert.truthy(s:find("RANKS " .. n, 1, true), s)
      for r = 0, n - 1 do
        assert.truthy(s:find(string.format("LANE %d 0 default stream %%(cpu%%) | [^\n]*comm%%.barrier[^\n]*gemm,[^\n]*"
          .. "gemm%%.grouped[^\n]*hook%%.step[^\n]*step%%.compute", r)), s)
        assert.truthy(s:find(string.format("LANE %d 1 stream 1 %%(cpu%%) | comm%%.all_reduce,step%%.comm\n", r)), s)
      end
      assert.truthy(s:find('ARGS {"note": "a schedule\'s step \\"quoted\\""}', 1, true), s)
      if png then
        local f = io.open(png, "rb")
        assert.truthy(f, "no PNG at " .. png .. ":\n" .. out)
        assert.equal("\137PNG", f:read(4))
        f:close()
        os.remove(png)
        -- the same JSON drawn again here, as a GPU host's trace is (dl.trace.draw)
        local again = H.tmpname(".png")
        assert.equal(again, dl.trace.draw(path, again))
        f = assert(io.open(again, "rb"))
        assert.equal("\137PNG", f:read(4))
        f:close()
        os.remove(again)
      else
        local got, why = dl.trace.draw(path, H.tmpname(".png"))
        assert.is_nil(got)
        assert.truthy(tostring(why):find("gnuplot", 1, true), why)
      end
      os.remove(path)
    end)
  end

  it("draw refuses a file that is not a trace, naming it", function()
    local path = H.tmpname(".json")
    local f = assert(io.open(path, "w"))
    f:write('{"spans": []}')
    f:close()
    H.failed("is not a trace JSON (no traceEvents)", "trace_spec.lua", pcall(dl.trace.draw, path))
    os.remove(path)
  end)
end)

describe("dl.trace on cuda #gpu", function()
  local D = "cuda:0"

  it("puts device times of two streams on the host clock, and the issue times on the host track", function()
    local side = dl.stream(D)
    local a = dl.randn({ 2048, 2048 }, { dtype = "bf16", device = D })
    dl.synchronize(D) -- drawn on the default stream, read on two others
    dl.trace.start { device = D }
    dl.with_stream(dl.stream(D), function()
      for _ = 1, 3 do dl.gemm(a, a) end
    end)
    dl.with_stream(side, function()
      dl.trace.span("side.step", function() dl.gemm(a, a) end, { step = 1 })
    end)
    local path = H.tmpname(".json")
    local p, spans = dl.trace.stop { path = path, png = false }
    assert.equal(path, p)
    for _, s in ipairs(spans) do
      assert.is_true(s.dur > 0, s.name .. " took no device time")
      assert.truthy(s.host, s.name .. " has no issue times")
      -- the device ran it after the host issued it (within the anchor's bound and the events' resolution)
      assert.is_true(s.ts + 50 >= s.host[1], string.format("%s ran at %.1f us before its issue at %.1f", s.name, s.ts,
        s.host[1]))
    end
    local out = summary(path)
    os.remove(path)
    assert.truthy(out:find("LANE 0 1 stream 1 %(cuda:0%) | gemm\n"), out)
    assert.truthy(out:find("LANE 0 2 stream 2 %(cuda:0%) | gemm,side.step\n"), out)
    assert.truthy(out:find("LANE 0 1000 host %(issue times%) | gemm,side.step\n"), out)
    assert.truthy(out:find("TIMES device events", 1, true), out)
  end)

  it("merges " .. H.gpu_ranks .. " ranks on cuda (ranks may share the GPU)", function()
    local path = H.tmpname(".json")
    local rc, out = H.distlab(string.format("run -n %d --device cuda spec/trace/ranks.lua %s", H.gpu_ranks, path))
    assert.equal(0, rc, out)
    local s = summary(path)
    os.remove(path)
    assert.truthy(s:find("RANKS " .. H.gpu_ranks, 1, true), s)
    for r = 0, H.gpu_ranks - 1 do
      assert.truthy(s:find(string.format("LANE %d 1 stream 1 %%(cuda:%%d%%) | comm%%.all_reduce,step%%.comm\n", r)), s)
      assert.truthy(s:find(string.format("LANE %d 1000 host", r)), s)
    end
  end)
end)
