"""PyTorch eager's per-op host cost, measured the way experiments/foundation/overhead.lua
measures distlab's: x.fill_(1) on a 1-element tensor, 2000 warm-up calls, then
batches of calls (10000 x 50 on the cpu, 256 x 200 on a GPU) with a synchronize
between batches, the median issue time per call (the median of an even count:
the mean of the middle two, as distlab.bench.timing).

  python3 experiments/foundation/overhead_torch.py [--out DIR] [--tag NAME]

Prints the table; writes DIR/overhead-torch-TAG.{md,csv} (default
experiments/results/foundation; TAG the GPU model, e.g. h200, or cpu), the
markdown headed by device, date, commit and command as distlab.bench.markdown
heads its files, the CSV through Python's csv module (RFC 4180).
"""
import argparse
import csv
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def per_call(fn, sync, batch, batches):
    for _ in range(2000):
        fn()
    sync()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch * 1e6)
        sync()
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments/results/foundation"), help="results folder")
    ap.add_argument("--tag", default=None, help="machine name in file names (default: GPU model, or cpu)")
    a = ap.parse_args()
    n = torch.cuda.device_count()
    gpu = torch.cuda.get_device_name(0) if n > 0 else None
    tag = a.tag or ((re.search(r"[AHBL]\d+", gpu).group(0).lower() if gpu and re.search(r"[AHBL]\d+", gpu) else "gpu")
                    if gpu else "cpu")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = "python3 " + " ".join(shlex.quote(x) for x in sys.argv)

    rows = []
    c = torch.empty(1)
    rows.append(("cpu", "x.fill_(1), 1 element", per_call(lambda: c.fill_(1), lambda: None, 10000, 50)))
    for i in range(n):
        dev = f"cuda:{i} {torch.cuda.get_device_name(i)}"
        g = torch.empty(1, device=f"cuda:{i}")
        h = torch.ones(1, device=f"cuda:{i}")
        sync = torch.cuda.synchronize
        rows.append((dev, "x.fill_(1), 1 element", per_call(lambda: g.fill_(1), sync, 256, 200)))
        rows.append((dev, "x.add_(y), 1 element", per_call(lambda: g.add_(h), sync, 256, 200)))
    print(f"PyTorch {torch.__version__} eager op overhead, {date}")
    for r in rows:
        print(f"{r[0]:<28} {r[1]:<34} {r[2]:8.3f} us")

    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"overhead-torch-{tag}")
    with open(base + ".csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["device", "op", "us_per_call"])
        for r in rows:
            w.writerow([r[0], "PyTorch " + r[1], f"{r[2]:.3f}"])
    with open(base + ".md", "w") as f:
        f.write(f"# PyTorch eager op overhead: {tag}\n\n")
        f.write(f"- device: {'cpu and %d x %s' % (n, gpu) if gpu else 'cpu'}\n- date: {date}\n")
        f.write(f"- commit: `{commit()}`\n- command: `{command}`\n- PyTorch {torch.__version__}\n")
        f.write("- method: 2000 warm-up calls; batches of calls (10000 x 50 on the cpu, 256 x 200 on a GPU) with a "
                "synchronize between them, only the issue time counted; median over batches\n\n")
        f.write("| device | op | us per call |\n|---|---|---:|\n")
        for r in rows:
            f.write(f"| {r[0]} | PyTorch {r[1]} | {r[2]:.3f} |\n")
    print(f"wrote {base}.csv and {base}.md")


if __name__ == "__main__":
    main()
