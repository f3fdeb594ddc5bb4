-- The soak (experiments/faults/soak.lua, which scripts/gpu/soak.sh runs on one GPU for 10
-- minutes) on 4 cpu ranks: a short soak of every kind passes and writes its results file
-- (the harness's header, ops of each kind, 0 wrong, the memory samples, the verdict); an
-- error planted into one kind's outputs (x 1.02) fails it with that kind's rows wrong and
-- the others right. The clean run's first pass is one case of each kind (every variant
-- once, at the largest sizes, is the GPU run's: more than 20 s here) and its memory bound
-- is 32 MiB: on the cpu device the tensors and the communicators' shared-memory segments
-- are host memory, whose high-water marks a 20 s run does not all reach in its first
-- pass, and rank 0's store keeps a key per symmetric buffer made (about 1 KiB each, issue
-- 53's soak). scripts/gpu/soak.sh holds the GPU run to 1 MiB.
local H = require "helpers"
local markdown = require "distlab.bench.markdown"

local sh = H.sh

-- rc, output, the results file's text of a soak on 4 cpu ranks
local function soak(args)
  local dir = H.tmpname("-soak")
  local rc, out = H.distlab(string.format("run -n 4 --device cpu experiments/faults/soak.lua --out %s --tag spec %s",
    sh(dir), args), "DISTLAB_JOB_TIMEOUT=240")
  local f = io.open(dir .. "/soak-spec.md", "r")
  local md = f and f:read("*a") or ""
  if f then f:close() end
  local header = markdown.read_header(dir .. "/soak-spec.md")
  os.execute("rm -rf " .. sh(dir))
  return rc, out, md, header
end

-- the row of kind's totals: steps, ops, elements checked, wrong
local function totals(md, kind)
  local s, o, e, w = md:match("| %*%*" .. kind .. "%*%* | %(all%) | (%d+) | (%d+) | (%d+) | (%d+) |")
  return tonumber(s), tonumber(o), tonumber(e), tonumber(w)
end

describe("soak on 4 cpu ranks", function()
  it("20 s of every kind: every result right, memory flat, the results file", function()
    local rc, out, md, header = soak("--duration 20 --warmup 5 --sample 5 --first kinds --tol 32M")
    assert.equal(0, rc, out)
    assert.truthy(md:find("%*%*Verdict: PASSED: 0 wrong, memory flat within 32%.000 MiB from %d+ s on%*%*"), md .. out)
    for _, key in ipairs { "device", "date", "commit", "command", "libraries" } do
      assert.truthy(header and header[key], key .. " missing from the header\n" .. md)
    end
    assert.matches("experiments/faults/soak.lua", header.command)
    for _, kind in ipairs { "allreduce", "ep", "overlap", "cp" } do
      local steps, ops, elements, wrong = totals(md, kind)
      assert.is_true(steps and steps >= 1 and ops >= steps and elements > 0, kind .. "\n" .. md)
      assert.equal(0, wrong, md)
    end
    -- samples every 5 s, or after the step that outlasts 5 s (a loaded host): at 0 and two
    -- judged at least, the warm-up's marked; the growth table
    local samples = select(2, md:gsub("\n| %d+[^|]* | %- | [%d.]+ / [%d.]+ / [%d.]+ %[", ""))
    assert.is_true(samples >= 3, md)
    assert.truthy(md:find("| 0 (warm-up) |", 1, true), md)
    assert.truthy(md:find("| host private (RSS anonymous + shared memory) |", 1, true), md)
    assert.truthy(md:find("| host RSS (reported, not judged) |", 1, true), md)
    -- where the anonymous pages moved, by mapping, every rank
    for r = 0, 3 do assert.truthy(md:find("\n%- rank " .. r .. ": [+-]%d+ KiB anonymous from"), md) end
  end)

  it("--pool: the first pass runs every variant's pooled shapes too, later steps reuse them", function()
    local rc, out, md = soak("--duration 6 --warmup 0 --sample 3 --kinds allreduce --pool 2 --tol 32M")
    assert.equal(0, rc, out)
    local variants = #require("distlab").allreduce.algos
    -- every variant at its largest, then its 2 pooled shapes: 3 steps a variant before judging
    assert.truthy(md:find("every shape of the pool (2 per variant, drawn at the start; every later step picks " ..
      "one of them) (" .. 3 * variants .. " steps)", 1, true), md)
    local steps, _, _, wrong = totals(md, "allreduce")
    assert.is_true(steps > 3 * variants, "the soak stopped in its first pass:\n" .. md)
    assert.equal(0, wrong, md)
    assert.truthy(md:find("%*%*Verdict: PASSED"), md)
  end)

  it("an error planted into the all-reduce's outputs (x 1.02) fails the soak, naming it", function()
    local rc, out, md = soak("--duration 6 --warmup 0 --sample 3 --first kinds --kinds allreduce,ep --plant allreduce")
    assert.equal(1, rc, out)
    assert.truthy(md:find("%*%*Verdict: FAILED: %d+ wrong elements"), md)
    assert.truthy(md:find("PLANTED allreduce", 1, true), md)
    local _, _, _, wrong = totals(md, "allreduce")
    assert.is_true(wrong and wrong > 0, md)
    assert.equal(0, select(4, totals(md, "ep")), md)
    assert.truthy(out:find("soak: data check failed on rank %d of 4: step %d+, allreduce"), out)
  end)
end)
