-- busted output handler for ./distlab test: one line per spec ("ok" / "FAIL" /
-- "ERROR" / "skip"), the failure messages in full, and as the last line
-- "N passed, N failed, N skipped" (errors, including files that fail to
-- load, count as failed; skipped counts pending specs and the specs that
-- ./distlab test excluded by tag, DISTLAB_TEST_EXCLUDED), which CI reads.
local pretty = require "pl.pretty"

return function(options)
  local busted = require "busted"
  local handler = require "busted.outputHandlers.base"()
  local passed, failed, skipped = 0, 0, 0
  local details = {}

  local function where(t)
    local tr = t and (t.trace or (t.element and t.element.trace))
    if tr and tr.short_src then return tr.short_src .. ":" .. tostring(tr.currentline or "?") end
    return "?"
  end

  local function record(kind, t)
    failed = failed + 1
    local msg = t and t.message
    if type(msg) ~= "string" then msg = msg == nil and "(no message)" or pretty.write(msg) end
    io.write(string.format("%-5s %s\n", kind, t and t.name or "?"))
    details[#details + 1] = string.format("%s %s\n  at %s\n  %s", kind, t and t.name or "?", where(t),
      (msg:gsub("\n", "\n  ")))
    io.flush()
  end

  handler.testEnd = function(element, parent, status)
    if status == "success" then
      passed = passed + 1
      io.write("ok    " .. handler.getFullName(element) .. "\n")
    elseif status == "pending" then
      skipped = skipped + 1
      io.write("skip  " .. handler.getFullName(element) .. "\n")
    elseif status == "failure" then
      record("FAIL", handler.failures[#handler.failures])
    elseif status == "error" then
      record("ERROR", handler.errors[#handler.errors])
    end
    io.flush()
    return nil, true
  end

  -- errors outside an `it` (a file that does not load, a failing before_each...)
  handler.error = function(element)
    if element.descriptor ~= "it" then record("ERROR", handler.errors[#handler.errors]) end
    return nil, true
  end

  handler.suiteEnd = function()
    if #details > 0 then
      io.write("\n" .. string.rep("-", 72) .. "\n" .. table.concat(details, "\n\n") .. "\n" ..
        string.rep("-", 72) .. "\n")
    end
    local excluded = tonumber(os.getenv("DISTLAB_TEST_EXCLUDED") or "") or 0
    io.write(string.format("%d passed, %d failed, %d skipped\n", passed, failed, skipped + excluded))
    io.flush()
    return nil, true
  end

  busted.subscribe({ "test", "end" }, handler.testEnd, { predicate = handler.cancelOnPending })
  busted.subscribe({ "error" }, handler.error)
  busted.subscribe({ "failure" }, handler.error)
  busted.subscribe({ "suite", "end" }, handler.suiteEnd)
  return handler
end
