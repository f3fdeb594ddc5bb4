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

-- Ranks of the #multigpu specs: 2, or DISTLAB_SPEC_RANKS (scripts/gpu/shared.sh
-- runs them with 2 and 4 ranks on one GPU, where ranks share it).
H.gpu_ranks = tonumber(os.getenv("DISTLAB_SPEC_RANKS") or "") or 2

-- Runs `./distlab <args>` and returns exit code, stdout+stderr. A job that
-- runs past DISTLAB_JOB_TIMEOUT (default 300 s) is stopped by the launcher.
function H.distlab(args, env)
  local cmd = string.format("cd %q && DISTLAB_JOB_TIMEOUT=${DISTLAB_JOB_TIMEOUT:-300} %s ./distlab %s 2>&1",
    H.root, env or "", args)
  local p = io.popen(cmd .. "; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return rc, out:gsub("__rc=%d+%s*$", "")
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

function H.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

package.loaded["helpers"] = H
return H
