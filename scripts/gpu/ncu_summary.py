"""scripts/gpu/ncu_summary.py — Nsight Compute's raw pages side by side, as markdown (stdlib only).

    python3 scripts/gpu/ncu_summary.py [-o OUT.md] [--title TEXT] [--preamble FILE] LABEL=RAW.csv ...

Each RAW.csv is `ncu -i REPORT.ncu-rep --page raw --csv`: a row of column names (ID, Process ID,
Process Name, Host Name, Kernel Name, Context, Stream, Block Size, Grid Size, Device, CC, then one
column a metric), a row of units (empty under the first columns; taken as absent where the second
row has an ID), then a row a profiled kernel; lines ncu prints before the names (==PROF==,
==WARNING==) are skipped. Every profiled kernel is a column (LABEL; LABEL#2, ... where a report
holds several; a report that is missing or holds no kernel is a column of dashes, named under
"Reports"). Rows are the metrics of each group below, found by name in the union of the reports'
columns: every metric a group's patterns match is printed (none is guessed, and a metric shows in
the first group that matches it). Under "Warp stalls" a second table gives each stall reason's
share of a kernel's PC samples (smsp__pcsamp_warps_issue_stalled_<reason> over their sum, the
_not_issued ones left out), the largest first. Numbers are printed as ncu wrote them, without its
thousands separators. Exit code 1 where no report holds a kernel.
scripts/gpu/attn_prof.sh writes its attn-prof-summary.md with this (--preamble: its header).
"""
import argparse
import csv
import re
import sys

FIXED = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
         "Grid Size", "Device", "CC"]

# (title, patterns searched in a metric's name, case-insensitive)
GROUPS = [
    ("Time, clocks, launch (registers, shared memory per block, occupancy limits)",
     [r"^gpu__time_duration\.sum$", r"cycles_elapsed\.avg\.per_second$", r"^gpc__cycles_elapsed\.max$",
      r"^sm__cycles_active\.avg$", r"^launch__"]),
    ("Occupancy and throughput",
     [r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$", r"^sm__maximum_warps_per_active_cycle_pct$",
      r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$",
      r"^gpu__compute_memory_throughput\.avg\.pct_of_peak_sustained_elapsed$",
      r"^dram__throughput\.avg\.pct_of_peak_sustained_elapsed$", r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$",
      r"^l1tex__throughput\.avg\.pct_of_peak_sustained_active$"]),
    ("Tensor pipe (wgmma)", [r"tensor", r"gmma"]),
    ("Shared memory (pipe, wavefronts, bank conflicts)", [r"shared", r"bank", r"^l1tex__data_pipe_lsu_wavefronts"]),
    ("Issue and IPC",
     [r"__issue_active\.", r"^sm__inst_executed\.", r"^smsp__inst_executed\.", r"^sm__inst_issued\.",
      r"^smsp__inst_issued\.", r"^sm__instruction_throughput", r"warps_eligible", r"^smsp__warps_active\."]),
    ("Warp stalls", [r"pcsamp_warps_issue_stalled_", r"warp_latency_issue_stalled_", r"warps_issue_stalled_",
                     r"warp_state", r"pcsamp_sample_count"]),
]
STALL_SAMPLES = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+)$")


def read_raw(path):
    """(names, units, rows) of one raw page: rows as dicts by column name; ([], {}, []) when the file is
    missing or holds no header."""
    try:
        with open(path, newline="") as f:
            lines = f.read().splitlines()
    except OSError:
        return [], {}, []
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return [], {}, []
    recs = list(csv.reader(lines[start:]))
    names = recs[0]
    # the units row has no ID (a report's rows all have one); taken as absent where the second row has one
    has_units = len(recs) > 1 and recs[1][:1] == [""]
    units = dict(zip(names, recs[1])) if has_units else {}
    rows = [dict(zip(names, r)) for r in recs[2 if has_units else 1:] if len(r) == len(names)]
    return names, units, rows


def number(s):
    """ncu's value as a float (thousands separators dropped), or None."""
    try:
        return float(str(s).replace(",", "").strip())
    except ValueError:
        return None


def cell(s):
    if s is None or s == "":
        return "—"
    v = number(s)
    if v is None:
        return str(s).replace("|", "\\|")
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.4g}"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def summarize(pairs, title, preamble):
    cols, notes, units = [], [], []  # cols: (label, row dict or None); units: each column's {metric: unit}
    for label, path in pairs:
        names, u, rows = read_raw(path)
        if not rows:
            notes.append(f"- {label}: no profiled kernel in `{path}` (missing, empty, or ncu profiled nothing)")
            cols.append((label, None))
            units.append({})
            continue
        for i, r in enumerate(rows):
            cols.append((label if i == 0 else f"{label}#{i + 1}", r))
            units.append(u)
    metrics = []
    for _, r in cols:
        for k in (r or {}):
            if k not in FIXED and k not in metrics:
                metrics.append(k)
    labels = [c for c, _ in cols]
    out = [f"# {title}", ""] + (preamble.rstrip("\n").split("\n") + [""] if preamble else [])
    out += ["## Reports", ""]
    for label, r in cols:
        if r:
            out.append(f"- {label}: `{r.get('Kernel Name', '?')}`, grid {r.get('Grid Size', '?')}, block "
                       f"{r.get('Block Size', '?')}, device {r.get('Device', '?')} (CC {r.get('CC', '?')}), "
                       f"process {r.get('Process Name', '?')}")
    out += notes + [""]
    shown = set()
    for gtitle, pats in GROUPS:
        rx = [re.compile(p, re.I) for p in pats]
        mine = sorted(m for m in metrics if m not in shown and any(x.search(m) for x in rx))
        shown.update(mine)
        out += [f"## {gtitle}", ""]
        if not mine:
            out += ["No metric of the reports matches " + ", ".join(f"`{p}`" for p in pats) + ".", ""]
            continue
        rows = [metric_row(m, cols, units) for m in mine]
        out += table(["metric", "unit"] + labels, rows) + [""]
        if gtitle == "Warp stalls":
            out += stall_shares(cols, labels, metrics)
    return "\n".join(out) + "\n"


def metric_row(m, cols, units):
    """A metric's table row. ncu scales a unit per report (the same duration is "ms" in one and "us" in
    another), so where the columns' units differ, each cell carries its own and the unit column says so."""
    have = {u.get(m, "") or "" for (_, r), u in zip(cols, units) if r and r.get(m) not in (None, "")}
    if len(have) <= 1:
        return [f"`{m}`", next(iter(have), "")] + [cell(r.get(m)) if r else "—" for _, r in cols]
    cells = [(f"{cell(r.get(m))} {u.get(m, '')}".rstrip() if r.get(m) not in (None, "") else cell(r.get(m)))
             if r else "—" for (_, r), u in zip(cols, units)]
    return [f"`{m}`", "(each cell's)"] + cells


def stall_shares(cols, labels, metrics):
    """Each stall reason's share of a kernel's PC samples, the reasons with the largest share first."""
    reasons = [(STALL_SAMPLES.match(m).group(1), m) for m in metrics
               if STALL_SAMPLES.match(m) and not m.endswith("_not_issued")]
    if not reasons:
        return []
    share = {}
    for label, r in cols:
        vals = {m: number(r.get(m)) if r else None for _, m in reasons}
        total = sum(v for v in vals.values() if v)
        share[label] = {m: (100 * v / total if total and v is not None else None) for m, v in vals.items()}
    order = sorted(reasons, key=lambda x: -max((share[l][x[1]] or 0) for l in labels))
    rows = [[f"`{reason}`"] + [("—" if share[l][m] is None else f"{share[l][m]:.1f}") for l in labels]
            for reason, m in order]
    return ["Share of each kernel's stall samples by reason (%, `smsp__pcsamp_warps_issue_stalled_<reason>` "
            "over their sum, `_not_issued` left out):", ""] + table(["reason"] + labels, rows) + [""]


def main(argv=None):
    ap = argparse.ArgumentParser(description="Nsight Compute raw pages side by side, as markdown")
    ap.add_argument("reports", nargs="+", metavar="LABEL=RAW.csv")
    ap.add_argument("-o", "--out", help="markdown file to write (default: stdout)")
    ap.add_argument("--title", default="Nsight Compute, side by side")
    ap.add_argument("--preamble", help="a markdown file put under the title (device, date, commit, commands)")
    a = ap.parse_args(argv)
    pairs = []
    for x in a.reports:
        label, eq, path = x.partition("=")
        if not eq or not label or not path:
            ap.error(f"expected LABEL=RAW.csv, got {x!r}")
        pairs.append((label, path))
    preamble = ""
    if a.preamble:
        with open(a.preamble) as f:
            preamble = f.read()
    text = summarize(pairs, a.title, preamble)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0 if any(read_raw(p)[2] for _, p in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
