-- dl.attn with backend = "cudnn" (cuDNN's fused attention; core/ops/attn/
-- attn_cudnn.c, cudnn_sdpa.cpp) and "auto", and dl.attn.backends.
-- On cuda (#gpu): every case of spec/attn_ref.lua (layouts bshd/sbhd/thd,
-- masks, windows, GQA/MQA, d_qk != d_v, thd with zero and odd lengths and
-- padded offsets not starting at 0, NaN rows between sequences) forward and
-- backward with max_logit, against the fp64 cpu twin on the same inputs
-- (forward through a f32 accumulator, so the reference is not rounded to
-- bf16): element-wise with TransformerEngine's tolerance and normwise
-- ||got - ref|| / ||ref|| <= 1e-2 (bf16), 2e-3 (f16), 1e-5 for lse (fp32
-- stats). A call cuDNN refuses must fail with its reason under "cudnn" and
-- give ours' result under "auto" (the spec prints which cases were refused).
-- On cpu: the errors and what backends() says.
local dl = require "distlab"
local H = require "helpers"
local R = require "attn_ref"

local SEED, with, build, on, opts, clamped = R.SEED, R.with, R.build, R.on, R.opts, R.clamped
local NORM = { bf16 = 1e-2, f16 = 2e-3, lse = 1e-5 }

-- nil, or what failed: element-wise (TE's tolerance) or normwise.
local function differs(ref, got, tol, norm, what)
  local rep = dl.mismatch_report(got, ref, tol, tol, 4)
  if rep then return what .. ": " .. rep end
  local e = dl.rel_err(got, ref)
  if not (e <= norm) then return string.format("%s: normwise error %.3g > %.3g", what, e, norm) end
end

-- fwd + bwd with `backend` on cuda:0 against the cpu twin; nil when all match.
local function run_case(c, backend)
  local x = build(c)
  local y = on(x, "cuda:0")
  local out, lse, ml = dl.attn.fwd(y.q, y.k, y.v, opts(y, { return_max_logit = true, backend = backend }))
  local dout = clamped(out.shape, c.dtype, x.qgaps)
  local dq, dk, dv = dl.attn.bwd(dout:to("cuda:0"), y.q, y.k, y.v, out, lse, opts(y, { backend = backend }))
  local acc = dl.attn.accumulator(x.q, x.v, { layout = c.layout })
  local _, rl, rm = dl.attn.fwd(x.q, x.k, x.v, opts(x, { accumulate = acc, return_max_logit = true }))
  local rq, rk, rv = dl.attn.bwd(dout, x.q, x.k, x.v, out:cpu(), lse:cpu(), opts(x))
  local tol, norm = R.TOL[c.dtype], NORM[c.dtype]
  local bad = differs(acc.out, out, tol, norm, "out") or differs(rl, lse, tol, NORM.lse, "lse") or
    differs(rm, ml, tol, NORM.lse, "max_logit") or differs(rq, dq, tol, norm, "dq") or
    differs(rk, dk, tol, norm, "dk") or differs(rv, dv, tol, norm, "dv")
  if bad then return bad end
  R.assert_rows_zero(out, x.qgaps)
  R.assert_rows_zero(dq, x.qgaps)
  R.assert_rows_zero(dk, x.kgaps)
  R.assert_rows_zero(dv, x.kgaps)
end

describe(string.format("attn backend cudnn on cuda:0 (seed %d) #gpu", SEED), function()
  -- a build without cuDNN's frontend (a GPU host without a registry, .deps/cudnn-frontend not
  -- carried) has no cudnn backend: its specs are skipped with the reason (this runs where
  -- busted lists the specs too, so it must not touch a GPU)
  local info = dl.attn.cudnn_info()
  local missing = info.header_version == 0 and info.path or nil
  -- where it cannot run, every spec below is listed as skipped (the first with the reason)
  local spec_it, it = it, it
  if missing then
    local said = false
    it = function(name)
      pending(name .. (said and " (skipped: no cudnn backend here)" or " (skipped: " .. missing .. ")"))
      said = true
    end
    spec_it("a call with backend \"cudnn\" says why it cannot run; \"auto\" runs ours", function()
      local x = on(build(with(R.TINY.bshd, { dtype = "bf16" })), "cuda:0")
      assert.error_matches(function() dl.attn.fwd(x.q, x.k, x.v, opts(x, { backend = "cudnn" })) end,
        "attn.fwd: backend \"cudnn\" cannot run this call: " .. missing, 1, true)
      local got = dl.attn.fwd(x.q, x.k, x.v, opts(x, { backend = "auto" }))
      assert.tensor_near(dl.attn.fwd(x.q, x.k, x.v, opts(x)), got, 0, 0)
    end)
  end
  local refused = {}
  local function case(c, label)
    it(label .. R.describe_case(c), function()
      local x = on(build(c), "cuda:0")
      local b = dl.attn.backends(x.q, x.k, x.v, opts(x, { backend = "cudnn", return_max_logit = true }))
      if (b.fwd == "cudnn" or b.fwd == "ours") and (b.bwd == "cudnn" or b.bwd == "ours") then
        -- "ours" under "cudnn": no keys, the result is fixed (out 0, lse -inf) and ours writes it
        local bad = run_case(c, "cudnn")
        assert(not bad, bad)
      else
        -- refused: "cudnn" says why, "auto" runs ours and is right
        refused[#refused + 1] = R.describe_case(c) .. ": " .. (b.fwd and b.bwd_why or b.fwd_why)
        local dir = b.fwd and "bwd" or "fwd"
        assert.error_matches(function() run_case(c, "cudnn") end,
          "attn." .. dir .. ": backend \"cudnn\" cannot run this call", 1, true)
        local bad = run_case(c, "auto")
        assert(not bad, bad)
      end
    end)
  end
  for _, c in ipairs(R.cases(false)) do case(c, "") end
  for _, c in ipairs(R.cases(true)) do case(c, "beyond a tile: ") end

  it("lists the configurations cuDNN refused", function()
    print(string.format("\ncudnn refused %d configuration(s)%s", #refused, #refused > 0 and ":" or ""))
    for _, r in ipairs(refused) do print("  " .. r) end
    local i = dl.attn.cudnn_info()
    print(string.format("cudnn: %s (version %d, headers %d, frontend %d); %d plans built in %.0f ms, %d calls from the cache",
      i.path, i.version, i.header_version, i.frontend_version, i.builds, i.build_ms, i.hits))
    assert.is_true(i.version >= 90000)
  end)

  it("fails the normwise check on a planted 2% error", function()
    local c = with(R.TINY.bshd, { dtype = "bf16", sq = 64, skv = 64, mask = "causal" })
    local x = build(c)
    local y = on(x, "cuda:0")
    local out = dl.attn.fwd(y.q, y.k, y.v, opts(y, { backend = "cudnn" }))
    local acc = dl.attn.accumulator(x.q, x.v)
    dl.attn.fwd(x.q, x.k, x.v, opts(x, { accumulate = acc }))
    assert.is_nil(differs(acc.out, out, 2.5e-2, NORM.bf16, "out"))
    assert.is_not_nil(differs(acc.out, out:f32():mul_(1.02), 1, NORM.bf16, "out"))
  end)

  it("accumulates gradients, runs all-gather CP steps through padded offsets, caches plans", function()
    local c = with(R.TINY.thd, { dtype = "bf16", mask = "causal_bottom_right" })
    local x = build(c)
    local y = on(x, "cuda:0")
    local o = opts(y, { backend = "cudnn" })
    local out, lse = dl.attn.fwd(y.q, y.k, y.v, o)
    local dout = clamped(out.shape, "bf16", x.qgaps):to("cuda:0")
    local dq, dk, dv = dl.attn.bwd(dout, y.q, y.k, y.v, out, lse, o)
    local builds = dl.attn.cudnn_info().builds
    local aq = dl.full(dq.shape, 0.5, { dtype = "bf16", device = "cuda:0" })
    local ak, av = dl.zeros(dk.shape, { dtype = "bf16", device = "cuda:0" }), dl.zeros(dv.shape, { dtype = "bf16", device = "cuda:0" })
    dl.attn.bwd(dout, y.q, y.k, y.v, out, lse, with(o, { dq = aq, dk = ak, dv = av, accumulate_grads = true }))
    assert.equal(builds, dl.attn.cudnn_info().builds) -- the same plan, from the cache
    local want = dq:f64():add_(0.5)
    for _, g in ipairs(x.qgaps) do want:narrow(1, g + 1, 1):fill_(0.5) end
    assert.tensor_near(want, aq, 2.5e-2, 2.5e-2)
    assert.tensor_near(dk, ak, 0, 0)
    assert.tensor_near(dv, av, 0, 0)
  end)

  it("backends: cudnn where it runs; ours for the fused merge under auto", function()
    local q = dl.randn({ 2, 128, 4, 64 }, { dtype = "bf16", device = "cuda:0" })
    local b = dl.attn.backends(q, q, q, { backend = "auto", mask = "causal" })
    assert.equal("cudnn", b.fwd)
    assert.equal("cudnn", b.bwd)
    local acc = dl.attn.accumulator(q, q)
    b = dl.attn.backends(q, q, q, { backend = "auto", accumulate = acc })
    assert.equal("ours", b.fwd)
    assert.matches("fused merge", b.fwd_why)
    assert.error_matches(function() dl.attn.fwd(q, q, q, { backend = "cudnn", accumulate = acc }) end,
      "backend \"cudnn\" cannot run this call: accumulate (the fused merge)", 1, true)
    local o1 = dl.attn.fwd(q, q, q, { backend = "auto", accumulate = dl.attn.accumulator(q, q) })
    local o2 = dl.attn.fwd(q, q, q, {})
    assert.tensor_near(o2, o1, 2.5e-2, 2.5e-2)
  end)
end)

describe("attn backends on cpu and meta", function()
  local q = dl.zeros({ 1, 8, 2, 16 }, "bf16")
  it("refuses cudnn on cpu, naming the option; auto runs ours", function()
    assert.error_matches(function() dl.attn.fwd(q, q, q, { backend = "cudnn" }) end,
      "attn.fwd: backend \"cudnn\" cannot run this call: q is on cpu; cuDNN runs on cuda only", 1, true)
    local out, lse = dl.attn.fwd(q, q, q)
    assert.error_matches(function() dl.attn.bwd(out, q, q, q, out, lse, { backend = "cudnn" }) end,
      "attn.bwd: backend \"cudnn\" cannot run this call", 1, true)
    local o2 = dl.attn.fwd(q, q, q, { backend = "auto" })
    assert.tensor_near(out, o2, 0, 0)
    assert.error_matches(function() dl.attn.fwd(q, q, q, { backend = "cuDNN" }) end,
      "backend cuDNN is not ours, cudnn or auto", 1, true)
  end)

  it("says which backend runs and why", function()
    local b = dl.attn.backends(q, q, q, { backend = "cudnn" })
    assert.is_false(b.fwd)
    assert.is_false(b.bwd)
    assert.matches("cuda only", b.fwd_why)
    b = dl.attn.backends(q, q, q, { backend = "auto" })
    assert.equal("ours", b.fwd)
    b = dl.attn.backends(q, q, q, {})
    assert.equal("ours", b.fwd)
    assert.matches("ours", b.fwd_why)
    local none = dl.zeros({ 1, 0, 2, 16 }, "bf16")
    b = dl.attn.backends(q, none, none, { backend = "cudnn" })
    assert.equal("ours", b.fwd) -- no keys: nothing to attend, the result is fixed
    assert.is_string(b.cudnn.path)
  end)

  -- A host's libcudnn candidates, faked under a sysroot (DISTLAB_CUDNN_SYSROOT): empty files
  -- where the pick looks, with the files it reads versions from (core/ops/attn/cudnn_lib.c).
  -- kinds: "system" (9.14.0, a deb's versioned file), "toolkit" (9.10.2, from its header),
  -- "wheel" (PyTorch's 9.19.0), "pinned" (scripts/fetch-cudnn-lib.sh's 9.28.1.4, unpacked).
  local function fake_host(kinds)
    local root = H.tmpname("")
    local site = root .. "/opt/torch/.venv/lib/python3.12/site-packages"
    local pinned = root .. dl.root .. "/.deps/cudnn-lib"
    local sh = { "set -e" }
    for _, k in ipairs(kinds) do
      if k == "system" then
        sh[#sh + 1] = "mkdir -p " .. root .. "/usr/lib/x86_64-linux-gnu && cd " .. root .. "/usr/lib/x86_64-linux-gnu" ..
          " && touch libcudnn.so.9.14.0 && ln -s libcudnn.so.9.14.0 libcudnn.so.9"
      elseif k == "toolkit" then -- an unversioned file, its version in ../include/cudnn_version.h
        sh[#sh + 1] = "mkdir -p " .. root .. "/usr/local/cuda/lib64 " .. root .. "/usr/local/cuda/include && touch " ..
          root .. "/usr/local/cuda/lib64/libcudnn.so.9 && printf '#define CUDNN_MAJOR 9\\n#define CUDNN_MINOR 10\\n" ..
          "#define CUDNN_PATCHLEVEL 2\\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100)\\n' > " ..
          root .. "/usr/local/cuda/include/cudnn_version.h"
      elseif k == "wheel" then
        sh[#sh + 1] = "mkdir -p " .. site .. "/nvidia/cudnn/lib " .. site .. "/nvidia_cudnn_cu13-9.19.0.56.dist-info" ..
          " && touch " .. site .. "/nvidia/cudnn/lib/libcudnn.so.9"
      elseif k == "pinned" then
        sh[#sh + 1] = "mkdir -p " .. pinned .. "/lib && touch " .. pinned .. "/lib/libcudnn.so.9 && echo 9.28.1.4 > " ..
          pinned .. "/VERSION"
      end
    end
    assert.is_true(os.execute(table.concat(sh, "\n")) == 0)
    local p = io.popen("readlink -f " .. root)
    local real = p:read("*l")
    p:close()
    return root, real
  end

  -- What a meta rank prints about the pick and the calls of `script` (its lines follow the
  -- pick's), on a host faked from kinds; env: more variables.
  local function on_fake_host(kinds, body, env)
    local root, real = fake_host(kinds)
    local file = H.write(H.tmpname(".lua"), 'local dl = require "distlab"\n' ..
      'print("PICK " .. dl.attn.cudnn_info().pick)\n' .. (body or ""))
    -- DISTLAB_CUDNN cleared (scripts/gpu/suite.sh runs this file once with it set) unless env sets it
    local rc, out = H.distlab("run --device meta " .. file, "DISTLAB_CUDNN= DISTLAB_CUDNN_SYSROOT=" .. root .. " " ..
      (env or ""))
    os.remove(file)
    os.execute("rm -rf " .. root)
    assert.equal(0, rc, out)
    return out, real, file
  end

  local function files(real)
    return real .. dl.root .. "/.deps/cudnn-lib/lib/libcudnn.so.9",
      real .. "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
      real .. "/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"
  end

  it("picks the newest libcudnn found (pinned, PyTorch's wheel, the system's), DISTLAB_CUDNN over all", function()
    local out, real = on_fake_host { "toolkit", "system", "wheel", "pinned" }
    local pinned, wheel, system = files(real)
    local want = "PICK will take " .. pinned .. " (the newest found); found: 9.28.1 " .. pinned ..
      " (pinned, scripts/fetch-cudnn-lib.sh); 9.19.0 " .. wheel .. " (PyTorch's wheel); 9.14.0 " .. system ..
      " (system); 9.10.2 " .. real .. "/usr/local/cuda/lib64/libcudnn.so.9 (system)\n"
    assert.truthy(out:find(want, 1, true), want .. "\n" .. out)
    out, real = on_fake_host { "system", "wheel" }
    pinned, wheel, system = files(real)
    want = "PICK will take " .. wheel .. " (the newest found); found: 9.19.0 " .. wheel .. " (PyTorch's wheel); 9.14.0 " ..
      system .. " (system)"
    assert.truthy(out:find(want, 1, true), want .. "\n" .. out)
    out = on_fake_host({ "system", "wheel", "pinned" }, nil, "DISTLAB_CUDNN=/opt/my/libcudnn.so.9")
    assert.truthy(out:find("PICK will take DISTLAB_CUDNN=/opt/my/libcudnn.so.9; found: 9.28.1 ", 1, true), out)
    out = on_fake_host {}
    assert.truthy(out:find("PICK found no libcudnn.so.9; will ask the loader for one", 1, true), out)
  end)

  -- thd backward at head dim 256 on a host whose newest cuDNN is 9.14 (known to give a wrong dq
  -- there): "cudnn" refuses it at the caller's line naming the version, what is wrong and the
  -- fix; "auto" runs ours; neighbouring calls (d 128, the forward, bshd) and 9.19 are not refused
  local calls = [[
local function call(d, layout, dir, backend)
  local thd = layout == "thd"
  local q = dl.empty(thd and { 600, 4, d } or { 2, 300, 4, d }, { dtype = "f16", device = "meta" })
  local cu = dl.empty({ 3 }, { dtype = "i32", device = "meta" })
  local o = thd and { layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, max_seqlen_q = 300, max_seqlen_kv = 300,
    mask = "causal_bottom_right", backend = backend } or { mask = "causal_bottom_right", backend = backend }
  local b = dl.attn.backends(q, q, q, o)
  print(string.format("%s d %d %s %s: %s (%s)", layout, d, dir, backend, tostring(b[dir]), b[dir .. "_why"]))
  local ok, err = pcall(function()
    local out, lse = dl.attn.fwd(q, q, q, o)
    if dir == "bwd" then dl.attn.bwd(out, q, q, q, out, lse, o) end
  end)
  print(string.format("%s d %d %s %s call: %s", layout, d, dir, backend, ok and "ran" or err))
end
for _, c in ipairs { { 256, "thd", "bwd" }, { 128, "thd", "bwd" }, { 256, "thd", "fwd" }, { 256, "bshd", "bwd" } } do
  call(c[1], c[2], c[3], "cudnn")
  call(c[1], c[2], c[3], "auto")
end
]]

  it("refuses what the cuDNN it would open computes wrongly: thd backward at head dim 256 on 9.14", function()
    local out, real, file = on_fake_host({ "system" }, calls)
    local lib = real .. "/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"
    local why = "cuDNN 9.14.0 (" .. lib .. ") is known to compute it wrongly: thd backward with a head dim above 128 " ..
      "returns a wrong dq, silently"
    local fix = "use cuDNN 9.19.0 or newer (PyTorch's wheel or scripts/fetch-cudnn-lib.sh's, which the pick prefers; " ..
      "or DISTLAB_CUDNN=<its libcudnn.so.9>) or backend \"ours\""
    assert.truthy(out:find("thd d 256 bwd cudnn: false (" .. why, 1, true), out)
    local line = out:match("thd d 256 bwd cudnn call: ([^\n]*)")
    assert.truthy(line and line:find(file:match("[^/]*$") .. ":%d+: attn.bwd: backend \"cudnn\" cannot run this call: "),
      "the error points at the caller's line: " .. tostring(line))
    assert.truthy(line:find(why, 1, true) and line:find(fix, 1, true), line)
    assert.truthy(out:find("thd d 256 bwd auto: ours (ours: " .. why, 1, true), out)
    assert.truthy(out:find("thd d 256 bwd auto call: ran", 1, true), out)
    for _, c in ipairs { "thd d 128 bwd", "thd d 256 fwd", "bshd d 256 bwd" } do
      for _, b in ipairs { "cudnn", "auto" } do
        assert.truthy(out:find(c .. " " .. b .. ": cudnn (meta: cuDNN's workspace counted by formula", 1, true), out)
        assert.truthy(out:find(c .. " " .. b .. " call: ran", 1, true), out)
      end
    end
    out = on_fake_host({ "system", "wheel" }, calls)
    assert.truthy(out:find("thd d 256 bwd cudnn: cudnn (meta: cuDNN's workspace counted by formula", 1, true), out)
    assert.truthy(out:find("thd d 256 bwd cudnn call: ran", 1, true), out)
  end)

  it("counts cuDNN's workspace on meta under its own tag, by formula", function()
    local m = dl.empty({ 2, 1024, 4, 64 }, { dtype = "bf16", device = "meta" })
    dl.mem.reset_peak("meta")
    local out, lse = dl.mem.tag("attn_cudnn_spec", function() return dl.attn.fwd(m, m, m, { backend = "cudnn" }) end)
    dl.mem.tag("attn_cudnn_spec", function() dl.attn.bwd(out, m, m, m, out, lse, { backend = "cudnn" }) end)
    local tags = dl.mem.stats("meta").tags
    local rows = 2 * 4 * 1024
    assert.equal(rows * 65 * 4 + rows * 4, tags.cudnn_workspace.peak) -- dQ accumulator, row sums, stats copy
    -- the caller's tag holds out, lse, dq, dk, dv only: our kernel's workspace is not taken
    assert.equal(4 * 2 * 1024 * 4 * 64 * 2 + rows * 4, tags.attn_cudnn_spec.peak)
  end)
end)
