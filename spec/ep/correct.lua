-- spec/ep/correct.lua — every layout, output and dtype (8 buffers) on cases
-- that each rank checks against every rank's inputs: random routing with
-- some -1 ids, T = B, T = 1, T = 0 and T varying per rank, tokens whose
-- experts all live on one rank, tokens with no expert at all, tokens that
-- pick an expert twice (the repeat is dropped and reported once, the rest
-- delivered); and E = N (one expert a rank). Dispatch: exactly
-- the rows each expert (source) must get, counts, ids and weights exact,
-- outputs poisoned first. Combine: against the fp64 sums (kernels' fp32
-- sums rounded once to bf16), and fp8 within its stated bound. Then a
-- planted 2% error in a received row and in the combined output must be
-- caught. Each buffer's bytes against its layout's formula (on cuda in
-- whole 2 MiB pages). Prints "correct ok" per rank.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local X = dofile(dir .. "/common.lua")
local dl = require "distlab"

local N, me = X.N, X.me
local cases = {
  { route = "random", T = 16 }, { route = "random", T = 1 }, { route = "random", T = 0 },
  { route = "random" }, { route = "one_rank", T = 16 }, { route = "none", T = 3 }, { route = "dup", T = 5 },
}
local configs = { { B = 16, H = 256, E = 4 * N, K = 4 }, { B = 8, H = 128, E = N, K = math.min(2, N) } }

local function fail(what, msg) error(what .. ": " .. msg, 0) end

X.report(function()
  local call, planted = 0, 0
  for ci, cfg in ipairs(configs) do
    for _, combo in ipairs(X.combos) do
      local o = { B = cfg.B, H = cfg.H, E = cfg.E, K = cfg.K, layout = combo.layout, output = combo.output,
        dtype = combo.dtype }
      local ep = X.buffer(o)
      local berr = X.check_bytes(o, ep)
      if berr then fail(string.format("config %d %s/%s/%s", ci, o.layout, o.output, o.dtype), berr) end
      for c, case in ipairs(cases) do
        call = call + 1
        local what = string.format("config %d %s/%s/%s case %d (%s, T=%s)", ci, o.layout, o.output, o.dtype, c,
          case.route, tostring(case.T or "varying"))
        local all = {}
        local T = case.T and math.min(case.T, o.B)
        for s = 0, N - 1 do all[s + 1] = X.inputs(o, call, s, case.route, T) end
        local mine = all[me + 1]
        X.poison(ep)
        local x, idx, w = X.tensors(mine, o)
        local recv, h
        if case.route == "dup" then
          -- reported once: on cpu by dispatch_send (after its tokens went out),
          -- on cuda by the next call that reads the kernel's record
          local errs = {}
          local function try(fn)
            local ok, e = pcall(fn)
            if not ok then errs[#errs + 1] = tostring(e) end
          end
          try(function() ep:dispatch_send(x, idx, w) end)
          h = { ep = ep, call = ep.calls, tokens = mine.T }
          try(function() recv = ep:dispatch_recv(h) end)
          try(function() ep:check() end)
          local want = X.repeats(mine)
          if want and not (#errs == 1 and errs[1]:find("picks an expert that token %d+ picked already")) then
            fail(what, "a repeated expert was not reported once: " .. table.concat(errs, " | "))
          elseif not want and #errs > 0 then
            fail(what, "an error without a repeated expert: " .. table.concat(errs, " | "))
          end
          for s = 1, N do X.repeats(all[s], true) end -- the references without the repeats
          local t = ep.tensors
          recv = recv or { x = t.x, scales = t.scales, counts = t.counts, expert_ids = t.expert_ids, weights = t.weights }
        else
          recv, h = ep:dispatch(x, idx, w)
          ep:check()
        end
        local err = X.check_dispatch(o, recv, all) or X.check_fp8_bound(o, mine)
        if err then fail(what, err) end
        local y = X.expert_outputs(o, recv)
        local out = ep:combine(y, h)
        ep:check()
        err = X.check_combine(o, out, mine)
        if err then fail(what, err) end
        -- the checks catch a 2% error: in the combined output, and in one received row
        local any = false
        for t = 1, mine.T do for k = 1, o.K do any = any or mine.idx[t][k] >= 0 end end
        if any then -- (an output of zeros stays zero)
          local bad = out:to("cpu"):f32():mul_(1.02)
          if not X.check_combine(o, bad, mine) then fail(what, "a 2% error in the combined output went unseen") end
          planted = planted + 1
        end
        local counts = recv.counts:to("cpu"):tolist()
        local g = 0
        for i, n in ipairs(counts) do if n > 0 and g == 0 then g = i end end
        if g > 0 then
          if o.dtype == "fp8" then -- a 2% error in a scale
            recv.scales:select(1, g):narrow(1, 1, 1):mul_(1.02)
          else
            local row = recv.x:select(1, g):narrow(1, 1, 1)
            row:copy_(row:f32():mul_(1.02):bf16())
          end
          if not X.check_dispatch(o, recv, all) then fail(what, "a 2% error in a received row went unseen") end
          planted = planted + 1
        end
      end
      ep:free()
    end
  end
  X.w:barrier()
  print(string.format("correct ok: rank %d of %d on %s, %d cases, %d planted errors caught", me, N, X.w.device, call,
    planted))
end)
