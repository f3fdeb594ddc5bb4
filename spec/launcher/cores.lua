-- Run by spec/launcher_spec.lua under `distlab run --bind`: prints the cores
-- this rank may run on.
local f = assert(io.open("/proc/self/status"))
local cores = f:read("*a"):match("Cpus_allowed_list:%s*(%S+)")
f:close()
io.write(string.format("rank=%s cores=%s\n", os.getenv("DISTLAB_RANK"), cores))
