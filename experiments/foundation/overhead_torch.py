"""PyTorch eager's per-op host cost, measured the way experiments/overhead.lua
measures distlab's: x.fill_(1) on a 1-element tensor, issued in batches of 256
with a synchronize between batches, median issue time per call."""
import sys
import time

import torch


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
    samples.sort()
    return samples[(len(samples) - 1) // 2]


rows = []
c = torch.empty(1)
rows.append(("cpu", "x.fill_(1), 1 element", per_call(lambda: c.fill_(1), lambda: None, 10000, 50)))
for i in range(torch.cuda.device_count()):
    dev = f"cuda:{i} {torch.cuda.get_device_name(i)}"
    g = torch.empty(1, device=f"cuda:{i}")
    h = torch.empty(1, device=f"cuda:{i}")
    sync = torch.cuda.synchronize
    rows.append((dev, "x.fill_(1), 1 element", per_call(lambda: g.fill_(1), sync, 256, 200)))
    rows.append((dev, "x.add_(y), 1 element", per_call(lambda: g.add_(h), sync, 256, 200)))
print(f"PyTorch {torch.__version__} eager op overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
for r in rows:
    print(f"{r[0]:<28} {r[1]:<34} {r[2]:8.3f} us")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        f.write("| device | op | us per call |\n|---|---|---|\n")
        for r in rows:
            f.write(f"| {r[0]} | PyTorch {r[1]} | {r[2]:.3f} |\n")
