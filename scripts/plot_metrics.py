#!/usr/bin/env python3
"""Plot the metrics of `renaissance train` runs to a PNG: loss, accuracy and learning-rate panels.

    scripts/plot_metrics.py run.jsonl [more.jsonl ...] [--loss-log steps.jsonl ...] [--title T] --out curves.png

Each metrics file (`train --metrics FILE`, one JSON object per epoch) is one run. The x axis is the optimizer step
in every panel (the metrics record the step at the end of each epoch). A series keeps one style in every panel:
each run has its colour, and train is a solid line with circles, validation dashed with squares, EMA dotted with
triangles; per-step training losses (`train --loss-log FILE`, one per run, in the same order) are a thin line of the
run's colour. The learning rate is the value at the end of each epoch, and per step where the loss log has it. The title is --title, else the run ids the
files record (metrics lines carry `run_id` since issue 17; all of them, a resumed run's file has two), else the file
names. A file is one run, whose steps advance (a resumed run's too): a step that does not is refused as runs
concatenated into one file.
Needs matplotlib (Debian: python3-matplotlib); exits 77 when it is missing so CTest reports the test as skipped.
"""
import argparse
import json
import os
import sys

# One style per series, the same in every panel.
STYLES = {
    "train": dict(linestyle="-", marker="o"),
    "val": dict(linestyle="--", marker="s"),
    "ema": dict(linestyle=":", marker="^"),
    "step": dict(linestyle="-", marker=None, linewidth=0.8, alpha=0.45),
}


# The keys each line may carry and must be numbers (or null) when it does; "step" and "epoch" integers.
NUMBERS = ("train_loss", "train_top1", "val_loss", "val_top1", "val_top5", "ema_val_top1", "lr", "loss", "momentum")
INTEGERS = ("step", "epoch")


def is_number(v, integer=False):
    if isinstance(v, bool):
        return False
    return isinstance(v, int) if integer else isinstance(v, (int, float))


def load_jsonl(path, required, what):
    rows, last = [], ()  # (step, line, run_id) of the last line
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        sys.exit(f"plot_metrics: {path}: {e.strerror}")
    with f:
        try:
            lines = list(f)
        except (OSError, UnicodeDecodeError) as e:
            sys.exit(f"plot_metrics: {path}: cannot read it as UTF-8 text ({e})")
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_metrics: {path}:{n}: not a JSON object: {e}")
        if not isinstance(row, dict):
            sys.exit(f"plot_metrics: {path}:{n}: not a JSON object")
        for key in INTEGERS:
            if key in row and not is_number(row[key], integer=True):
                sys.exit(f"plot_metrics: {path}:{n}: '{key}' must be an integer, got {json.dumps(row[key])}")
        for key in NUMBERS:
            if key in row and row[key] is not None and not is_number(row[key]):
                sys.exit(f"plot_metrics: {path}:{n}: '{key}' must be a number, got {json.dumps(row[key])}")
        if row.get("run_id") is not None and not isinstance(row["run_id"], str):
            sys.exit(f"plot_metrics: {path}:{n}: 'run_id' must be a string, got {json.dumps(row['run_id'])}")
        for key in required:  # every line: a later line without "step" was a KeyError while plotting
            if key not in row:
                sys.exit(f"plot_metrics: {path}:{n}: missing key '{key}' (is this a {what} file?)")
        # A run records each step once, in order, and a resumed run's file keeps only the lines before its
        # checkpoint, so its steps advance across the file even where the resumption has a run_id of its own: a step
        # that does not advance is runs concatenated into one file, which plotted as one zigzag line.
        rid = row.get("run_id")
        if last and row["step"] <= last[0]:
            sys.exit(f"plot_metrics: {path}:{n}: step {row['step']} after step {last[0]} (line {last[1]})"
                     f"{f' of run {last[2]}' if last[2] else ''}: several runs concatenated into one file? Give each "
                     "run's file separately")
        last = (row["step"], n, rid)
        rows.append(row)
    if not rows:
        sys.exit(f"plot_metrics: {path}: empty (no {what})")
    return rows


def series(rows, key, scale=1.0):
    pts = [(r["step"], scale * r[key]) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def make_figure(plt, MaxNLocator, runs, steps, labels, title_arg=None):
    """The figure: loss, accuracy and learning-rate panels; runs[i] (metrics rows) named labels[i], steps[i] its
    per-step loss log where given. tests/runtime/check_plot_metrics.py inspects what this returns."""
    run_ids = []  # every run id, in order: a resumed run's file has the ids of the run and its resumption
    for rows in runs:
        for rid in (r.get("run_id") for r in rows):
            if rid and rid not in run_ids:
                run_ids.append(rid)
    title = title_arg or (", ".join(run_ids) if run_ids else ", ".join(labels))

    fig, (ax_loss, ax_acc, ax_lr) = plt.subplots(1, 3, figsize=(15, 4.4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rows) in enumerate(zip(labels, runs)):
        c = colours[i % len(colours)]
        if i < len(steps):
            ax_loss.plot(*series(steps[i], "loss"), color=c, label=f"{label} train (per step)", **STYLES["step"])
        ax_loss.plot(*series(rows, "train_loss"), color=c, label=f"{label} train", **STYLES["train"])
        if any("val_loss" in r for r in rows):
            ax_loss.plot(*series(rows, "val_loss"), color=c, label=f"{label} val", **STYLES["val"])
        if any("train_top1" in r for r in rows):
            ax_acc.plot(*series(rows, "train_top1", 100), color=c, label=f"{label} train top-1", **STYLES["train"])
        if any("val_top1" in r for r in rows):
            ax_acc.plot(*series(rows, "val_top1", 100), color=c, label=f"{label} val top-1", **STYLES["val"])
        if any("ema_val_top1" in r for r in rows):
            ax_acc.plot(*series(rows, "ema_val_top1", 100), color=c, label=f"{label} EMA val top-1", **STYLES["ema"])
        if i < len(steps) and any("lr" in r for r in steps[i]):  # per step (loss logs since issue 17)
            ax_lr.plot(*series(steps[i], "lr"), color=c, label=f"{label} lr (per step)", **STYLES["step"])
        if any("lr" in r for r in rows):
            ax_lr.plot(*series(rows, "lr"), color=c, label=f"{label} lr (end of epoch)", **STYLES["train"])
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy (%)", title="accuracy")
    ax_lr.set(xlabel="step", ylabel="learning rate", title="learning rate")
    for ax in (ax_loss, ax_acc, ax_lr):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="metrics JSONL files (train --metrics)")
    ap.add_argument("--loss-log", action="append", default=[],
                    help="per-step loss JSONL (train --loss-log), one per run in the order of the metrics files")
    ap.add_argument("--title", help="the figure's title")
    ap.add_argument("--out", default="metrics.png")
    args = ap.parse_args()
    if len(args.loss_log) > len(args.files):
        sys.exit(f"plot_metrics: {len(args.loss_log)} --loss-log files for {len(args.files)} runs")
    # Before any work: a writable PNG that is none of the inputs.
    if os.path.splitext(args.out)[1].lower() != ".png":
        sys.exit(f"plot_metrics: --out {args.out}: the figure is a PNG; name it *.png")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        sys.exit(f"plot_metrics: --out {args.out}: the directory {out_dir} does not exist or is not writable")
    for p in args.files + args.loss_log:  # a missing input is load_jsonl's error, not samefile's traceback
        if os.path.exists(args.out) and os.path.exists(p) and os.path.samefile(p, args.out):
            sys.exit(f"plot_metrics: --out {args.out} is the input {p}")
    runs = [load_jsonl(p, ("epoch", "step", "train_loss"), "`renaissance train --metrics`") for p in args.files]
    steps = [load_jsonl(p, ("step", "loss"), "`renaissance train --loss-log`") for p in args.loss_log]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print(f"plot_metrics: matplotlib is not installed for {sys.executable} (apt-get install python3-matplotlib, "
              "and run the script with that python3, e.g. /usr/bin/python3)", file=sys.stderr)
        sys.exit(77)

    labels = [os.path.splitext(os.path.basename(p))[0] for p in args.files]
    fig = make_figure(plt, MaxNLocator, runs, steps, labels, args.title)
    try:
        fig.savefig(args.out, dpi=110)
    except OSError as e:
        sys.exit(f"plot_metrics: --out {args.out}: {e.strerror or e}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
