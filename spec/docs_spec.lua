-- spec/docs_spec.lua — README.md and docs/ against the code: every DISTLAB_*
-- variable the code reads is listed in docs/knobs.md, every page of docs/ is
-- linked from the README, every relative link leads to a file, the README
-- stays short, and its schedule script runs. (docs/repl.md's sessions are
-- typed again by spec/repl_spec.lua.)
local H = require "helpers"

local function read(path)
  local f = assert(io.open(H.root .. "/" .. path), "no " .. path)
  local s = f:read("*a")
  f:close()
  return s
end

local function lines_of(cmd)
  local p = io.popen("cd " .. H.root .. " && " .. cmd)
  local out = {}
  for l in p:read("*a"):gmatch("[^\n]+") do out[#out + 1] = l end
  p:close()
  return out
end

local function pages()
  local out = {}
  for _, f in ipairs(lines_of("ls docs")) do
    if f:match("%.md$") then out[#out + 1] = f end
  end
  return out
end

describe("docs", function()
  it("docs/knobs.md lists every DISTLAB_* variable the code and scripts read", function()
    local knobs = read("docs/knobs.md")
    -- quoted names in the code (getenv, dl_env_int, os.getenv, ...; include
    -- guards are not quoted), $NAME / ${NAME in the scripts
    local found = lines_of([[{ grep -rhoE '"DISTLAB_[A-Z0-9_]+"' core kernels bindings experiments spec ]] ..
      [[--include=*.c --include=*.cu --include=*.cuh --include=*.cpp --include=*.h --include=*.lua --include=*.py; ]] ..
      [[grep -rhoE '\$\{?DISTLAB_[A-Z0-9_]+' scripts .ci; } | grep -oE 'DISTLAB_[A-Z0-9_]+' | sort -u]])
    assert.truthy(#found > 30, "found only " .. #found .. " variables: is the grep right?")
    local missing = {}
    for _, name in ipairs(found) do
      -- DISTLAB_H: the ABI header's include guard, named by spec/header_spec.lua
      if name ~= "DISTLAB_H" and not knobs:find("`" .. name .. "`", 1, true) then missing[#missing + 1] = name end
    end
    assert.same({}, missing)
  end)

  it("README.md links every page of docs/ and stays short", function()
    local readme = read("README.md")
    local ps = pages()
    assert.truthy(#ps >= 7, table.concat(ps, " "))
    for _, f in ipairs(ps) do
      assert.truthy(readme:find("](docs/" .. f .. ")", 1, true), "README.md does not link docs/" .. f)
    end
    local _, n = readme:gsub("\n", "")
    assert.truthy(n <= 160, "README.md has " .. n .. " lines; move the rest to docs/")
  end)

  it("every relative link of README.md and docs/ leads to a file", function()
    local files = { "README.md" }
    for _, f in ipairs(pages()) do files[#files + 1] = "docs/" .. f end
    local broken = {}
    for _, file in ipairs(files) do
      local dir = file:match("^(.*)/") or "."
      for target in read(file):gmatch("%]%(([^)#]+)[^)]*%)") do
        if not target:match("^%a+://") then
          local path = H.root .. "/" .. dir .. "/" .. target
          local f = io.open(path)
          if f then f:close() else broken[#broken + 1] = file .. ": " .. target end
        end
      end
    end
    assert.same({}, broken)
  end)

  it("the README's schedule script runs on 2 cpu ranks and is right", function()
    local script = read("README.md"):match("## A schedule script.-```lua\n(.-)```")
    assert.truthy(script, "no ```lua block under '## A schedule script' in README.md")
    local path = H.tmpname(".lua")
    H.write(path, script)
    local rc, out = H.distlab("run -n 2 --device cpu " .. path)
    os.remove(path)
    assert.equal(0, rc, out)
    local err = tonumber(out:match("2 ranks: error (%S+),"))
    assert.truthy(err and err < 1e-2, out)
    assert.truthy(out:find("comm_buffers", 1, true), out)
  end)

  it("the README's lines that load a file run as written", function()
    local block = read("README.md"):match("## A schedule script.-```lua\n.-```.-```lua\n(.-)```")
    assert.truthy(block and block:find("dl.load(\"x.npy\")", 1, true), "no ```lua block with dl.load in README.md")
    local dir = H.tmpname("")
    os.remove(dir)
    assert.equal(0, (os.execute("mkdir -p " .. dir)))
    local script = dir .. "/quick.lua"
    H.write(script, 'local dl = require "distlab"\n'
      .. 'dl.save("x.npy", dl.randn(3, 5, { dtype = "bf16", seed = 1, device = "cpu" }))\n'
      .. 'dl.save("w.safetensors", { a = dl.randn(4, { seed = 2, device = "cpu" }) })\n'
      .. block
      .. 'assert(dl.load("y.npy"):bytes() == x:to("f32"):bytes() and w.a:numel() == 4)\nprint("quick start ok")\n')
    local p = io.popen(string.format("root=$(cd %q && pwd) && cd %q && \"$root\"/distlab run --device cpu quick.lua 2>&1;"
      .. " echo __rc=$?", H.root, dir))
    local out = p:read("*a")
    p:close()
    local rc = tonumber(out:match("__rc=(%d+)%s*$"))
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.truthy(out:find("quick start ok", 1, true), out)
  end)
end)
