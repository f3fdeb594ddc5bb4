-- spec/ep/faults.lua <mode> [layout output] — issue 53's EP cases on several
-- ranks, each rank printing "ERR: <message>" (or "ERR: (no error)") for
-- spec/ep_faults_spec.lua to read.
--   extra     rank 0 makes an extra dispatch in the first of three rounds of
--             dispatch and combine: every rank's error names the call out of
--             step, long before the timeout (SPEC_TIMEOUT)
--   output    ranks given different outputs: the error names the option
--   extrabuf  rank 0 makes a buffer the others do not make: its error says so
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local X = dofile(dir .. "/common.lua")
local dl = require "distlab"

local mode = arg[1]

local function say(ok, err)
  io.stdout:write("ERR: " .. (ok and "(no error)" or tostring(err)) .. "\n")
  io.stdout:flush()
end

if mode == "extra" then
  local o = { B = 4, H = 128, E = 2 * X.N, K = 2, layout = arg[2], output = arg[3], dtype = "bf16" }
  local ep = X.buffer(o)
  local t0 = dl.now_us()
  local ok, err = pcall(function()
    for call = 1, 3 do
      local inp = X.inputs(o, call, X.me, "random", 4)
      local recv, h = ep:dispatch(X.tensors(inp, o))
      if X.me == 0 and call == 1 then recv, h = ep:dispatch(X.tensors(inp, o)) end
      ep:combine(X.expert_outputs(o, recv), h)
    end
  end)
  say(ok, err)
  print(string.format("TOOK %.3f", (dl.now_us() - t0) / 1e6))
elseif mode == "output" then
  local ok, err = pcall(X.buffer, { B = 4, H = 128, E = 2 * X.N, K = 2, layout = "per_rank",
    output = X.me == 0 and "expert_major" or "rank_major" })
  say(ok, err)
  X.w:barrier()
elseif mode == "extrabuf" then
  local o = { B = 4, H = 128, E = 2 * X.N, K = 2 }
  X.buffer(o)
  local store = dl.comm.store()
  if X.me == 0 then
    local ok, err = pcall(X.buffer, o)
    say(ok, err)
    store:set("ep-extrabuf-done", "")
  else
    store:set_timeout(X.timeout * 4 + 10)
    store:wait("ep-extrabuf-done")
  end
end
