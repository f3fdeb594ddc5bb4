#!/usr/bin/env python3
"""The A/B report of scripts/gpu/attn_ab.sh: one attn_bench run a variant and round, in RUNS/d<D>-<variant>-r<round>/
(attn-distlab.csv and .md, the bench's own results), into a results file's body.

    attn_ab_report.py RUNS D VARIANTS OUT_CSV OUT_MD

VARIANTS: the script's list, "NAME:LIB[:VAR=V,...]" separated by spaces; the first is the base every other is set
against. OUT_CSV: every run's rows with d, variant and round columns in front. OUT_MD: the runs' headers (date,
commit, command, libraries, kernels), a table a head dim of base ms and each variant's speed-up over base in the
same round (base ms / variant ms, forward then backward), and each variant's ranges (forward; backward without a
mask and causal). A run that is missing, or a row whose check is not ok, is named under "Failed" and makes the
exit status 1: a speed-up is only read from rows that were checked.
"""
import csv
import os
import re
import sys


def read_runs(runs, d, names):
    """Every variant's run of every round that any variant has (at least round 1)"""
    rows, heads, missing = [], {}, []
    found = {m.group(2) for f in os.listdir(runs) for m in [re.fullmatch(rf"d{d}-([a-z0-9]+)-r(\d+)(\.log)?", f)] if m}
    for v in names:
        for r in sorted(found | {"1"}, key=int):
            base = os.path.join(runs, f"d{d}-{v}-r{r}")
            path = os.path.join(base, "attn-distlab.csv")
            if not os.path.isfile(path):
                missing.append(f"d{d}-{v}-r{r}: no attn-distlab.csv (the run failed or did not start; its log: d{d}-{v}-r{r}.log)")
                continue
            with open(path) as f:
                for x in csv.DictReader(f):
                    x.update(d=str(d), variant=v, round=r)
                    rows.append(x)
            md = os.path.join(base, "attn-distlab.md")
            if os.path.isfile(md):
                with open(md) as f:
                    heads[(v, r)] = [l.rstrip("\n") for l in f if l.startswith("- ")]
    return rows, heads, missing


def main(argv):
    if len(argv) != 6:
        sys.exit(__doc__)
    runs, d, variants, out_csv, out_md = argv[1], int(argv[2]), argv[3].split(), argv[4], argv[5]
    names = [v.split(":")[0] for v in variants]
    if len(names) < 2 or len(set(names)) != len(names):
        sys.exit("attn_ab_report: VARIANTS needs two or more distinct names, got %r" % argv[3])
    rows, heads, failed = read_runs(runs, d, names)
    failed += [f"d{d}-{x['variant']}-r{x['round']} {x['layout']} {x['mask']} s {x['s']}: check {x['check']} (rel err {x['rel_err']})"
               for x in rows if x["check"] != "ok"]
    if rows:
        keys = ["d", "variant", "round"] + [k for k in rows[0] if k not in ("d", "variant", "round")]
        with open(out_csv, "w") as f:
            w = csv.DictWriter(f, keys, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    at = {(x["variant"], x["round"], x["layout"], x["mask"], x["s"]): x for x in rows if x["check"] == "ok"}
    rounds = sorted({x["round"] for x in rows}, key=int)
    shapes = []
    for x in rows:
        k = (x["layout"], x["mask"], x["s"])
        if k not in shapes:
            shapes.append(k)
    base = names[0]

    def ms(v, r, k, col):
        x = at.get((v, r) + k)
        return float(x[col]) if x else None

    def sp(v, r, k, col):
        b, t = ms(base, r, k, col), ms(v, r, k, col)
        return b / t if b and t else None

    fmt = lambda x: "—" if x is None else "%.3f" % x
    out = [f"# attn A/B, d {d}: {' '.join(names)} (scripts/gpu/attn_ab.sh)", ""]
    out.append("Each run's header (attn_bench's own results file, `%s/d%d-<variant>-r<round>/attn-distlab.md`):" % (os.path.basename(runs.rstrip('/')), d))
    out.append("")
    for v in names:
        for r in rounds:
            h = heads.get((v, r))
            if h:
                pick = [l for l in h if l.startswith(("- date", "- commit", "- command", "- libraries", "- backend ours"))]
                out.append(f"- **{v}, round {r}**")
                out += ["  " + l for l in pick]
    out += ["", f"Speed-up over {base} in the same round ({base} ms / variant ms; > 1 faster), forward, backward; rounds separated by ';'.", ""]
    out.append("| layout | mask | s | %s fwd ms | %s bwd ms | " % (base, base) + " | ".join(f"{v} fwd, bwd" for v in names[1:]) + " |")
    out.append("|---|---|---:|---|---|" + "---|" * (len(names) - 1))
    for k in shapes:
        cells = [", ".join(fmt(ms(base, r, k, c)) for r in rounds) for c in ("fwd_ms", "bwd_ms")]
        for v in names[1:]:
            cells.append("; ".join(f"{fmt(sp(v, r, k, 'fwd_ms'))}, {fmt(sp(v, r, k, 'bwd_ms'))}" for r in rounds))
        out.append(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    out += ["", "Ranges over every shape and round (min-max of the speed-ups above):", ""]
    for v in names[1:]:
        def rng(col, mask=None):
            xs = [sp(v, r, k, col) for r in rounds for k in shapes if mask is None or k[1] == mask]
            xs = [x for x in xs if x is not None]
            return "%.3f-%.3f" % (min(xs), max(xs)) if xs else "—"
        out.append(f"- {v}: forward {rng('fwd_ms')}; backward without a mask {rng('bwd_ms', 'none')}, causal {rng('bwd_ms', 'causal')}")
    ok = sum(1 for x in rows if x["check"] == "ok")
    errs = [float(x["rel_err"]) for x in rows if x["check"] == "ok"]
    out += ["", f"Checked against fp64 (attn_bench's check, every run's every shape): {ok} of {len(rows)} rows ok" +
            (f" (rel err {min(errs):.2e} to {max(errs):.2e})" if errs else "")]
    if failed:
        out += ["", "## Failed", ""] + ["- " + x for x in failed]
    with open(out_md, "w") as fo:
        fo.write("\n".join(out) + "\n")
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
