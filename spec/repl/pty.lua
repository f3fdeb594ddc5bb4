-- spec/repl/pty.lua — drive a program through a pseudo-terminal, as a person
-- at a terminal would: keys in (Ctrl-C as the byte 0x03, which the terminal
-- turns into SIGINT for the foreground processes), screen text out.
--
--   local P = pty.spawn({"./distlab", "repl"}, {env = {HOME = dir}, cols = 200})
--   P:send("x = 1\r")          keys (Enter is "\r", Tab "\t", Ctrl-C "\3")
--   P:expect("dl> ")           wait (timeout) for text after what earlier
--                              expects consumed; returns the text up to it
--   P:close()                  SIGKILL the session, reap it; returns exit status
--
-- Only LuaJIT's FFI and glibc: posix_spawn with POSIX_SPAWN_SETSID makes the
-- child a session leader, so opening the terminal's other end as its stdin
-- makes that terminal its controlling one (no fork from a Lua VM, no tmux).
-- The text is kept with escape sequences and carriage returns removed.
local ffi = require "ffi"

ffi.cdef [[
int posix_openpt(int flags);
int grantpt(int fd);
int unlockpt(int fd);
char *ptsname(int fd);
int posix_spawn_file_actions_init(void *fa);
int posix_spawn_file_actions_destroy(void *fa);
int posix_spawn_file_actions_addopen(void *fa, int fd, const char *path, int oflag, unsigned mode);
int posix_spawn_file_actions_adddup2(void *fa, int fd, int newfd);
int posix_spawnattr_init(void *attr);
int posix_spawnattr_destroy(void *attr);
int posix_spawnattr_setflags(void *attr, short flags);
int posix_spawnattr_setsigdefault(void *attr, const void *sigset);
int posix_spawnattr_setsigmask(void *attr, const void *sigset);
int posix_spawnp(int *pid, const char *file, const void *fa, const void *attr,
                 char *const argv[], char *const envp[]);
int sigemptyset(void *set);
int sigaddset(void *set, int sig);
int ioctl(int fd, unsigned long req, ...);
struct dl_pty_pollfd { int fd; short events, revents; };
int poll(struct dl_pty_pollfd *fds, unsigned long n, int timeout_ms);
long read(int fd, void *buf, unsigned long n);
long write(int fd, const void *buf, unsigned long n);
int close(int fd);
int kill(int pid, int sig);
int waitpid(int pid, int *status, int options);
extern char **environ;
]]

local C = ffi.C
local O_RDWR, O_NOCTTY, O_CLOEXEC = 2, 256, 524288
local POSIX_SPAWN_SETSIGDEF, POSIX_SPAWN_SETSIGMASK, POSIX_SPAWN_SETSID = 4, 8, 128
local TIOCSWINSZ, POLLIN, WNOHANG, SIGINT, SIGKILL = 0x5414, 1, 1, 2, 9

local M = {}
local P = {}
P.__index = P

-- The environment of this process with `over` applied (false removes a name).
local function environment(over)
  local list = {}
  local i = 0
  while C.environ[i] ~= nil do
    local kv = ffi.string(C.environ[i])
    local k = kv:match("^([^=]*)=")
    if k and over[k] == nil then list[#list + 1] = kv end
    i = i + 1
  end
  for k, v in pairs(over) do
    if v ~= false then list[#list + 1] = k .. "=" .. v end
  end
  return list
end

local function cstrings(list)
  local arr = ffi.new("char *[?]", #list + 1)
  local keep = {}
  for i, s in ipairs(list) do
    keep[i] = ffi.new("char[?]", #s + 1, s)
    arr[i - 1] = keep[i]
  end
  return arr, keep
end

function M.spawn(argv, opts)
  opts = opts or {}
  local master = C.posix_openpt(O_RDWR + O_NOCTTY + O_CLOEXEC)
  assert(master >= 0, "posix_openpt failed")
  assert(C.grantpt(master) == 0 and C.unlockpt(master) == 0, "grantpt/unlockpt failed")
  local slave = ffi.string(C.ptsname(master))
  local ws = ffi.new("unsigned short[4]", opts.rows or 50, opts.cols or 200, 0, 0)
  C.ioctl(master, TIOCSWINSZ, ws)

  local fa, attr = ffi.new("char[256]"), ffi.new("char[512]")
  local sigs = ffi.new("char[128]")
  C.posix_spawn_file_actions_init(fa)
  C.posix_spawn_file_actions_addopen(fa, 0, slave, O_RDWR, 0) -- after setsid: the controlling terminal
  C.posix_spawn_file_actions_adddup2(fa, 0, 1)
  C.posix_spawn_file_actions_adddup2(fa, 0, 2)
  C.posix_spawnattr_init(attr)
  C.posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSID + POSIX_SPAWN_SETSIGDEF + POSIX_SPAWN_SETSIGMASK)
  C.sigemptyset(sigs)
  C.posix_spawnattr_setsigmask(attr, sigs) -- nothing blocked
  C.sigaddset(sigs, SIGINT)
  C.posix_spawnattr_setsigdefault(attr, sigs) -- Ctrl-C as a terminal gives it, whatever ours is
  local cargv, keep_a = cstrings(argv) -- keep_*: the strings the arrays point to, alive
  local cenv, keep_e = cstrings(environment(opts.env or {}))
  local pid = ffi.new("int[1]")
  local rc = C.posix_spawnp(pid, argv[1], fa, attr, cargv, cenv)
  C.posix_spawn_file_actions_destroy(fa)
  C.posix_spawnattr_destroy(attr)
  assert(keep_a and keep_e)
  if rc ~= 0 then
    C.close(master)
    error("posix_spawnp(" .. argv[1] .. ") failed: errno " .. rc, 2)
  end
  return setmetatable({ fd = master, pid = pid[0], raw = "", text = "", pos = 1,
    timeout = opts.timeout or 30 }, P)
end

-- Screen text without escape sequences (CSI, OSC, charset, keypad) and CRs.
local function clean(s)
  s = s:gsub("\27%[[%?%d;]*[%a@]", ""):gsub("\27%][^\7]*\7", ""):gsub("\27[%(%)][%w]", "")
  return (s:gsub("\27[=>]", ""):gsub("\r", ""):gsub("\7", ""))
end

-- Read what is there within ms milliseconds; false once the terminal is closed.
function P:pump(ms)
  local pfd = ffi.new("struct dl_pty_pollfd[1]")
  pfd[0].fd, pfd[0].events = self.fd, POLLIN
  if C.poll(pfd, 1, ms) <= 0 then return true end
  local buf = ffi.new("char[4096]")
  local n = C.read(self.fd, buf, 4096)
  if n <= 0 then return false end
  self.raw = self.raw .. ffi.string(buf, n)
  self.text = clean(self.raw)
  return true
end

function P:send(keys)
  assert(C.write(self.fd, keys, #keys) == #keys, "write to the terminal failed")
end

-- Waits for `what` (plain text) after the last match; returns the text
-- between, and moves past it. Fails with the screen so far on timeout.
function P:expect(what, timeout)
  local deadline = os.time() + (timeout or self.timeout)
  while true do
    local a, b = self.text:find(what, self.pos, true)
    if a then
      local seen = self.text:sub(self.pos, a - 1)
      self.pos = b + 1
      return seen
    end
    if not self:pump(50) or os.time() > deadline then
      error(string.format("pty: no %q within %d s; the screen after the last match:\n%s", what,
        timeout or self.timeout, self.text:sub(self.pos)), 2)
    end
  end
end

-- Everything shown so far (cleaned), for assertions over the whole session.
function P:screen() return self.text end

-- Waits for the child to exit by itself (true, status) or gives up (false).
function P:wait(timeout)
  local st = ffi.new("int[1]")
  local deadline = os.time() + (timeout or self.timeout)
  repeat
    self:pump(50)
    if C.waitpid(self.pid, st, WNOHANG) == self.pid then
      self.pid = nil
      return true, st[0]
    end
  until os.time() > deadline
  return false
end

function P:close()
  local status
  if self.pid then
    C.kill(-self.pid, SIGKILL) -- its whole session's process group: the ranks too
    C.kill(self.pid, SIGKILL)
    local st = ffi.new("int[1]")
    C.waitpid(self.pid, st, 0)
    status, self.pid = st[0], nil
  end
  if self.fd >= 0 then C.close(self.fd) end
  self.fd = -1
  return status
end

return M
