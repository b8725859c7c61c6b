#!/usr/bin/env python3
"""What scripts/plot_metrics.py draws, checked on its figure (not only that a PNG was written): three panels (loss,
accuracy, learning rate); one colour per run in every panel; one style per series (train solid with circles,
validation dashed with squares, EMA dotted with triangles, per-step thin without markers); the lines' points are the
files' values; the title is --title, else the run ids the files record, else the file names.

    check_plot_metrics.py SOURCE_DIR      exit 0 pass, 1 fail, 77 without matplotlib
"""
import importlib.util
import json
import os
import sys

src = sys.argv[1]
fixtures = os.path.join(src, "tests", "runtime", "fixtures")
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
except ImportError:
    print("SKIP: matplotlib is not installed")
    sys.exit(77)

spec = importlib.util.spec_from_file_location("plot_metrics", os.path.join(src, "scripts", "plot_metrics.py"))
pm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pm)


def rows(name):
    with open(os.path.join(fixtures, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


ema, plain, steps = rows("metrics_ema.jsonl"), rows("metrics.jsonl"), rows("loss_log_ema.jsonl")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


fig = pm.make_figure(plt, MaxNLocator, [ema, plain], [steps], ["metrics_ema", "metrics"], "a title")
axes = fig.axes
check([a.get_title() for a in axes] == ["loss", "accuracy", "learning rate"],
      f"panels {[a.get_title() for a in axes]}")
check(fig._suptitle is not None and fig._suptitle.get_text() == "a title", "the --title is the figure's title")
want = {"train": ("-", "o"), "val": ("--", "s"), "EMA": (":", "^"), "per step": ("-", "None")}
colours = {}
for ax in axes:
    for line in ax.get_lines():
        label = line.get_label()
        run = label.split(" ")[0]
        colours.setdefault(run, set()).add(matplotlib.colors.to_hex(line.get_color()))
        kind = ("per step" if "per step" in label else "EMA" if "EMA" in label else "val" if " val" in label
                else "train")
        check((line.get_linestyle(), str(line.get_marker())) == want[kind],
              f"{ax.get_title()}: '{label}' is {line.get_linestyle()} {line.get_marker()}, want {want[kind]}")
check(sorted(colours) == ["metrics", "metrics_ema"], f"runs {sorted(colours)}")
check(all(len(c) == 1 for c in colours.values()), f"one colour per run in every panel: {colours}")
check(len(set.union(*colours.values())) == 2, f"each run its own colour: {colours}")
# The points are the files' values.
by_label = {(ax.get_title(), line.get_label()): line for ax in axes for line in ax.get_lines()}
line = by_label.get(("loss", "metrics_ema train"))
check(line is not None and list(line.get_xdata()) == [r["step"] for r in ema]
      and list(line.get_ydata()) == [r["train_loss"] for r in ema], "train loss points")
line = by_label.get(("accuracy", "metrics val top-1"))
check(line is not None and list(line.get_ydata()) == [100 * r["val_top1"] for r in plain], "val top-1 in %")
line = by_label.get(("learning rate", "metrics_ema lr (per step)"))
check(line is not None and list(line.get_ydata()) == [r["lr"] for r in steps], "per-step learning rate")
check(("accuracy", "metrics_ema EMA val top-1") in by_label, "the EMA series")
check(("accuracy", "metrics EMA val top-1") not in by_label, "no EMA series for a run without EMA")
plt.close(fig)
# Without --title: the run ids the files record (the older file has none), else the file names.
fig = pm.make_figure(plt, MaxNLocator, [ema, plain], [], ["metrics_ema", "metrics"])
check(fig._suptitle.get_text() == ema[-1]["run_id"], f"title from run ids: {fig._suptitle.get_text()}")
plt.close(fig)
fig = pm.make_figure(plt, MaxNLocator, [plain], [], ["metrics"])
check(fig._suptitle.get_text() == "metrics", f"title from file names: {fig._suptitle.get_text()}")
plt.close(fig)
# A resumed run's file (the lines of two run ids, steps advancing) plots, titled with both ids.
import tempfile  # noqa: E402
with tempfile.TemporaryDirectory() as tmp:
    resumed = os.path.join(tmp, "resumed.jsonl")
    with open(resumed, "w") as f:
        for r in ema[:2] + [dict(r, run_id="20261202T010000Z-vm-4300") for r in ema[2:]]:
            f.write(json.dumps(r) + "\n")
    rows_resumed = pm.load_jsonl(resumed, ("epoch", "step", "train_loss"), "metrics")
fig = pm.make_figure(plt, MaxNLocator, [rows_resumed], [], ["resumed"])
check(fig._suptitle.get_text() == f"{ema[0]['run_id']}, 20261202T010000Z-vm-4300",
      f"title with both run ids of a resumed run: {fig._suptitle.get_text()}")
plt.close(fig)

for f in failures:
    print("FAIL", f)
print(f"{'FAIL' if failures else 'OK'}: plot_metrics figure, {len(failures)} failed checks")
sys.exit(1 if failures else 0)
