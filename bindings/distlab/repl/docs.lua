-- distlab.repl.docs — the pages of docs/ at the REPL's `?` (and `:help`).
--
--   docs.lookup(topic, defined) -> text, or nil when topic is not about docs
--     "docs"            the pages: name, title, file
--     "docs.knobs"      one page, whole (docs/knobs.md)
--     "knobs"           the same, where no global of that name is defined
--     "DISTLAB_TIMEOUT" the rows of docs/knobs.md that list that variable, where
--                       no global of that name is defined
--   defined(name) says whether a global of that name exists: a variable
--   shadows a page of its name.
--   docs.pages() -> {{name =, title =, path =}, ...} sorted by name
--
-- A page's name is its file's name without ".md" ("-" may be typed as "_");
-- its title is its first "# " line.
local core = require "distlab.core"

local M = {}

local function dir() return core.root:gsub("/+$", "") .. "/docs" end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

function M.pages()
  local out = {}
  local p = io.popen("ls '" .. dir() .. "' 2>/dev/null")
  for file in (p and p:read("*a") or ""):gmatch("[^\n]+") do
    local name = file:match("^(.+)%.md$")
    if name and name ~= "README" then
      local path = dir() .. "/" .. file
      local title = (read(path) or ""):match("^#%s*([^\n]*)") or name
      out[#out + 1] = { name = name, title = title, path = "docs/" .. file }
    end
  end
  if p then p:close() end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

local function find(name)
  local want = name:gsub("_", "-")
  for _, pg in ipairs(M.pages()) do
    if pg.name:gsub("_", "-") == want then return pg end
  end
end

local function index()
  local out = { "distlab's documentation, docs/ (README.md links every page); ?docs.<name> or :help <name> shows one:" }
  for _, pg in ipairs(M.pages()) do
    out[#out + 1] = string.format("  %-14s %-48s %s", pg.name, pg.title, pg.path)
  end
  if #out == 1 then out[#out + 1] = "  (no pages under " .. dir() .. ")" end
  return table.concat(out, "\n")
end

local function page(pg) return pg.path .. "\n\n" .. (read(core.root .. "/" .. pg.path) or ""):gsub("%s+$", "") end

-- The table rows of docs/knobs.md that name `var`, under their table's header.
local function knob(var)
  local text = read(dir() .. "/knobs.md")
  if not text then return nil end
  local out, head = {}, nil
  for l in text:gmatch("[^\n]*") do
    if l:match("^| variable") then head = l end
    if l:find("`" .. var .. "`", 1, true) and l:match("^|") then
      if head and #out == 0 then out[1] = head end
      out[#out + 1] = l
    end
  end
  if #out == 0 then return nil end
  return "docs/knobs.md:\n" .. table.concat(out, "\n")
end

function M.lookup(topic, defined)
  if topic == "docs" then return index() end
  local name = topic:match("^docs%.([%w_%-]+)$")
  if name then
    local pg = find(name)
    if pg then return page(pg) end
    return "no page '" .. name .. "' in docs/\n" .. index()
  end
  if topic:match("^[%a_][%w_]*$") and defined(topic) then return nil end
  if topic:match("^DISTLAB_[%w_]+$") then
    return knob(topic) or (topic .. ": not in docs/knobs.md (?docs.knobs lists every variable)")
  end
  local pg = topic:match("^[%w_%-]+$") and find(topic)
  if pg then return page(pg) end
end

return M
