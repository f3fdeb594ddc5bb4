-- spec/ep/backtoback.lua [calls] — 1000 (default) dispatch/combine calls
-- back to back over four buffers of different layouts, outputs and dtypes,
-- new routing and data every call, every result checked: plain pairs; a
-- dispatch whose results are checked and then replaced by a second dispatch
-- before any combine; two buffers with their phases interleaved (sends of
-- both before the receives); a dispatch combined twice. Nothing is zeroed
-- between calls: the epochs in the buffers pair every phase with the
-- peers'. Prints "backtoback ok" per rank.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local X = dofile(dir .. "/common.lua")

local N, me = X.N, X.me
local calls = tonumber(arg[1] or "1000")
local kinds = {
  { layout = "per_rank", output = "expert_major", dtype = "bf16" },
  { layout = "per_expert", output = "rank_major", dtype = "fp8" },
  { layout = "per_rank", output = "rank_major", dtype = "fp8" },
  { layout = "per_expert", output = "expert_major", dtype = "bf16" },
}

X.report(function()
  local bufs = {}
  for i, k in ipairs(kinds) do
    local o = { B = 8, H = 128, E = 2 * N, K = 2, layout = k.layout, output = k.output, dtype = k.dtype }
    bufs[i] = { o = o, ep = X.buffer(o) }
  end
  local seq = 0
  local function fresh(b)
    seq = seq + 1
    local all = {}
    for s = 0, N - 1 do all[s + 1] = X.inputs(b.o, seq, s, seq % 13 == 0 and "one_rank" or "random") end
    return all
  end
  local function send(b, all)
    X.poison(b.ep)
    local x, idx, w = X.tensors(all[me + 1], b.o)
    return b.ep:dispatch_send(x, idx, w)
  end
  local function received(b, all, h, what)
    local recv = b.ep:dispatch_recv(h)
    local err = X.check_dispatch(b.o, recv, all)
    if err then error(what .. ": " .. err, 0) end
    return recv
  end
  local function combined(b, all, recv, h, what)
    b.ep:combine_send(X.expert_outputs(b.o, recv), h)
    local err = X.check_combine(b.o, b.ep:combine_recv(h), all[me + 1])
    if err then error(what .. ": " .. err, 0) end
  end
  local done = 0
  while done < calls do
    local b = bufs[done % #bufs + 1]
    local what = string.format("call %d (%s/%s/%s)", done, b.o.layout, b.o.output, b.o.dtype)
    if done % 5 == 4 then -- two buffers, phases interleaved
      local c = bufs[(done + 1) % #bufs + 1]
      local ab, ac = fresh(b), fresh(c)
      local hb, hc = send(b, ab), send(c, ac)
      local rb, rc = received(b, ab, hb, what), received(c, ac, hc, what .. " (interleaved)")
      combined(c, ac, rc, hc, what .. " (interleaved)")
      combined(b, ab, rb, hb, what)
      done = done + 2
    else
      local all = fresh(b)
      local h = send(b, all)
      local recv = received(b, all, h, what)
      if done % 7 == 3 then -- a second dispatch before any combine
        all = fresh(b)
        h = send(b, all)
        recv = received(b, all, h, what .. " (dispatched twice)")
      end
      combined(b, all, recv, h, what)
      if done % 11 == 6 then combined(b, all, recv, h, what .. " (combined twice)") end
      done = done + 1
    end
  end
  for _, b in ipairs(bufs) do b.ep:check() end
  X.w:barrier()
  print(string.format("backtoback ok: rank %d of %d on %s, %d calls", me, N, X.w.device, done))
end)
