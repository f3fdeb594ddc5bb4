-- spec/comm/util.lua — what the multi-rank spec scripts share: tensors from a
-- value function, values back as a Lua array, exact comparison, and failing
-- with a message the spec can match.
local ffi = require "ffi"
local dl = require "distlab"

local U = {}

U.dtypes = { "f32", "f16", "bf16", "f64", "i32", "i64", "u8" }
U.is_int = { i32 = true, i64 = true, u8 = true }

-- A tensor of n elements on the default device, element i (0-based) = f(i).
function U.make(n, dtype, f)
  local host = dl.empty({ n }, { dtype = "f64", device = "cpu" })
  local p = ffi.cast("double*", host:data_ptr())
  for i = 0, n - 1 do p[i] = f(i) end
  local t = dl.empty({ n }, { dtype = dtype })
  t:copy_(host)
  return t
end

-- Element values as a 0-based Lua array of numbers.
function U.values(t)
  local host = dl.empty({ t:numel() }, { dtype = "f64", device = "cpu" })
  host:copy_(t:view(t:numel()))
  local p = ffi.cast("double*", host:data_ptr())
  local v = {}
  for i = 0, t:numel() - 1 do v[i] = p[i] end
  return v
end

-- Every element of t equals ref(i) exactly; else an error naming the first.
function U.expect(t, ref, what)
  local v = U.values(t)
  for i = 0, t:numel() - 1 do
    local want = ref(i)
    if v[i] ~= want then
      error(string.format("%s: element %d is %s, expected %s", what, i, tostring(v[i]), tostring(want)), 0)
    end
  end
end

-- Run fn; on error print "ERR: <message>" for the spec to read and exit with
-- code (default 3; 0 lets the other ranks finish and report theirs).
function U.report(fn, code)
  local ok, err = pcall(fn)
  if not ok then
    io.stdout:write("ERR: " .. tostring(err) .. "\n")
    io.stdout:flush()
    os.exit(code or 3)
  end
end

ffi.cdef "int poll(void *fds, unsigned long n, int timeout_ms);"
-- Sleep without a child process (a child would hold the launcher's pipes).
function U.sleep(seconds) ffi.C.poll(nil, 0, math.floor(seconds * 1000)) end

return U
