-- distlab.repl.line — reading the REPL's input.
--
--   local ed = line.editor{history = path, complete = fn, prompt_piped = bool}
--   ed:read(prompt) -> the line | nil (end of input) | false (Ctrl-C: line dropped)
--
-- On a terminal: GNU readline (libreadline.so.8) through the FFI, in its
-- callback mode, so that Ctrl-C is ours: the SIGINT only counts
-- (dl_sigint_arm), poll() on stdin wakes up, and the line being typed is
-- dropped with "^C" and a fresh prompt, the session's state untouched.
-- History goes to `path` after every line, each line once (an earlier copy is
-- dropped when it comes again), at most 1000. Tab calls complete(word) for the
-- word before the cursor ('.' and ':' do not break words, so dl.at<Tab> and
-- t:nar<Tab> complete from the objects themselves) and takes the full
-- replacements it returns.
--
-- Elsewhere (a pipe, TERM=dumb, no libreadline: `distlab repl` runs rlwrap
-- then) lines are read with io.read, the prompt written only on a terminal
-- or when prompt_piped is set.
local ffi = require "ffi"
local core = require "distlab.core"

local C, libc = core.C, ffi.C
local M = {}

ffi.cdef [[
typedef struct dl_rl_hist_entry { char *line; char *timestamp; void *data; } dl_rl_hist_entry;
typedef void (*dl_rl_line_fn)(char *line);
typedef char *(*dl_rl_entry_fn)(const char *text, int state);
typedef char **(*dl_rl_complete_fn)(const char *text, int start, int end);
void rl_callback_handler_install(const char *prompt, dl_rl_line_fn fn);
void rl_callback_read_char(void);
void rl_callback_handler_remove(void);
void rl_callback_sigcleanup(void);
void rl_free_line_state(void);
void rl_cleanup_after_signal(void);
char **rl_completion_matches(const char *text, dl_rl_entry_fn fn);
extern dl_rl_complete_fn rl_attempted_completion_function;
extern int rl_attempted_completion_over;
extern int rl_completion_append_character;
extern const char *rl_completer_word_break_characters;
extern const char *rl_readline_name;
void add_history(const char *line);
dl_rl_hist_entry **history_list(void);
dl_rl_hist_entry *remove_history(int which);
void *free_history_entry(dl_rl_hist_entry *e);
int read_history(const char *path);
int write_history(const char *path);
void stifle_history(int max);
int isatty(int fd);
struct dl_rl_pollfd { int fd; short events, revents; };
int poll(struct dl_rl_pollfd *fds, unsigned long n, int timeout_ms);
char *strdup(const char *s);
void free(void *p);
]]

local HISTORY_MAX = 1000
-- C strings readline keeps pointers to: they must live as long as the process
local NAME = ffi.new("char[?]", 8, "distlab")
local BREAKS = ffi.new("char[?]", 40, " \t\n\"'`@$><=;|&{(,+-*/%^~#")

-- ---- plain reads ----------------------------------------------------------

local Plain = {}
Plain.__index = Plain

function Plain:read(prompt)
  if self.show_prompt then
    io.write(prompt)
    io.flush()
  end
  return io.read("*l")
end

-- ---- readline -------------------------------------------------------------

local Editor = {}
Editor.__index = Editor

-- Index of `line` in readline's history list, or nil.
local function find_in_history(RL, line)
  local list = RL.history_list()
  if list == nil then return nil end
  local i = 0
  while list[i] ~= nil do
    if ffi.string(list[i].line) == line then return i end
    i = i + 1
  end
end

local function forget(RL, i) RL.free_history_entry(RL.remove_history(i)) end

function Editor:remember(line)
  if not line:match("%S") then return end
  local RL = self.RL
  local i = find_in_history(RL, line)
  if i then forget(RL, i) end
  RL.add_history(line)
  if self.history then RL.write_history(self.history) end
end

-- Readline's history from the file, each line once (its last occurrence):
-- files written before duplicates were dropped hold every line twice.
local function load_history(RL, path)
  RL.stifle_history(HISTORY_MAX)
  if RL.read_history(path) ~= 0 then return end
  local list, lines = RL.history_list(), {}
  local i = 0
  while list ~= nil and list[i] ~= nil do
    lines[#lines + 1] = ffi.string(list[i].line)
    i = i + 1
  end
  local seen = {}
  for k = #lines, 1, -1 do
    if seen[lines[k]] then forget(RL, k - 1) end
    seen[lines[k]] = true
  end
end

function Editor:read(prompt)
  local RL = self.RL
  self.got, self.done = nil, false
  RL.rl_callback_handler_install(prompt, self.on_line)
  local pfd = ffi.new("struct dl_rl_pollfd[1]")
  pfd[0].fd, pfd[0].events = 0, 1
  while not self.done do
    -- the timeout: a SIGINT that another thread took does not wake poll()
    local n = libc.poll(pfd, 1, 100)
    if C.dl_sigint_take() > 0 then
      RL.rl_free_line_state()
      RL.rl_callback_sigcleanup()
      RL.rl_cleanup_after_signal()
      RL.rl_callback_handler_remove()
      io.write("^C\n")
      io.flush()
      return false
    end
    if n > 0 then RL.rl_callback_read_char() end
  end
  if self.got then self:remember(self.got) end
  return self.got
end
-- Readline calls back into Lua (the line, completion): a trace may not call C that does
jit.off(Editor.read)

local function readline_editor(opts)
  local ok, RL = pcall(ffi.load, "libreadline.so.8")
  if not ok then return nil end
  local ed = setmetatable({ RL = RL, history = opts.history }, Editor)
  RL.rl_readline_name = NAME
  RL.rl_completer_word_break_characters = BREAKS
  -- removed at once: a handler still installed would draw the next prompt
  ed.on_line = ffi.cast("dl_rl_line_fn", function(p)
    RL.rl_callback_handler_remove()
    ed.done = true
    if p ~= nil then
      ed.got = ffi.string(p)
      libc.free(p)
    end
  end)
  local matches = {}
  local entry = ffi.cast("dl_rl_entry_fn", function(_, state)
    local m = matches[state + 1]
    return m and libc.strdup(m) or nil
  end)
  -- readline asks for the replacements one by one (state 0, 1, ...), each a
  -- copy it frees; a completer that fails offers nothing
  ed.complete = ffi.cast("dl_rl_complete_fn", function(text)
    RL.rl_attempted_completion_over = 1 -- never file names
    RL.rl_completion_append_character = 0
    local ok2, list = pcall(opts.complete or function() return {} end, ffi.string(text))
    matches = ok2 and list or {}
    if #matches == 0 then return nil end
    return RL.rl_completion_matches(text, entry)
  end)
  RL.rl_attempted_completion_function = ed.complete
  if ed.history then load_history(RL, ed.history) end
  return ed
end

function M.editor(opts)
  opts = opts or {}
  local tty = libc.isatty(0) == 1 and libc.isatty(1) == 1
  if tty and os.getenv("TERM") ~= "dumb" then
    local ed = readline_editor(opts)
    if ed then return ed end
  end
  return setmetatable({ show_prompt = tty or opts.prompt_piped }, Plain)
end

return M
