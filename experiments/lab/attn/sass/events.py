"""The order of a SASS range's events (sass.sh events FILE FROM TO): waits (TRYWAIT, WARPGROUP.DEPBAR),
barriers, wgmma groups, arrives, the softmax's arithmetic, branches; a run of the same event as EVENTxN,
any other instruction as '.'. For setting two kernels' loops side by side (FA4-GAP.md section 13)."""
import re
import sys

KEEP = ("FMNMX", "FADD", "FFMA", "FMUL", "F2FP.BF16.F32.PACK_AB", "SHFL.BFLY", "BRA", "EXIT")


def events(lines):
    ev = []
    for line in lines:
        m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*?);", line)
        if not m:
            e = "label" if re.match(r"^\.L_x_\d+:", line) else None
        else:
            op, rest = m.group(2), m.group(3)
            if op.startswith("HGMMA"):
                e = "HGMMA" + (".gsb0" if "gsb0" in rest else "")
            elif op.startswith("WARPGROUP.DEPBAR"):
                e = "DEPBAR" + rest.strip().split(",")[-1].strip()
            elif op.startswith("BAR."):
                e = op
            elif "TRYWAIT" in op:
                e = "TRYWAIT"
            elif op.startswith("SYNCS.ARRIVE"):
                e = "ARRIVE" + ("(predicated)" if m.group(1) else "")
            elif op == "MUFU.EX2":
                e = "MUFU"
            elif op in KEEP:
                e = op
            else:
                e = "."
        if e is None:
            continue
        if ev and ev[-1][0] == e:
            ev[-1][1] += 1
        else:
            ev.append([e, 1])
    return " ".join(f"{e}x{n}" if n > 1 else e for e, n in ev)


if __name__ == "__main__":
    path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with open(path) as f:
        print(events(f.read().split("\n")[first - 1:last]))
