#!/usr/bin/env python3
"""Turn the metrics JSONL of `renaissance train --metrics FILE` into a PNG of loss and accuracy curves.

    scripts/plot_metrics.py run.jsonl [more.jsonl ...] --out curves.png

Each file is one run (its name is the legend label). Needs matplotlib (Debian: python3-matplotlib);
exits 77 when it is missing so CTest reports the test as skipped.
"""
import argparse
import json
import os
import sys


def load(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON object: {e}")
    if not rows:
        sys.exit(f"{path}: no epochs in this metrics file")
    for key in ("epoch", "train_loss", "val_loss", "val_top1"):
        if key not in rows[0]:
            sys.exit(f"{path}: missing key '{key}' (is this a `renaissance train --metrics` file?)")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default="metrics.png")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics: matplotlib is not installed (apt-get install python3-matplotlib)", file=sys.stderr)
        sys.exit(77)
    runs = [(os.path.basename(p), load(p)) for p in args.files]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in runs:
        ep = [r["epoch"] for r in rows]
        ax_loss.plot(ep, [r["train_loss"] for r in rows], "o-", label=f"{label} train")
        ax_loss.plot(ep, [r["val_loss"] for r in rows], "s--", label=f"{label} val")
        ax_acc.plot(ep, [100 * r["val_top1"] for r in rows], "o-", label=f"{label} val top-1")
        if "train_top1" in rows[0]:
            ax_acc.plot(ep, [100 * r["train_top1"] for r in rows], "s--", label=f"{label} train top-1")
        if "ema_val_top1" in rows[0]:
            ax_acc.plot(ep, [100 * r["ema_val_top1"] for r in rows], "^:", label=f"{label} EMA val top-1")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
