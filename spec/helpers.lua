-- Shared by every spec: assert.tensor_near, the devices to run on, and a way to
-- run the launcher. GPU-only describe blocks carry the #gpu tag (#multigpu for
-- two GPUs); ./distlab test excludes them where the GPUs are missing.
local say = require "say"
local assert = require "luassert"
local dl = require "distlab"

local H = {}

H.root = dl.root

-- assert.tensor_near(ref, got, atol, rtol): same shape, every |got-ref| <= atol + rtol*|ref|,
-- and no NaN/Inf in got unless ref has it at the same place; prints the first mismatches.
local function tensor_near(state, args)
  local ref, got, atol, rtol = args[1], args[2], args[3] or 0, args[4] or args[3] or 0
  if not (dl.is_tensor(ref) and dl.is_tensor(got)) then
    state.failure_message = "tensor_near: both arguments must be tensors"
    return false
  end
  local rs, gs = ref.shape, got.shape
  if #rs ~= #gs then
    state.failure_message = string.format("shapes differ: [%s] vs [%s]", table.concat(rs, ", "), table.concat(gs, ", "))
    return false
  end
  for i = 1, #rs do
    if rs[i] ~= gs[i] then
      state.failure_message = string.format("shapes differ: [%s] vs [%s]", table.concat(rs, ", "), table.concat(gs, ", "))
      return false
    end
  end
  local report = dl.mismatch_report(got, ref, atol, rtol, 8)
  if report then
    state.failure_message = "tensors differ: " .. report
    return false
  end
  return true
end
say:set("assertion.tensor_near.positive", "Expected tensors to be near.\n%s")
say:set("assertion.tensor_near.negative", "Expected tensors to differ.")
assert:register("assertion", "tensor_near", tensor_near, "assertion.tensor_near.positive",
  "assertion.tensor_near.negative")

-- Devices the shared specs run on: cpu always, cuda:0 where a GPU exists.
-- Each entry: {name = "cpu" | "cuda:0", tag = "" | " #gpu"}.
H.devices = { { name = "cpu", tag = "" } }
if dl.cuda_device_count() > 0 then H.devices[#H.devices + 1] = { name = "cuda:0", tag = " #gpu" } end
-- Tagged GPU entry even without a GPU, so busted lists (and skips) it visibly.
if dl.cuda_device_count() == 0 then H.devices[#H.devices + 1] = { name = "cuda:0", tag = " #gpu" } end

-- Ranks of the #multigpu specs: 2, or DISTLAB_SPEC_RANKS (scripts/gpu/suite.sh
-- runs them with 2, 4 and 8 ranks on one GPU, where ranks share it).
H.gpu_ranks = tonumber(os.getenv("DISTLAB_SPEC_RANKS") or "") or 2

-- Runs `./distlab <args>` and returns exit code, stdout+stderr. A job that
-- runs past DISTLAB_JOB_TIMEOUT (default 300 s) is stopped by the launcher.
function H.distlab(args, env)
  return H.run(string.format("cd %q && DISTLAB_JOB_TIMEOUT=${DISTLAB_JOB_TIMEOUT:-300} %s ./distlab %s",
    H.root, env or "", args))
end

-- A shell command's exit code and output (stdout and stderr together).
function H.run(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("__rc=(%d+)%s*$")), (out:gsub("__rc=%d+%s*$", ""))
end

-- s quoted for the shell (single quotes).
function H.sh(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- ---- multi-rank specs ----------------------------------------------------------------
-- A module's multi-rank specs start the rank scripts of its folder under spec/ through the
-- launcher, and each rank of a script that passes prints "<word> ok".

-- H.ranks("ep") -> run(n, device, script, args, env): `./distlab run -n n --device device
-- spec/ep/<script> <args>` with env (words VAR=value) set; returns the exit code and the
-- output of every rank (H.distlab).
function H.ranks(dir)
  return function(n, device, script, args, env)
    return H.distlab(string.format("run -n %d --device %s spec/%s/%s %s", n, device, dir, script, args or ""), env)
  end
end

-- How many times out says "<word> ok" (a Lua pattern: "%-" for a "-" in word).
function H.ok_lines(out, word)
  local _, k = out:gsub(word .. " ok", "")
  return k
end

-- The job ran through (exit code 0) and each of its n ranks said "<word> ok"; returns out.
-- Takes run's results as they come: H.ranks_ok(n, "correct", run(n, "cpu", "correct.lua")).
function H.ranks_ok(n, word, rc, out)
  assert.equal(0, rc, out)
  assert.equal(n, H.ok_lines(out, word), out)
  return out
end

-- The results of pcall(fn) in a spec file are an error that holds msg (plain text) and points
-- at a line of that file (distlab raises its errors at the caller's line), never a raw FFI
-- conversion message. Call pcall in the spec file itself, so that a tail call in fn still
-- points there: local function fails(fn, msg) return H.failed(msg, "x_spec.lua", pcall(fn)) end
function H.failed(msg, file, ok, err)
  assert.is_false(ok, "expected an error: " .. msg)
  err = tostring(err)
  assert.truthy(err:find(msg, 1, true), err)
  assert.truthy(err:find(file:gsub("%p", "%%%0") .. ":%d+:"), "the error should point at the caller: " .. err)
  assert.falsy(err:find("cannot convert", 1, true), err)
  return err
end

-- CP specs: the per-rank shard shapes of q and of k/v for C ranks (h and hkv heads, d 32) in
-- a layout; thd sequences (lengths 6C + 1, 0, 2C - 1, 10C, each padded to a multiple of 2C)
-- as {cu_seqlens_q, cu_seqlens_q_padded}.
function H.cp_shapes(layout, C, h, hkv)
  if layout == "thd" then
    local L = { 6 * C + 1, 0, 2 * C - 1, 10 * C }
    local cu, P = { 0 }, { 0 }
    for b, n in ipairs(L) do
      cu[b + 1], P[b + 1] = cu[b] + n, P[b] + math.max(2 * C, math.ceil(n / (2 * C)) * 2 * C)
    end
    local T_r = P[#P] / C
    return { T_r, h, 32 }, { T_r, hkv, 32 }, { cu_seqlens_q = cu, cu_seqlens_q_padded = P }
  end
  if layout == "bshd" then return { 2, 8, h, 32 }, { 2, 8, hkv, 32 } end
  return { 8, 2, h, 32 }, { 8, 2, hkv, 32 }
end

-- Whether a command is on the PATH.
function H.has_command(cmd)
  local p = io.popen("command -v " .. cmd .. " 2>/dev/null")
  local out = p:read("*a")
  p:close()
  return out ~= ""
end

-- A fresh temporary file path.
function H.tmpname(suffix)
  local name = os.tmpname()
  os.remove(name)
  return name .. (suffix or "")
end

function H.read(path)
  local f = assert(io.open(path, "r"), "cannot read " .. path)
  local s = f:read("*a")
  f:close()
  return s
end

function H.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

package.loaded["helpers"] = H
return H
