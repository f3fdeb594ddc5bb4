"""PyTorch eager's per-op host cost, measured the way experiments/foundation/overhead.lua
measures distlab's: x.fill_(1) on a 1-element tensor, 2000 warm-up calls, then
batches of calls (10000 x 50 on the cpu, 256 x 200 on a GPU) with a synchronize
between batches, the median issue time per call (the median of an even count:
the mean of the middle two): experiments/torch_common.py's host, distlab.bench.timing.host.

  python3 experiments/foundation/overhead_torch.py [--out DIR] [--tag NAME]

Prints the table; writes DIR/overhead-torch-TAG.{md,csv} (default
experiments/results/foundation; TAG the GPU model, e.g. h200, or cpu), the
markdown headed by device, date, commit, command and libraries as
distlab.bench.markdown heads its files, the CSV through Python's csv module (RFC 4180).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

import torch  # noqa: E402


def per_call(fn, sync, batch, batches):
    return tc.host(fn, warmup=2000, batch=batch, batches=batches, sync=sync)["median"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(tc.ROOT, "experiments/results/foundation"), help="results folder")
    ap.add_argument("--tag", default=None, help="machine name in file names (default: GPU model, or cpu)")
    a = ap.parse_args()
    n = torch.cuda.device_count()
    gpu = torch.cuda.get_device_name(0) if n > 0 else None
    tag = a.tag or ((re.search(r"[AHBL]\d+", gpu).group(0).lower() if gpu and re.search(r"[AHBL]\d+", gpu) else "gpu")
                    if gpu else "cpu")

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
    print(f"PyTorch {torch.__version__} eager op overhead, {tc.date()}")
    for r in rows:
        print(f"{r[0]:<28} {r[1]:<34} {r[2]:8.3f} us")

    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"overhead-torch-{tag}")
    w = tc.Csv(base + ".csv", ["device", "op", "us_per_call"])
    for r in rows:
        w.row([r[0], "PyTorch " + r[1], f"{r[2]:.3f}"])
    w.close()
    tc.write_markdown(base + ".md", f"PyTorch eager op overhead: {tag}",
                      tc.run_info("cpu and %d x %s" % (n, gpu) if gpu else "cpu"), [
        "method: 2000 warm-up calls; batches of calls (10000 x 50 on the cpu, 256 x 200 on a GPU) with a "
        "synchronize between them, only the issue time counted; median over batches"],
        tc.table(["device", "op", "us per call"], [[r[0], "PyTorch " + r[1], f"{r[2]:.3f}"] for r in rows]))
    print(f"wrote {base}.csv and {base}.md")


if __name__ == "__main__":
    main()
