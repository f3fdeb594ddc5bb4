/*
 * sigint.c — Ctrl-C for an interactive session (the REPL) without dying.
 *
 * LuaJIT cannot run Lua code in a signal handler (an FFI callback there
 * would re-enter the VM at an arbitrary instruction), and its own handler
 * ends the script with "interrupted!". So the handler here only counts, and
 * Lua polls the count at safe points: a debug hook between instructions
 * while a chunk runs, readline's signal hook at the prompt, the loops where
 * ranks wait for each other. SA_RESTART keeps the library's blocking calls
 * (socket reads, writes) as they were; poll, select and nanosleep return
 * early as they always do, and their callers loop.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static int pending; /* SIGINTs not yet taken; atomic: any thread may run the handler */
static int armed;
static struct sigaction before;

static void on_sigint(int sig) {
  (void)sig;
  __atomic_add_fetch(&pending, 1, __ATOMIC_RELAXED);
}

int dl_sigint_arm(int on) {
  if (!on == !armed) return DL_OK;
  if (on) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, &before) != 0) return DL_ERR(DL_EIO, "sigaction(SIGINT) failed");
    __atomic_store_n(&pending, 0, __ATOMIC_RELAXED);
  } else if (sigaction(SIGINT, &before, NULL) != 0) {
    return DL_ERR(DL_EIO, "sigaction(SIGINT) could not restore the previous handler");
  }
  armed = on != 0;
  return DL_OK;
}

int dl_sigint_take(void) { return __atomic_exchange_n(&pending, 0, __ATOMIC_ACQ_REL); }

/* One Ctrl-C is the REPL's (it stops Lua code at its hook); a second during a
 * C wait means the user wants out of that wait. */
int dl_sigint_pending(void) { return armed ? __atomic_load_n(&pending, __ATOMIC_ACQUIRE) : -1; }
