-- premake5.lua — the one build description of libdistlab.
--
-- Runs under Debian's Premake 4.3 (`premake4 --file=premake5.lua gmake`) and
-- under premake5. Four projects, so that object names never collide:
--   distlab_cuda  kernels/**.cu      static, compiled by nvcc (only when nvcc exists)
--   distlab_cpu   kernels/**/cpu/*.c static, the CPU twins of the kernels
--   distlab_cudnn core/**.cpp        static, C++17: cuDNN's frontend (only when nvcc and
--                                    .deps/cudnn-frontend/include exist, which
--                                    scripts/fetch-cudnn-frontend.sh fetches)
--   distlab       core/**.c          shared: build/lib/libdistlab.so
-- Objects of one project share a folder, so file names are unique within
-- each of the three sets (a spec checks it).
-- Includes are written from the roots core/ and kernels/ ("base/internal.h",
-- "common/dtype.h"); the ABI header is "distlab.h".
-- Under premake4 a .cu file counts as a C++ file and nvcc is the C++ compiler
-- (it understands -MMD -MP, so a changed kernel rebuilds one object); run the
-- generated makefile with `make -R` so GNU make's built-in CXX=g++ does not win.
-- `./distlab build` does all of this.

local P4 = _PREMAKE_VERSION:sub(1, 1) == "4"

newoption { trigger = "cpu-only", description = "Build without CUDA even if nvcc is found" }
newoption { trigger = "cuda-arch", value = "SM", description = "GPU arch, default 90" }

local function find_nvcc()
  if _OPTIONS["cpu-only"] then return nil end
  local home = os.getenv("CUDA_HOME") or os.getenv("CUDA_PATH")
  for _, p in ipairs({ home and (home .. "/bin/nvcc"), "/usr/local/cuda/bin/nvcc" }) do
    if p and os.isfile(p) then return p end
  end
  local dir = os.pathsearch("nvcc", os.getenv("PATH") or "")
  return dir and (dir .. "/nvcc") or nil
end

local nvcc = find_nvcc()
local cuda_home = nvcc and path.getdirectory(path.getdirectory(nvcc))
local sm = _OPTIONS["cuda-arch"] or "90"
-- Machine code for sm_XX plus PTX, so a newer GPU can JIT it.
local gencode = string.format("-gencode arch=compute_%s,code=sm_%s -gencode arch=compute_%s,code=compute_%s",
  sm, sm, sm, sm)
local nvcc_common = "--forward-unknown-to-host-compiler -std=c++20 -O3 -Xcompiler -fPIC " ..
  "--expt-relaxed-constexpr -lineinfo "
local nvcc_flags = nvcc_common .. gencode

-- NCCL and cuDNN headers live in the CUDA tree on developer machines and in
-- the system paths on the GPU hosts; NCCL itself is opened at run time.
local cuda_includes = nvcc and { cuda_home .. "/include", "/usr/include" } or {}
local cuda_libdirs = nvcc and { cuda_home .. "/lib64" } or {}

local cu_files = nvcc and os.matchfiles("kernels/**.cu") or {}
-- The Hopper kernels (wgmma, TMA, setmaxnreg) need the arch-specific sm_90a target: their own
-- library, compiled for it alone; they run only where the device is sm_90 (their launchers ask).
local hopper_files = nvcc and os.matchfiles("kernels/**/hopper/*.cu") or {}
for _, f in ipairs(hopper_files) do
  for i = #cu_files, 1, -1 do if cu_files[i] == f then table.remove(cu_files, i) end end
end
local hopper_flags = nvcc_common .. "-gencode arch=compute_90a,code=sm_90a"
-- cuDNN's frontend headers (pinned by scripts/fetch-cudnn-frontend.sh); cuDNN
-- itself is opened at run time (core/ops/attn/cudnn_sdpa.cpp), like NCCL.
local cudnn_fe = nvcc and os.isfile(".deps/cudnn-frontend/include/cudnn_frontend.h") and
  os.getcwd() .. "/.deps/cudnn-frontend/include"
-- The pinned cuDNN's own headers (scripts/fetch-cudnn-lib.sh, for GPU hosts) come first when
-- present: the frontend compiles its paths for the newest cuDNN it may meet (it checks the
-- library's version at run time as well); else the toolkit's or the system's cudnn.h.
local cudnn_h = cudnn_fe and os.isfile(".deps/cudnn-lib/include/cudnn.h") and
  os.getcwd() .. "/.deps/cudnn-lib/include"

if P4 then
  path.iscppfile_p4 = path.iscppfile_p4 or path.iscppfile
  function path.iscppfile(f) return path.getextension(f):lower() == ".cu" or path.iscppfile_p4(f) end
  if nvcc then premake.gcc.cxx = nvcc end
end

local function common()
  if P4 then
    configuration "*"
  else
    filter {}
  end
  flags { "Symbols" }
  includedirs { "core", "core/include", "kernels" }
  includedirs(cuda_includes)
  if nvcc then defines { "DL_WITH_CUDA" } end
  if cudnn_fe then defines { "DL_WITH_CUDNN_FE" } end
  targetdir "build/lib"
end

if P4 then solution "distlab" else workspace "distlab" end
  location "build"
  configurations { "release" }

-- A static library of .cu files compiled by nvcc with the given flags.
local function cuda_lib(name, dir, list, flags)
  project(name)
    kind "StaticLib"
    language "C++"
    common()
    objdir(dir)
    files(list)
    if P4 then
      buildoptions { flags }
    else
      filter "files:**.cu"
        buildcommands { nvcc .. " " .. flags .. " -Icore -Icore/include -Ikernels -I" .. cuda_home .. "/include" ..
          " -DDL_WITH_CUDA -MMD -MP -o %{cfg.objdir}/%{file.basename}.o -c %{file.relpath}" }
        buildoutputs { "%{cfg.objdir}/%{file.basename}.o" }
      filter {}
    end
end

if nvcc then
  cuda_lib("distlab_cuda", "build/obj/cuda", cu_files, nvcc_flags)
  cuda_lib("distlab_hopper", "build/obj/hopper", hopper_files, hopper_flags)
end

if cudnn_fe then
  -- One translation unit; the frontend's headers are system headers here (-isystem),
  -- so their own warnings do not hide ours. nvcc is the C++ compiler under premake4
  -- and hands a .cpp to the host compiler.
  project "distlab_cudnn"
    kind "StaticLib"
    language "C++"
    if cudnn_h then includedirs { cudnn_h } end -- before common()'s, so its cudnn.h is found first
    common()
    objdir "build/obj/cudnn"
    files(os.matchfiles("core/**.cpp"))
    local flags = "-std=c++17 -O2 -fPIC -Wall -Wextra -Wno-unused-parameter -isystem " .. cudnn_fe
    if P4 then
      buildoptions { "--forward-unknown-to-host-compiler " .. flags }
    else
      buildoptions { flags }
    end
end

project "distlab_cpu"
  kind "StaticLib"
  language "C"
  common()
  objdir "build/obj/cpu"
  files { "kernels/**/cpu/*.c" }
  buildoptions { "-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter" }

project "distlab"
  kind "SharedLib"
  language "C"
  common()
  objdir "build/obj/core"
  files { "core/**.c" }
  buildoptions { "-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter" }
  -- Static kernel libraries first, then what they need; nothing may stay undefined.
  if cudnn_fe then
    links { "distlab_cudnn" }
  end
  if nvcc then
    links { "distlab_cuda", "distlab_hopper" }
  end
  links { "distlab_cpu" }
  libdirs(cuda_libdirs)
  if nvcc then
    links { "cudart", "stdc++" }
    linkoptions { "-Wl,-rpath," .. cuda_home .. "/lib64" }
  end
  links { "m", "pthread", "dl", "rt" }
  -- Export exactly the functions of the ABI header; the symbols the core and
  -- the kernels share stay internal. `./distlab build` writes build/distlab.map
  -- from the header before make runs (a pre-link command would race the link
  -- under make -j: premake4's makefile builds both at once).
  -- nodelete: LuaJIT may unload the library at exit before the finalizers of
  -- the objects that still need it (and the NCCL watchdog thread) have run
  linkoptions { "-Wl,--no-undefined", "-Wl,--version-script=distlab.map", "-Wl,-z,nodelete" }
