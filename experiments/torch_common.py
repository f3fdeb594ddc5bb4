"""experiments/torch_common.py — the one harness of the PyTorch anchors (experiments/*/*_torch.py).

An anchor is what a distlab figure is judged against, so it is measured the way distlab.bench
measures ours and recorded the way distlab.bench.markdown records ours. Every *_torch.py imports
this module (it imports torch only inside the functions that need it, so that the rest runs,
and is tested, where no torch is installed).

Recording
  commit()                    $DISTLAB_COMMIT, else `git describe --always --dirty` of the checkout
  command(argv)               the command line, the variables that change a run in front (RECORDED:
                              DISTLAB_* but the launcher's, NCCL_*, CUDA_*, CUDNN_*, CUBLAS_*,
                              CUBLASLT_*, TORCH_*, PYTORCH_*, LD_LIBRARY_PATH, as the process
                              started: not what a script set for itself), `torchrun
                              --nproc_per_node N` where torchrun started it
  libraries()                 torch (and the CUDA it was built for), the CUDA runtime and driver,
                              cuDNN, NCCL and cuBLASLt loaded, each with its file ("not loaded"
                              for one the process never opened)
  device_desc(world, backend) "NVIDIA H200", "NVIDIA H200 x 2 (nccl backend)", "cpu"
  run_info(device) -> {device, date, commit, command, libraries}
  header(title, info, extra)  distlab.bench.markdown's header lines; table(head, rows) its tables
  write_markdown(path, title, info, extra, body)
  read_header(path)           a results file's {title, device, date, commit, command, libraries}
                              (distlab.bench.markdown.read_header); {} where it cannot be read
  Csv(path, header)           RFC 4180 (Python's csv module, as distlab.bench.csv reads it),
                              every row flushed (a run cut short keeps its rows); numbers written
                              as distlab.bench.csv writes them (see field); the column names are
                              the ones each Lua bench's --torch reads

Timing (distlab.bench.timing's methods; times in ms, host clock where there is no GPU)
  stats(times)                median (of an even count: the mean of the middle two), min, max,
                              mean, iters
  events(fn, warmup, iters, warm_ms, min_ms, agree)
                              each call between two CUDA events, back to back: timing.events. With
                              warm_ms / min_ms a first estimate (2 + 3 calls) sets the counts: at
                              least `warmup` calls and enough to fill warm_ms, at least `iters`
                              timed calls and enough to fill min_ms. agree(x) -> the max of x over
                              the ranks, where fn is collective (every rank must make the same
                              number of calls)
  each(fn, iters, before)     per call: before() (a barrier), an event, the call, an event, a wait:
                              timing.loop_once with one call, `iters` times -> the list of times
  warm(fn, warm_ms, least, agree, before)
                              warm-up calls filling warm_ms (from 2 timed calls), at least `least`
  capture(fn, ops, mode)      a CUDA graph of `ops` calls of fn (2 eager calls on the capture stream
                              first: they also make NCCL's communicator) -> the graph (.replay());
                              mode: capture_error_mode ("thread_local" for NCCL collectives);
                              raises where fn cannot be captured
  graph(fn, ops, warmup, replays, warm_ms, before, agree, mode)
                              a CUDA graph of `ops` calls, each replay between two events, per call
                              = replay / ops: timing.graph; eager (`ops` calls between events)
                              where fn cannot be captured, the method says so
  l2_flush()                  zero a 256 MB buffer and wait (DeepEP's bench flushes the L2 so): the
                              before() of a call timed alone, so it finds none of the previous
                              call's data in the L2
  host(fn, warmup, batch, batches, sync)
                              the host's issue time per call (us), batches with sync() between:
                              timing.host

Planted errors (distlab.bench.verify's --plant, for the anchors that check their data)
  parse_plant(text)           None | {"kind": "noop"} | {"kind": "scale", "x": X}; PLANT_HELP
  planted(fn, plant, writes, returns)
                              fn planted: noop, fn writes nothing (with returns: its returned tensors
                              poisoned, NaN); scale=X, its outputs (writes: the tensors it writes, or
                              a function giving them) times 1 + X after it. A data check after timing
                              must then fail ("data check failed", exit code 1)

Anchors before and after ours
  Where a device call times PyTorch, then ours, then PyTorch again, the anchor is the mean of the
  two PyTorch runs (a drift of the card's clocks over the call cancels). The Lua benches that
  take several CSVs (attn_bench, gemm_bench: --torch a.csv,b.csv) average them themselves; for
  the others one CSV of the means:

    python3 experiments/torch_common.py mean OUT.csv A.csv B.csv --key impl,m [--runs ms]

  Rows matched on the key columns; a numeric column the mean of the runs with a finite value
  (written with the most decimals the runs had), `wrong` the largest (-1, "not checked", where a
  run has it), a text column as it is
  where the runs agree, else "a / b"; a column `runs` (how many runs had the row) and, with
  --runs COL, COL_runs ("a / b": each run's COL, the spread a reader checks).
"""
import argparse
import csv
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- recording ---------------------------------------------------------------------------------

# What the launchers set themselves: distlab's (as distlab.bench.markdown), and torchrun's agent,
# which sets these two for every worker whatever the command line said
LAUNCHER = {"DISTLAB_ROOT", "DISTLAB_RANK", "DISTLAB_WORLD_SIZE", "DISTLAB_LOCAL_RANK", "DISTLAB_LOCAL_WORLD_SIZE",
            "DISTLAB_DEVICE", "DISTLAB_JOB_ID", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}
# distlab.bench.markdown's RECORDED, and PyTorch's own knobs
RECORDED = re.compile(r"^(DISTLAB_|NCCL_|CUDA_|CUDNN_|CUBLAS_|CUBLASLT_|TORCH_|PYTORCH_)|^LD_LIBRARY_PATH$")


def commit():
    """$DISTLAB_COMMIT, else `git describe --always --dirty` of the checkout (distlab.bench.markdown.commit)."""
    if os.environ.get("DISTLAB_COMMIT"):
        return os.environ["DISTLAB_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except OSError:
        pass
    return "unknown (no git checkout here; set DISTLAB_COMMIT=<hash> to record it)"


def date():
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def recorded(name):
    return name not in LAUNCHER and bool(RECORDED.search(name))


def initial_environ():
    """The environment the process started with (a script's os.environ.setdefault is not the user's)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
    except OSError:
        return dict(os.environ)


def command(argv=None, environ=None):
    argv = sys.argv if argv is None else argv
    env = initial_environ() if environ is None else environ
    words = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if recorded(k)]
    script = os.path.abspath(argv[0]) if argv else "?"
    if script.startswith(ROOT + os.sep):
        script = script[len(ROOT) + 1:]
    if env.get("TORCHELASTIC_RUN_ID") is not None and env.get("LOCAL_WORLD_SIZE"):
        local, world = env["LOCAL_WORLD_SIZE"], env.get("WORLD_SIZE", env["LOCAL_WORLD_SIZE"])
        words.append(f"torchrun --nproc_per_node {local}")
        if world != local and local.isdigit() and world.isdigit():
            words.append(f"--nnodes {int(world) // int(local)}")
    else:
        words.append(shlex.quote(sys.executable or "python3"))
    words.append(shlex.quote(script))
    words += [shlex.quote(a) for a in argv[1:]]
    return " ".join(words)


def _loaded(pattern):
    """The first file mapped into this process whose name matches pattern, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
                if re.search(pattern, os.path.basename(path)):
                    return path
    except OSError:
        pass
    return None


def _c_version(path, fn, out_arg=True):
    """fn's version from the library at path (already loaded: ctypes only finds it again)."""
    import ctypes
    lib = ctypes.CDLL(path)
    if not out_arg:
        f = getattr(lib, fn)
        f.restype = ctypes.c_size_t
        return int(f())
    v = ctypes.c_int(0)
    if getattr(lib, fn)(ctypes.byref(v)) != 0:
        raise OSError(f"{fn} failed")
    return v.value


def _mmp(v):
    """major * 10000 + minor * 100 + patch (cuDNN 9, cuBLASLt, NCCL) -> 9.19.0; cuDNN 8's major * 1000."""
    if v < 20000:
        return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def _cuda(v):
    return f"{v // 1000}.{v % 1000 // 10}"


def libraries():
    """torch, CUDA, cuDNN, NCCL, cuBLASLt as this process has them, each with its file."""
    import torch
    parts = []

    def part(fn):
        try:
            parts.append(fn())
        except Exception as e:  # noqa: BLE001 (a version that cannot be read is said so, not fatal)
            parts.append(f"{fn.__name__}: unknown ({type(e).__name__})")

    def torch_():
        return f"torch {torch.__version__} (built for CUDA {torch.version.cuda})"

    def cuda():
        path = _loaded(r"^libcudart\.so")
        rt = f"CUDA runtime {_cuda(_c_version(path, 'cudaRuntimeGetVersion'))} ({path})" if path else \
            "CUDA runtime: not a shared library here"
        drv = _loaded(r"^libcuda\.so")
        return rt + (f", driver {_cuda(_c_version(drv, 'cuDriverGetVersion'))}" if drv else ", no driver loaded")

    def cudnn():
        path = _loaded(r"^libcudnn\.so")
        v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return f"cuDNN {_mmp(v)} ({path or 'linked statically'})" if v else "cuDNN not loaded"

    def nccl():
        path = _loaded(r"^libnccl\.so")
        if not path:
            return "NCCL not loaded"
        v = torch.cuda.nccl.version()
        return f"NCCL {'.'.join(str(x) for x in v) if isinstance(v, tuple) else _mmp(v)} ({path})"

    def cublaslt():
        path = _loaded(r"^libcublasLt\.so")
        return f"cuBLASLt {_mmp(_c_version(path, 'cublasLtGetVersion', False))} ({path})" if path else \
            "cuBLASLt not loaded"

    for fn in (torch_, cuda, cudnn, nccl, cublaslt):
        part(fn)
    return "; ".join(parts)


def device_desc(world=None, backend=None):
    """The GPU model (x world, with the backend), or cpu: distlab.bench.markdown.run_info's device."""
    import torch
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    if world is None:
        return name
    return f"{name} x {world}" + (f" ({backend} backend)" if backend else "")


def run_info(device=None):
    """The header facts, read at the end of a run (the libraries it loaded by then)."""
    return {"device": device or device_desc(), "date": date(), "commit": commit(), "command": command(),
            "libraries": libraries()}


def code(s):
    s = str(s)
    return f"`` {s} ``" if "`" in s else f"`{s}`"


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def header(title, info, extra=()):
    """distlab.bench.markdown.header: title, device, date, commit, command (and ran_as, the process's own
    line where the command is a wrapper's), libraries, then extra."""
    lines = [f"# {title}", "", f"- device: {info['device']}", f"- date: {info['date']}",
             f"- commit: {code(info['commit'])}", f"- command: {code(info['command'])}"]
    if info.get("ran_as"):
        lines.append(f"- ran as: {code(info['ran_as'])}")
    lines.append(f"- libraries: {info['libraries']}")
    lines += [x if x.startswith("- ") else "- " + x for x in extra]
    return lines


def table(head, rows, align=None):
    """distlab.bench.markdown.table: the first column left-aligned, the others right, unless align says."""
    sep = ["---:" if (align[i] if align else ("l" if i == 0 else "r")) == "r" else "---" for i in range(len(head))]
    out = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "|".join(sep) + "|"]
    for r in rows:
        out.append("| " + " | ".join("-" if v is None else cell(v) for v in r) + " |")
    return out


def write_markdown(path, title, info, extra, body):
    with open(path, "w") as f:
        f.write("\n".join(header(title, info, extra) + [""] + list(body)) + "\n")
    return path


def read_header(path):
    out = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("## "):
                    break
                m = re.match(r"^# (.*)$", line.rstrip("\n"))
                if m and "title" not in out:
                    out["title"] = m.group(1)
                m = re.match(r"^- (device|date|commit|command|libraries): (.*)$", line.rstrip("\n"))
                if m and m.group(1) not in out:
                    v = m.group(2)
                    q = re.match(r"^`` (.*) ``$", v) or re.match(r"^`(.*)`$", v)
                    out[m.group(1)] = q.group(1) if q else v
    except OSError:
        pass
    return out


def field(v):
    """A CSV cell as distlab.bench.csv.field writes a number: an integer as %d, another number as %.17g;
    text (a number already formatted: choose its precision with an f-string) as it is."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return "%d" % v
    if isinstance(v, float):
        if v == v and v not in (math.inf, -math.inf) and v == math.floor(v) and abs(v) < 2 ** 53:
            return "%d" % v
        return "%.17g" % v
    return str(v)


class Csv:
    """Csv(path, header): .row(cells or {name: value}), .close(); every row flushed."""

    def __init__(self, path, head):
        self.path, self.header = path, list(head)
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f, lineterminator="\n")
        self.w.writerow(self.header)
        self.f.flush()

    def row(self, r):
        cells = [r.get(k) for k in self.header] if isinstance(r, dict) else list(r)
        if len(cells) != len(self.header):
            raise ValueError(f"{self.path}: a row of {len(cells)} cells under {len(self.header)} columns")
        self.w.writerow([field(c) for c in cells])
        self.f.flush()

    def close(self):
        if self.f:
            self.f.close()
            self.f = None


# ---- timing ------------------------------------------------------------------------------------

def stats(times):
    t = sorted(times)
    if not t:
        raise ValueError("no times to summarise")
    return {"median": statistics.median(t), "min": t[0], "max": t[-1], "mean": sum(t) / len(t), "iters": len(t),
            "times": t}


def _cuda_ok():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _sync():
    if _cuda_ok():
        import torch
        torch.cuda.synchronize()


def each(fn, iters, before=None):
    """timing.loop_once with one call, `iters` times: per call before(), an event, the call, an event,
    a wait. The list of ms (host clock without a GPU)."""
    out = []
    cuda = _cuda_ok()
    if cuda:
        import torch
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        if before:
            before()
        if cuda:
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            out.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def warm(fn, warm_ms, least=0, agree=None, before=None):
    """Warm-up calls filling warm_ms, at least `least`, counted from the slower of 2 timed calls (agree:
    the slowest rank's, so every rank makes the same number); returns the count."""
    n = least
    if warm_ms:
        est = max(each(fn, 2, before))
        est = agree(est) if agree else est
        n = max(least, math.ceil(warm_ms / max(est, 1e-3)))
    for _ in range(n):
        fn()
    _sync()
    return n


def _back_to_back(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    if not _cuda_ok():
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    import torch
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) for i in range(iters)]


def events(fn, warmup=5, iters=20, warm_ms=None, min_ms=None, agree=None):
    """distlab.bench.timing.events -> stats (ms per call)."""
    if warm_ms or min_ms:
        est = max(stats(_back_to_back(fn, 2, 3))["median"], 1e-3)
        est = agree(est) if agree else est
        warmup = max(warmup, math.ceil((warm_ms or 0) / est))
        iters = max(iters, math.ceil((min_ms or 0) / est))
    return stats(_back_to_back(fn, warmup, iters))


def capture(fn, ops=1, mode=None):
    """A CUDA graph of `ops` calls of fn, after 2 eager calls on the capture stream (they make what fn
    makes lazily: NCCL's communicator and its peers' connections, cuBLAS's handle) -> the
    torch.cuda.CUDAGraph. mode: torch.cuda.graph's capture_error_mode ("thread_local" lets other
    threads, NCCL's and PyTorch's watchdog, make their calls during the capture, as nccl-tests
    captures); default torch's ("global"). Raises where fn cannot be captured (a host read, a sync)."""
    import torch
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream, **({"capture_error_mode": mode} if mode else {})):
        for _ in range(ops):
            fn()
    torch.cuda.synchronize()
    return g


_L2_FLUSH = []


def l2_flush():
    """Zero a 256 MB device buffer (made once) and wait: DeepEP's bench does so before each call it
    times alone, so that the call finds nothing of the previous one in the L2 (50 MB on an H200). No-op
    without a GPU."""
    if not _cuda_ok():
        return
    import torch
    if not _L2_FLUSH:
        _L2_FLUSH.append(torch.empty(256 * 10 ** 6 // 4, dtype=torch.int32, device="cuda"))
    _L2_FLUSH[0].zero_()
    torch.cuda.synchronize()


def graph(fn, ops=10, warmup=5, replays=50, warm_ms=None, before=None, agree=None, mode=None):
    """distlab.bench.timing.graph -> (stats of ms per call, method): a graph of `ops` calls (2 eager calls
    on the capture stream first), warm-up replays (at least `warmup`, filling warm_ms), before() (a
    barrier), then `replays` replays each between two events; "eager (Error)" where capture failed."""
    import torch
    method = "graph"
    try:
        run = capture(fn, ops, mode).replay
    except Exception as e:  # noqa: BLE001 (not capturable here: timed eagerly, and the method says so)
        torch.cuda.synchronize()
        method = "eager (%s)" % type(e).__name__

        def run():
            for _ in range(ops):
                fn()

    warm(run, warm_ms, warmup, agree)
    if before:
        before()
    times = _back_to_back(run, 0, replays)
    return stats([t / ops for t in times]), method


def host(fn, warmup=2000, batch=256, batches=200, sync=None):
    """distlab.bench.timing.host -> stats (us per call): only the issue time of each batch counts."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch * 1e6)
        sync()
    return stats(samples)


# ---- planted errors ----------------------------------------------------------------------------

PLANT_HELP = ("plant an error into the timed op, to show the data check sees it: noop (the op returns without "
              "writing) or scale=X (its outputs times 1 + X)")


def symm_mem_for(group_name):
    """torch's symmetric memory module with the CUDA backend chosen and `group_name` enabled
    (the calls torch 2.11 still needs and later versions drop); raises where it is missing."""
    import warnings

    import torch.distributed._symmetric_memory as symm_mem

    if hasattr(symm_mem, "set_backend"):
        try:
            symm_mem.set_backend("CUDA")
        except Exception:
            pass
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(group_name)
    return symm_mem


def parse_plant(text):
    """distlab.bench.verify.parse_plant: None | {"kind": "noop"} | {"kind": "scale", "x": X}."""
    if text in (None, "", "none"):
        return None
    if text == "noop":
        return {"kind": "noop", "text": text}
    m = re.match(r"^scale=(.+)$", text)
    x = _num(m.group(1)) if m else None
    if x is not None and x != 0 and x == x and x > -1:
        return {"kind": "scale", "x": x, "text": text}
    raise ValueError(f"--plant: expected noop or scale=X (X a number > -1, not 0), got {text!r}")


def _poison(t):
    return t.fill_(float("nan"))


def _tensors(v):
    """The float tensors among v (a tensor, or a tuple's items)."""
    return [x for x in (v if isinstance(v, (list, tuple)) else [v])
            if hasattr(x, "fill_") and (not hasattr(x, "is_floating_point") or x.is_floating_point())]


def planted(fn, plant, writes=None, returns=False):
    """distlab.bench.verify.planted: fn as `plant` says. writes: the (float) tensors fn writes, or a function
    giving them; returns: fn returns its outputs (a tensor, or a tuple whose tensors are)."""
    if not plant:
        return fn
    if writes is None and not returns:
        raise ValueError("planted: say which outputs the op writes (writes=[...] or returns=True)")

    def outs():
        return list(writes() if callable(writes) else writes or [])

    if plant["kind"] == "noop":
        if returns:
            def noop_returning(*a):
                r = fn(*a)
                for t in _tensors(r):
                    _poison(t)
                return r
            return noop_returning
        return lambda *a: None
    factor = 1 + plant["x"]

    def scaled(*a):
        r = fn(*a)
        for t in outs() + (_tensors(r) if returns else []):
            t.mul_(factor)
        return r
    return scaled


# ---- the mean of runs --------------------------------------------------------------------------

def _num(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return v


def _decimals(s):
    m = re.match(r"^-?\d*\.(\d+)$", s.strip())
    return len(m.group(1)) if m else 0


def mean(paths, key, out, runs_col=None):
    """The rows of several runs of one script, as one CSV of their means (see the module's header)."""
    heads, tables = None, []
    for p in paths:
        with open(p, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            raise ValueError(f"{p} is empty")
        if heads is None:
            heads = rows[0]
        elif rows[0] != heads:
            raise ValueError(f"{p}: columns {rows[0]} differ from {paths[0]}'s {heads}")
        tables.append([dict(zip(heads, r)) for r in rows[1:] if r])
    missing = [k for k in key if k not in heads]
    if missing:
        raise ValueError(f"key columns {missing} not in {heads}")
    if runs_col and runs_col not in heads:
        raise ValueError(f"--runs {runs_col}: no such column in {heads}")
    order, groups = [], {}
    for t in tables:
        for r in t:
            k = tuple(r[c] for c in key)
            if k not in groups:
                order.append(k)
                groups[k] = []
            groups[k].append(r)
    extra = ["runs"] + ([runs_col + "_runs"] if runs_col else [])
    w = Csv(out, heads + extra)
    for k in order:
        rs = groups[k]
        cells = []
        for c in heads:
            vals = [r[c] for r in rs]
            nums = [_num(v) for v in vals]
            if c in key or all(v == vals[0] for v in vals) and c != "wrong":
                cells.append(vals[0])
            elif all(n is not None for n in nums):
                fin = [n for n in nums if math.isfinite(n)]
                if c == "wrong":  # any wrong data shows; a run that could not check (-1) too
                    cells.append(field(-1 if min(nums) < 0 else max(nums)))
                elif not fin:
                    cells.append("nan")
                else:
                    cells.append(f"{sum(fin) / len(fin):.{max(_decimals(v) for v in vals)}f}")
            else:
                cells.append(" / ".join(vals))
        cells.append(len(rs))
        if runs_col:
            cells.append(" / ".join(r[runs_col] for r in rs))
        w.row(cells)
    w.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="tools of the PyTorch anchors' harness (see the module's header)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mean", help="one CSV of the means of several runs' CSVs")
    m.add_argument("out")
    m.add_argument("runs", nargs="+")
    m.add_argument("--key", required=True, help="the columns that name a row, comma-separated")
    m.add_argument("--runs", dest="runs_col", help="also list each run's value of this column")
    a = ap.parse_args(argv)
    if a.cmd == "mean":
        mean(a.runs, [k for k in a.key.split(",") if k], a.out, a.runs_col)
        print(f"wrote {a.out} (the mean of {len(a.runs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
