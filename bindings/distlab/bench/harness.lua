-- distlab.bench.harness — one benchmark run: its options, where its results
-- go, its data checks and its exit code. The timing methods, the table, the
-- CSV and markdown writers are the other parts of distlab.bench; this ties
-- them to a run.
--
--   local h = dl.bench.harness {
--     name = "comm_bench", family = "comm",   results go to experiments/results/comm (--out)
--     usage = "...", about = "...",            for --help
--     options = { {...}, ... },                distlab.bench.options specs; the harness adds
--                                              --out DIR, --command TEXT and (tag = true) --tag
--     comm = world,                            ranks (nil: one process)
--     argv = arg, tag = true,
--     writes = false }                         a run that writes no files (the demo): --out is
--                                              accepted and unused, ranks sharing a GPU are fine
--   h.opt, h.given           the parsed options, and which were on the command line
--                            (--help printed the text and exited 0; a bad option
--                            printed its error and exited 2)
--   h.rank0, h.rank, h.size  h.tag (with tag = true: --tag, default h200x2, cpux2, ...)
--   h:print(fmt, ...)        on rank 0
--   h:progress(i, n, what)   case i of n starts: after 10 s of run (--progress S), one line a
--                            case on stderr, "NAME: case i/n (what), 42 s so far, about 3 min left";
--                            on cpu the run warns when ranks outnumber this host's cores
--   h:table(columns)         a distlab.bench.table printing on rank 0
--   h:max(v), h:sum(v)       v (number or list) over the ranks
--   h:check(fn)              after timing: fn() returns this rank's wrong elements (a number,
--                            or a 64-bit integer from C; fn may be the count itself);
--                            the sum over ranks is returned and counted for the exit code
--   h.quick, h.plant         --quick (the bench's smallest case: the plant spec runs it) and
--                            --plant noop | scale=X (distlab.bench.verify); --show-checks prints
--                            what every passing check found (its normwise error and bias)
--   h:planted(fn, o)         fn with --plant's error put in (fn itself without --plant):
--                            the callable a bench times and verifies
--   h:verify(spec)           after timing: fresh inputs, poisoned outputs, one more run of the
--                            timed callable, its check against a reference (distlab.bench.verify);
--                            wrong elements summed over ranks and counted, each rank's message kept
--                            on stderr ("NAME: data check failed on rank R of N: WHAT: ...")
--   h:unchecked(reason)      this run checks no data (a count of bytes on meta, say): says so,
--                            and under --plant that the plant has nothing to go into
--   h:path(name)             DIR/name, DIR made when missing
--   h:info()                 {device, date, commit, command} (--command replaces the command)
--   h:csv(name, header, rows), h:markdown(name, title, lines[, extra header lines]) -> path
--   h:finish()               barrier; exit 1 (saying how many) when any check found wrong data
-- Where ranks share a GPU (comm.share > 1: the ipc communicator, a
-- correctness mode) timings mean nothing: the run says so, and refuses to
-- write into experiments/results/ unless --shared-results is given.
local core = require "distlab.core"
local options = require "distlab.bench.options"
local timing = require "distlab.bench.timing"
local btable = require "distlab.bench.table"
local csv = require "distlab.bench.csv"
local markdown = require "distlab.bench.markdown"
local verify = require "distlab.bench.verify"
local stream = require "distlab.stream"

local fail = core.fail
local M = {}
local Harness = {}
Harness.__index = Harness

-- The machine's short name for file names: the GPU model and the rank count
-- (h200x2), or the device type (cpux2, metax1).
function M.default_tag(device, n)
  device = tostring(device)
  local model = device
  if device:match("^cuda") then
    model = (markdown.device_name(device):match("([AHBL]%d+)") or "gpu"):lower()
  else
    model = device:match("^(%a+)") or device
  end
  return model .. "x" .. (n or 1)
end

function M.new(o)
  if type(o) ~= "table" or type(o.name) ~= "string" then fail("bench.harness: expected {name =, family =, ...}") end
  local comm = o.comm
  local h = setmetatable({ name = o.name, family = o.family, comm = comm, wrong = 0, argv = o.argv or _G.arg or {},
    rank = comm and comm.rank or 0, size = comm and comm.size or 1 }, Harness)
  h.rank0 = h.rank == 0
  h.device = comm and comm.device or core.default_device()
  local spec = {}
  for _, s in ipairs(o.options or {}) do spec[#spec + 1] = s end
  local out_default = o.out or (o.family and ("experiments/results/" .. o.family) or "experiments/results")
  spec[#spec + 1] = { "out", "string", out_default, "results folder (made when missing)", meta = "DIR" }
  spec[#spec + 1] = { "command", "string", nil, "the command to record in the results (default: this one)",
    meta = "TEXT" }
  spec[#spec + 1] = { "quick", "flag", false, "the smallest case only (a check that the bench runs and checks)" }
  spec[#spec + 1] = { "plant", "string", nil, verify.PLANT_HELP, meta = "noop|scale=X" }
  spec[#spec + 1] = { "show-checks", "flag", false,
    "print what every data check found (normwise error, bias; the margins of the bounds) on each rank" }
  spec[#spec + 1] = { "progress", "number", 10, "seconds of run before the case i/N lines (0: every case)",
    meta = "S" }
  spec[#spec + 1] = { "shared-results", "flag", false,
    "write into experiments/results/ even where ranks share a GPU (timings mean nothing there)" }
  if o.tag then
    spec[#spec + 1] = { "tag", "string", M.default_tag(h.device, h.size), "name of the machine in file names",
      meta = "NAME" }
  end
  h.parser = options.new(spec, { program = o.name, usage = o.usage, about = o.about })
  local ok, opt, given = pcall(h.parser.parse, h.parser, h.argv)
  if not ok then
    io.stderr:write(tostring(opt), "\n")
    os.exit(2)
  end
  if opt.help then
    if h.rank0 then print(h.parser:help()) end
    os.exit(0)
  end
  h.opt, h.given, h.out, h.tag = opt, given, opt.out, opt.tag
  h.quick = opt.quick
  local okp, plant = pcall(verify.parse_plant, opt.plant)
  if not okp then
    io.stderr:write(o.name .. ": " .. tostring(plant) .. "\n")
    os.exit(2)
  end
  h.plant = plant
  h.t0, h.progress_after = core.C.dl_now_us(), opt.progress
  M.warn_cores(h)
  if plant then h:print("%s: --plant %s: the data check must fail this run", h.name, plant.text) end
  -- the default folder is the checkout's, wherever the run starts; a folder given is the caller's
  if not given.out and not out_default:match("^/") then h.out = core.root .. "/" .. out_default end
  h.shared = comm ~= nil and (comm.share or 1) > 1
  if h.shared and o.writes ~= false then
    h:print("%s: %d ranks share this GPU (the ipc communicator): a correctness run, its timings mean nothing",
      h.name, comm.share)
    local results = (core.root .. "/experiments/results"):gsub("//+", "/")
    local out = (h.out:match("^/") and h.out or (os.getenv("PWD") or ".") .. "/" .. h.out):gsub("//+", "/")
    if not opt.shared_results and (out == results or out:sub(1, #results + 1) == results .. "/") then
      if h.rank0 then
        io.stderr:write(string.format("%s: ranks share a GPU, so nothing is written to %s (give --out elsewhere, "
          .. "or --shared-results)\n", h.name, h.out))
      end
      os.exit(2)
    end
  end
  return h
end

-- The cores this process may run on (its affinity: taskset and --bind narrow it), nil if unknown.
function M.cores()
  local p = io.popen("nproc 2>/dev/null")
  local n = p and tonumber(p:read("*l") or "")
  if p then p:close() end
  return n
end

-- On cpu every rank's work is the host's: more ranks on this host than cores
-- and they take turns, so a time is partly the others' work.
function M.warn_cores(h)
  if not tostring(h.device):match("^cpu") or not h.rank0 then return end
  local ranks = tonumber(os.getenv("DISTLAB_LOCAL_WORLD_SIZE") or "") or h.size
  local cores = M.cores()
  if cores and ranks > cores then
    io.stderr:write(string.format("%s: %d ranks on %d core%s of this host: the ranks take turns on the cores, so "
      .. "times on cpu include the others' work (a correctness run; time with -n %d or fewer)\n",
      h.name, ranks, cores, cores == 1 and "" or "s", cores))
  end
end

-- h:progress(i, n, what): case i of n starts. Once the run has gone
-- --progress seconds (10; a short run says nothing), rank 0 writes one
-- line per case on stderr: "NAME: case i/n (what), 42 s so far, about 1 min 5 s
-- left" (the time left: the mean of the cases done so far, times those left).
local function span(s)
  s = math.floor(s + 0.5)
  if s < 60 then return s .. " s" end
  if s < 3600 then return string.format("%d min %d s", math.floor(s / 60), s % 60) end
  return string.format("%d h %d min", math.floor(s / 3600), math.floor(s % 3600 / 60))
end

function Harness:progress(i, n, what)
  if not self.rank0 then return end
  local now = core.C.dl_now_us()
  local elapsed = (now - self.t0) / 1e6
  if i == 1 or not self.case_t0 then self.case_t0, self.case_i0 = now, i end
  if elapsed < self.progress_after then return end
  local done = i - self.case_i0
  local left = done > 0 and string.format(", about %s left", span((now - self.case_t0) / 1e6 / done * (n - i + 1)))
    or ""
  io.stderr:write(string.format("%s: case %d/%d%s, %s so far%s\n", self.name, i, n,
    what and " (" .. what .. ")" or "", span(elapsed), left))
  io.stderr:flush()
end

function Harness:print(fmt, ...)
  if not self.rank0 then return end
  io.stdout:write(select("#", ...) > 0 and string.format(fmt, ...) or fmt, "\n")
  io.stdout:flush()
end

function Harness:table(columns) return btable.new(columns, { quiet = not self.rank0 }) end

function Harness:max(v) return timing.over_ranks(self.comm, v, "max") end
function Harness:sum(v) return timing.over_ranks(self.comm, v, "sum") end

function Harness:check(fn)
  local got = type(fn) == "function" and fn() or fn
  local mine = verify.as_count(got)
  if not mine then fail("%s: a data check must return a count of wrong elements, got %s", self.name,
    tostring(got)) end
  local total = self:sum(mine)
  self.wrong = self.wrong + total
  return total
end

function Harness:planted(fn, o) return verify.planted(fn, self.plant, o) end

function Harness:verify(spec)
  local device, comm = self.device, self.comm
  -- the device done, and every rank there: no peer writes into an output before
  -- its owner poisoned it, and all a peer wrote has landed before the check
  local settle = function()
    stream.synchronize(device)
    if comm and comm.size > 1 then comm:barrier() end
  end
  self.verified = (self.verified or 0) + 1
  local n, msg = verify.run(spec, settle)
  if n == 0 and self.opt.show_checks then
    io.stdout:flush() -- the line in one write: the ranks' lines do not interleave
    io.stdout:write(string.format("%s: data check on rank %d of %d: %s: ok: %s\n", self.name, self.rank, self.size,
      tostring(spec.what or "?"), msg or ""))
    io.stdout:flush()
  end
  if n > 0 then
    local line = string.format("%s: data check failed on rank %d of %d: %s: %s", self.name, self.rank, self.size,
      tostring(spec.what or "?"), msg or (n .. " wrong elements"))
    io.stderr:write(line .. "\n") -- one write: the ranks' lines do not interleave
    io.stderr:flush()
    self.failures = self.failures or {}
    self.failures[#self.failures + 1] = line
  end
  return self:check(n)
end

function Harness:unchecked(reason)
  self.unchecked_reason = reason
  self:print("%s: checks no data: %s", self.name, reason)
  if self.plant and self.rank0 then
    io.stderr:write(string.format("%s: --plant %s has nothing to go into: this run checks no data (%s)\n",
      self.name, self.plant.text, reason))
  end
end

function Harness:path(name)
  if not self.made then
    os.execute("mkdir -p " .. markdown.shell_word(self.out))
    self.made = true
  end
  return self.out .. "/" .. name
end

function Harness:info()
  if not self.run_info then
    self.run_info = markdown.run_info { comm = self.comm, device = self.device, command = self.opt.command,
      argv = self.argv, device_desc = self.device_desc }
  end
  return self.run_info
end

-- --measured CSV: the timed run's results file beside it (its name with .md) gives this file's
-- device, date, commit and libraries (the command: --command's, else the timed run's), so a report
-- can be assembled on any host. Returns that file's header fields (nil: none there) and extra lines:
-- its lines matching one of the patterns in keep (without the "- "), then which command timed and
-- which assembled.
function Harness:adopt_timed(csv_path, keep)
  local path = csv_path:gsub("%.csv$", ".md")
  local t = markdown.read_header(path)
  if not (t and t.device) then return nil end
  local own, lines = self:info(), {}
  for line in io.lines(path) do
    for _, p in ipairs(keep or {}) do
      if line:match(p) then
        lines[#lines + 1] = line:sub(3)
        break
      end
    end
  end
  lines[#lines + 1] = "timed by: `" .. t.command .. "`"
  lines[#lines + 1] = "assembled: `" .. own.command .. "` on " .. own.device .. ", " .. own.date ..
    " (from the CSVs of that run)"
  self.run_info = { device = t.device, date = t.date, commit = (t.commit:gsub("`", "")),
    command = self.opt.command or t.command, ran_as = self.opt.command and own.ran_as or nil,
    libraries = t.libraries }
  return t, lines
end

function Harness:csv(name, header, rows) return csv.write(self:path(name), header, rows) end

function Harness:markdown(name, title, lines, extra)
  local all = markdown.header(title, self:info(), extra)
  all[#all + 1] = ""
  for _, l in ipairs(lines) do all[#all + 1] = l end
  return markdown.write(self:path(name), all)
end

function Harness:finish()
  if self.comm and self.comm.size > 1 then self.comm:barrier() end
  if self.plant and self.wrong == 0 and self.rank0 and not self.unchecked_reason then
    io.stderr:write(string.format("%s: --plant %s: %s\n", self.name, self.plant.text, (self.verified or 0) > 0
      and string.format("none of the %d data checks saw it", self.verified) or "no data check ran"))
  end
  if self.wrong > 0 then
    io.stderr:write(string.format("%s: %d wrong elements\n", self.name, self.wrong))
    os.exit(1)
  end
end

M.Harness = Harness
return setmetatable(M, { __call = function(_, o) return M.new(o) end })
