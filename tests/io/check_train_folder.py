#!/usr/bin/env python3
"""Fashion-MNIST written as a folder of PNG and of JPEG files imports and trains like the idx import (CPU).

    check_train_folder.py RENAISSANCE_CLI SOURCE_DIR WORKDIR [--train N] [--val M] [--epochs E]

1. The first N train and M test images of /usr/share/datasets/fashion-mnist as idx files -> `data import idx` (A).
2. The same images as PNG files (scripts/make_image_folder.py fashion-mnist) -> `data import folder --store raw
   --size 28 --channels 1` (B): lossless, so B holds exactly A's images, in ImageFolder order (class by class, file
   names in index order) - checked image by image with h5py.
3. The same images as JPEG files (quality 95) -> `data import folder --channels 1` (C, a JPEG store), trained with
   the JPEGs decoded on the loader threads (--val-resize 28: the centre crop of a 28x28 image is the image).
4. The idx subset written again in ImageFolder order and imported (A2): fmnist_cnn trained on A2 and on B with the same
   options gives the same per-step losses bit for bit and the same accuracy (the same images in the same order); C's
   accuracy agrees with A2's within a tolerance (only the JPEG pixels differ).
5. C trained with random-resized crops for a few steps with --loader-threads 1 and 3: identical per-step losses.
Exit 0 pass, 1 fail, 77 when Fashion-MNIST, h5py, numpy or Pillow is missing.
"""
import argparse
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys

try:
    import h5py
    import numpy as np
    import PIL  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}", file=sys.stderr)
    sys.exit(77)

FMNIST = "/usr/share/datasets/fashion-mnist"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("src")
    ap.add_argument("work")
    ap.add_argument("--train", type=int, default=5000)
    ap.add_argument("--val", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=4)  # after 2, short-training noise alone moved C by 4 points
    ap.add_argument("--tolerance", type=float, default=0.03)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
        print(f"SKIP: {FMNIST} not found (apt-get install dataset-fashion-mnist)", file=sys.stderr)
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    fails = []

    def run(*args):
        r = subprocess.run(list(args), capture_output=True, text=True)
        if r.returncode:
            print(r.stdout, r.stderr)
            raise SystemExit(f"FAIL: {' '.join(args)}: exit {r.returncode}")
        return r

    # 1. idx subset
    idx = os.path.join(a.work, "idx")
    os.makedirs(idx)
    names = {}
    for split, prefix, n in (("train", "train", a.train), ("val", "t10k", a.val)):
        for kind, magic, hdr in (("images", 2051, 16), ("labels", 2049, 8)):
            src = os.path.join(FMNIST, f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz")
            with gzip.open(src, "rb") as f:
                data = f.read()
            per = 784 if kind == "images" else 1
            head = bytearray(data[:hdr])
            head[4:8] = struct.pack(">I", n)
            out = os.path.join(idx, f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz")
            with gzip.open(out, "wb") as f:
                f.write(bytes(head) + data[hdr:hdr + n * per])
            names[(split, kind)] = out
    A, B, C = (os.path.join(a.work, f"{x}.h5") for x in "ABC")
    run(a.cli, "data", "import", "idx", "--train-images", names[("train", "images")], "--train-labels",
        names[("train", "labels")], "--val-images", names[("val", "images")], "--val-labels", names[("val", "labels")],
        "--classes", "10", "--out", A)
    # 2. PNG folder -> raw store
    mk = os.path.join(a.src, "scripts", "make_image_folder.py")
    png, jpg = os.path.join(a.work, "png"), os.path.join(a.work, "jpg")
    run(sys.executable, mk, "fashion-mnist", png, "--format", "png", "--train-limit", str(a.train), "--val-limit",
        str(a.val))
    run(a.cli, "data", "import", "folder", png, "--out", B, "--store", "raw", "--size", "28", "--channels", "1")
    with h5py.File(A, "r") as fa, h5py.File(B, "r") as fb:
        for split in ("train", "val"):
            ya = fa[f"{split}/labels"][...]
            order = np.argsort(ya, kind="stable")  # ImageFolder: class by class, files (indices) in order
            same = np.array_equal(fb[f"{split}/images"][...], fa[f"{split}/images"][...][order]) and \
                np.array_equal(fb[f"{split}/labels"][...], ya[order])
            print(f"PNG folder /{split}: {len(ya)} images {'equal' if same else 'DIFFER from'} the idx import's")
            if not same:
                fails.append(f"PNG folder /{split} differs from the idx import")
    # The idx subset again, in ImageFolder order (A2): the same images in B's order, so B must train like it exactly.
    A2 = os.path.join(a.work, "A2.h5")
    idx2 = os.path.join(a.work, "idx2")
    os.makedirs(idx2)
    names2 = {}
    for split, prefix in (("train", "train"), ("val", "t10k")):
        with h5py.File(A, "r") as fa:
            ya = fa[f"{split}/labels"][...]
            xa = fa[f"{split}/images"][...]
        order = np.argsort(ya, kind="stable")
        n = len(ya)
        for kind, magic, body in (("images", 2051, struct.pack(">III", n, 28, 28) + xa[order].tobytes()),
                                  ("labels", 2049, struct.pack(">I", n) + ya[order].astype(np.uint8).tobytes())):
            out = os.path.join(idx2, f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz")
            with gzip.open(out, "wb") as f:
                f.write(struct.pack(">I", magic) + body)
            names2[(split, kind)] = out
    run(a.cli, "data", "import", "idx", "--train-images", names2[("train", "images")], "--train-labels",
        names2[("train", "labels")], "--val-images", names2[("val", "images")], "--val-labels",
        names2[("val", "labels")], "--classes", "10", "--out", A2)
    # 3. JPEG folder -> JPEG store
    run(sys.executable, mk, "fashion-mnist", jpg, "--format", "jpeg", "--quality", "95", "--train-limit",
        str(a.train), "--val-limit", str(a.val))
    run(a.cli, "data", "import", "folder", jpg, "--out", C, "--channels", "1")
    # 4. training
    common = ["train", "--device", "cpu", "--model", "fmnist_cnn", "--epochs", str(a.epochs), "--batch", "128",
              "--seed", "1"]
    acc, losses = {}, {}
    for name, path, extra in (("idx", A2, []), ("png folder", B, []), ("jpeg store", C, ["--val-resize", "28"])):
        stem = os.path.join(a.work, name.replace(" ", "_"))
        run(a.cli, *common, "--data", path, "--metrics", stem + ".jsonl", "--loss-log", stem + ".loss", *extra)
        with open(stem + ".jsonl") as f:
            last = [json.loads(l) for l in f if l.strip()][-1]
        with open(stem + ".loss") as f:
            losses[name] = f.read()
        acc[name] = last["val_top1"]
        print(f"{name}: val_top1 {acc[name]:.4f} after {a.epochs} epochs ({last['images_per_s']:.0f} img/s)")
    if losses["png folder"] != losses["idx"] or not losses["idx"].strip():
        fails.append("the PNG folder's per-step losses differ from the idx import's in the same order")
    else:
        print(f"png folder and idx in ImageFolder order: the same {len(losses['idx'].splitlines())} loss lines")
    if acc["png folder"] != acc["idx"]:
        fails.append(f"png folder reached {acc['png folder']:.4f}, the idx import {acc['idx']:.4f}")
    if abs(acc["jpeg store"] - acc["idx"]) > a.tolerance:
        fails.append(f"jpeg store reached {acc['jpeg store']:.4f}, the idx import {acc['idx']:.4f} "
                     f"(tolerance {a.tolerance})")
    # 5. the loader threads change nothing
    logs = []
    for t in ("1", "3"):
        log = os.path.join(a.work, f"loss-{t}.log")
        run(a.cli, "train", "--device", "cpu", "--model", "fmnist_cnn", "--data", C, "--epochs", "1", "--batch", "64",
            "--max-steps", "12", "--crop", "random-resized", "--crop-scale", "0.35,1", "--loader-threads", t,
            "--loss-log", log, "--no-validate")
        with open(log) as f:
            logs.append(f.read())
    if logs[0] != logs[1] or not logs[0].strip():
        fails.append("--loader-threads 1 and 3 gave different losses")
    else:
        print(f"--loader-threads 1 and 3: the same {len(logs[0].splitlines())} loss lines")
    for e in fails:
        print("FAIL:", e)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
