#!/usr/bin/env python3
"""Every recipes/*.yaml is a valid run configuration that trains: `renaissance train --config R` with the data
replaced by a small dataset of the recipe's shape and the run cut to one or two steps on the CPU (the command line
wins over the file), run from a directory outside the source tree (a recipe's model file is found beside it). The ImageNet recipe runs on a generated JPEG store of 1000 classes, so its random-resized crops,
progressive resize (160) and the validation's Resize + CenterCrop run from decoded JPEGs.

    check_recipes.py RENAISSANCE_CLI SOURCE_DIR WORKDIR
Exit 0 pass, 1 fail, 77 without numpy/Pillow.
"""
import glob
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}", file=sys.stderr)
    sys.exit(77)

CLI, SRC, WORK = sys.argv[1:4]


def run(*args, cwd=None):
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd)


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    data = {}
    for name, shape, classes in (("fmnist", "28,28,1", 10), ("cifar", "32,32,3", 10)):
        out = os.path.join(WORK, f"{name}.h5")
        r = run(CLI, "data", "synthetic", "--out", out, "--train", "64", "--val", "16", "--shape", shape, "--classes",
                str(classes))
        if r.returncode:
            print(r.stderr)
            return 1
        data[name] = out
    # 1000 classes, one tiny JPEG each for train, and 8 for val.
    root = os.path.join(WORK, "imagenet")
    rng = np.random.default_rng(0)
    for split, n in (("train", 1000), ("val", 8)):
        for k in range(n):
            d = os.path.join(root, split, f"n{k:08d}")
            os.makedirs(d, exist_ok=True)
            h, w = int(rng.integers(30, 60)), int(rng.integers(30, 60))
            Image.fromarray(rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)).save(os.path.join(d, "a.jpg"),
                                                                                       quality=75)
    data["imagenet"] = os.path.join(WORK, "imagenet.h5")
    r = run(CLI, "data", "import", "folder", root, "--out", data["imagenet"])
    if r.returncode:
        print(r.stderr)
        return 1
    fails = []
    recipes = sorted(glob.glob(os.path.join(SRC, "recipes", "*.yaml")))
    if not recipes:
        fails.append("no recipes found")
    for recipe in recipes:
        base = os.path.basename(recipe)
        which = "imagenet" if "imagenet" in base else "cifar" if "cifar" in base else "fmnist"
        batch = "2" if which == "imagenet" else "8"
        r = run(CLI, "train", "--config", recipe, "--device", "cpu", "--data", data[which], "--epochs", "1",
                "--max-steps", "2", "--batch", batch, "--val-batch", "8", cwd=WORK)
        ok = r.returncode == 0 and "done: 2 steps" in r.stdout
        print(f"{base}: {'ok' if ok else 'FAILED'}  {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}")
        if not ok:
            fails.append(f"{base}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
