-- spec/comm/collectives.lua — every collective, every dtype, odd sizes,
-- against a reference this rank computes from every rank's input (inputs are
-- a known function of rank and index, so each rank can compute them all).
-- Values are multiples of 1/8 (ints for int dtypes), so sums are exact in
-- every dtype and the comparison is exact.
-- Usage: collectives.lua [sizes...]; SPEC_DTYPES="f32 bf16" limits the dtypes.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local U = dofile(dir .. "/util.lua")
local dl = require "distlab"

local w = dl.comm.world { timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "20") }
local N, me = w.size, w.rank
-- the backend's own handle: the ncclComm_t on nccl, nothing elsewhere
local native = w:info().native
if (w.backend == "nccl") ~= (native ~= nil) then
  error(string.format("info().native is %s on the %s backend", tostring(native), w.backend))
end
local sizes = {}
for i = 1, #arg do sizes[i] = tonumber(arg[i]) end
if #sizes == 0 then sizes = { 1, 7, 1001 } end
local dtypes = U.dtypes
if os.getenv("SPEC_DTYPES") then
  dtypes = {}
  for d in os.getenv("SPEC_DTYPES"):gmatch("%S+") do dtypes[#dtypes + 1] = d end
end

local function val(dtype, r, i, avg)
  local k = (i * 7 + r * 13) % 50
  if U.is_int[dtype] then return avg and N * (k % 12) or k end
  return (k - 25) / 8
end

local reduce = {
  sum = function(a, b) return a + b end,
  max = math.max,
  min = math.min,
}

local function red_ref(dtype, op, i, at)
  local acc
  for r = 0, N - 1 do
    local x = val(dtype, r, at(i), op == "avg")
    acc = acc and (reduce[op] or reduce.sum)(acc, x) or x
  end
  return op == "avg" and acc / N or acc
end

local checks = 0
local function done() checks = checks + 1 end

U.report(function()
  for _, dtype in ipairs(dtypes) do
    for _, n in ipairs(sizes) do
      local tag = string.format("%s n=%d", dtype, n)
      for _, op in ipairs { "sum", "avg", "max", "min" } do
        local t = U.make(n, dtype, function(i) return val(dtype, me, i, op == "avg") end)
        w:all_reduce(t, op)
        U.expect(t, function(i) return red_ref(dtype, op, i, function(x) return x end) end, "all_reduce " .. op .. " " .. tag)
        local src = U.make(n, dtype, function(i) return val(dtype, me, i, op == "avg") end)
        local out = dl.empty({ n }, { dtype = dtype })
        w:all_reduce(src, op, out)
        U.expect(out, function(i) return red_ref(dtype, op, i, function(x) return x end) end, "all_reduce out-of-place " .. op .. " " .. tag)
        local rs_in = U.make(N * n, dtype, function(i) return val(dtype, me, i, op == "avg") end)
        local rs_out = dl.empty({ n }, { dtype = dtype })
        w:reduce_scatter(rs_out, rs_in, op)
        U.expect(rs_out, function(i) return red_ref(dtype, op, i, function(x) return me * n + x end) end, "reduce_scatter " .. op .. " " .. tag)
        done()
      end
      local ag = dl.empty({ N * n }, { dtype = dtype })
      w:all_gather(ag, U.make(n, dtype, function(i) return val(dtype, me, i) end))
      U.expect(ag, function(i) return val(dtype, math.floor(i / n), i % n) end, "all_gather " .. tag)

      local a2a = dl.empty({ N * n }, { dtype = dtype })
      w:all_to_all(a2a, U.make(N * n, dtype, function(i) return val(dtype, me, i) end))
      U.expect(a2a, function(i) return val(dtype, math.floor(i / n), me * n + i % n) end, "all_to_all " .. tag)

      -- per-rank counts, zeros included: cnt(r, j) elements go from r to j
      local function cnt(r, j) return (r * 3 + j * 5 + n) % 7 + (j == 0 and n or 0) end
      local send, recv, ns, nr = {}, {}, 0, 0
      for j = 0, N - 1 do
        send[j + 1], recv[j + 1] = cnt(me, j), cnt(j, me)
        ns, nr = ns + send[j + 1], nr + recv[j + 1]
      end
      local vin = U.make(math.max(ns, 1), dtype, function(i) return val(dtype, me, i) end)
      local vout = dl.full({ math.max(nr, 1) }, 0, { dtype = dtype })
      w:all_to_allv(vout, recv, vin, send)
      local ref = {}
      local pos = 0
      for j = 0, N - 1 do
        local off = 0 -- where rank j's block for me starts in j's input
        for q = 0, me - 1 do off = off + cnt(j, q) end
        for k = 0, cnt(j, me) - 1 do ref[pos] = val(dtype, j, off + k); pos = pos + 1 end
      end
      U.expect(vout, function(i) return i < pos and ref[i] or 0 end, "all_to_allv " .. tag)

      for root = 0, N - 1 do
        local b = U.make(n, dtype, function(i) return val(dtype, me, i) end)
        w:broadcast(b, root)
        U.expect(b, function(i) return val(dtype, root, i) end, "broadcast root " .. root .. " " .. tag)
      end

      -- a ring exchange in a group, then pairs without a group
      local nxt, prv = (me + 1) % N, (me - 1 + N) % N
      local got = dl.empty({ n }, { dtype = dtype })
      local mine = U.make(n, dtype, function(i) return val(dtype, me, i) end)
      dl.comm.group(function()
        w:send(mine, nxt)
        w:recv(got, prv)
      end)
      U.expect(got, function(i) return val(dtype, prv, i) end, "grouped send/recv " .. tag)
      -- two messages of equal size to the same peer in one group arrive in order
      local second = U.make(n, dtype, function(i) return val(dtype, me + N, i) end)
      local got1, got2 = dl.empty({ n }, { dtype = dtype }), dl.empty({ n }, { dtype = dtype })
      dl.comm.group(function()
        w:send(mine, nxt)
        w:send(second, nxt)
        w:recv(got1, prv)
        w:recv(got2, prv)
      end)
      U.expect(got1, function(i) return val(dtype, prv, i) end, "grouped pair, first " .. tag)
      U.expect(got2, function(i) return val(dtype, prv + N, i) end, "grouped pair, second " .. tag)
      local mate = me % 2 == 0 and me + 1 or me - 1
      if mate < N then
        local r2 = dl.empty({ n }, { dtype = dtype })
        if me % 2 == 0 then w:send(mine, mate); w:recv(r2, mate) else w:recv(r2, mate); w:send(mine, mate) end
        U.expect(r2, function(i) return val(dtype, mate, i) end, "send/recv " .. tag)
      end
      w:barrier()
      done()
    end
  end
  w:synchronize()
  print(string.format("collectives ok: rank %d of %d, %d checks", me, N, checks))
end)
