#!/usr/bin/env python3
"""Writes ImageFolder trees (DIR/train/<class>/*, DIR/val/<class>/*) for `renaissance data import folder`.

  imagenet-like OUT   generated photographs-to-be: ~500x375 (some portrait 375x500, sizes jittered), JPEG quality
                      90, N classes; each class has its own colours, orientation and frequency of texture under
                      noise, so a network can learn them and the files compress like natural images (~110 KB).
                      Deterministic: same arguments, same bytes.
  fashion-mnist OUT   the Fashion-MNIST idx files as one PNG (lossless: the pixels stay the idx pixels) or JPEG per
                      image, train/ and val/ (the t10k files), class folders named 0_T-shirt_top ... 9_Ankle_boot
                      (sorted names keep the label order).

OUT must be new or empty: files of an earlier run would be imported with the new ones.

  scripts/make_image_folder.py imagenet-like /data/fake-imagenet --classes 1000 --train-per-class 50 --val-per-class 5
  scripts/make_image_folder.py fashion-mnist /tmp/fmnist-png --format png --train-limit 6000 --val-limit 1000

Needs numpy and Pillow (python3-numpy, python3-pil). Exit 77 when they are missing (CTest's SKIP_RETURN_CODE).
"""
import argparse
import gzip
import os
import struct
import sys
from concurrent.futures import ProcessPoolExecutor

try:
    import numpy as np
    from PIL import Image
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: {e} in {sys.executable} (install python3-numpy / python3-pil, and run the script with that python3)",
          file=sys.stderr)
    sys.exit(77)

FMNIST_CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                  "Ankle_boot"]


def class_style(seed, k):
    r = np.random.default_rng([seed, k, 1])
    return dict(colour=r.uniform(40, 215, size=3), tint=r.uniform(-60, 60, size=3), angle=r.uniform(0, np.pi),
                freq=r.uniform(0.02, 0.12), blob=r.uniform(0.2, 0.8, size=2))


def render(seed, k, index, split, quality, size):
    """One image of class k (numpy RNG keyed by (seed, class, split, index): independent of the worker count)."""
    r = np.random.default_rng([seed, k, 2 if split == "train" else 3, index])
    st = class_style(seed, k)
    w, h = size
    if r.random() < 0.2:
        w, h = h, w  # portrait
    w = int(w * r.uniform(0.9, 1.0))
    h = int(h * r.uniform(0.9, 1.0))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    a = st["angle"] + r.normal(0, 0.15)
    wave = np.sin((np.cos(a) * xx + np.sin(a) * yy) * st["freq"] * 2 * np.pi + r.uniform(0, 6.3))
    cy, cx = (st["blob"] + r.normal(0, 0.1, size=2)) * (h, w)
    blob = np.exp(-(((yy - cy) / (0.25 * h)) ** 2 + ((xx - cx) / (0.25 * w)) ** 2))
    img = st["colour"][None, None, :] + 50 * wave[..., None] + st["tint"][None, None, :] * blob[..., None]
    img += r.normal(0, 22, size=(h, w, 3)).astype(np.float32)  # texture: what makes JPEGs of photographs large
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    return im, quality


def write_imagenet_job(args):
    out, seed, k, split, first, count, quality, size = args
    d = os.path.join(out, split, f"n{k:08d}")
    os.makedirs(d, exist_ok=True)
    total = 0
    for i in range(first, first + count):
        im, q = render(seed, k, i, split, quality, size)
        p = os.path.join(d, f"{split}_{k:04d}_{i:06d}.JPEG")
        im.save(p, quality=q)
        total += os.path.getsize(p)
    return total


def imagenet_like(a):
    w, h = (int(v) for v in a.size.split("x"))
    jobs = []
    for k in range(a.classes):
        jobs.append((a.out, a.seed, k, "train", 0, a.train_per_class, a.quality, (w, h)))
        if a.val_per_class:
            jobs.append((a.out, a.seed, k, "val", 0, a.val_per_class, a.quality, (w, h)))
    total = 0
    with ProcessPoolExecutor(max_workers=a.workers or os.cpu_count()) as ex:
        for b in ex.map(write_imagenet_job, jobs, chunksize=max(1, len(jobs) // (8 * (a.workers or os.cpu_count())))):
            total += b
    n = a.classes * (a.train_per_class + a.val_per_class)
    print(f"wrote {n} JPEGs ({a.classes} classes, {a.train_per_class} train + {a.val_per_class} val each) to {a.out}: "
          f"{total / 2**20:.1f} MiB, {total / max(n, 1) / 1024:.1f} KiB per image")


IDX_MAGIC = {"images": (2051, 3), "labels": (2049, 1)}  # unsigned bytes, 3 or 1 dimensions


def read_idx(path, kind):
    """The uint8 array of an idx file of `kind` (images or labels), its header checked: a truncated file, a swapped
    pair or a label file of other content was a numpy traceback or a KeyError mid-way."""
    op = gzip.open if path.endswith(".gz") else open
    try:
        with op(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise SystemExit(f"make_image_folder: {path}: {getattr(e, 'strerror', None) or e}")
    magic_want, ndim = IDX_MAGIC[kind]
    if len(data) < 4 + 4 * ndim:
        raise SystemExit(f"make_image_folder: {path}: not an idx {kind} file ({len(data)} bytes)")
    magic = struct.unpack(">I", data[:4])[0]
    if magic != magic_want:
        other = [k for k, (m, _) in IDX_MAGIC.items() if m == magic]
        raise SystemExit(f"make_image_folder: {path}: magic {magic}, not {magic_want} (idx {kind})"
                         + (f": an idx {other[0]} file (images and labels swapped?)" if other else ""))
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    size = int(np.prod(dims, dtype=np.int64))
    if len(data) - 4 - 4 * ndim != size:
        raise SystemExit(f"make_image_folder: {path}: {len(data) - 4 - 4 * ndim} bytes of data, the header says "
                         f"{' x '.join(map(str, dims))} = {size} (truncated?)")
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist(a):
    # Both splits' files read and checked before any image is written.
    splits = []
    for split, prefix, limit in (("train", "train", a.train_limit), ("val", "t10k", a.val_limit)):
        xp, yp = (os.path.join(a.src, f"{prefix}-{k}-idx{d}-ubyte.gz") for k, d in (("images", 3), ("labels", 1)))
        x, y = read_idx(xp, "images"), read_idx(yp, "labels")
        if len(x) != len(y):
            raise SystemExit(f"make_image_folder: {xp} has {len(x)} images, {yp} {len(y)} labels")
        if len(y) and y.max() >= len(FMNIST_CLASSES):
            raise SystemExit(f"make_image_folder: {yp}: label {y.max()} at index {int(y.argmax())}; Fashion-MNIST "
                             f"has {len(FMNIST_CLASSES)} classes")
        splits.append((split, x, y, len(y) if limit is None else min(limit, len(y))))
    for split, x, y, n in splits:
        for k, name in enumerate(FMNIST_CLASSES):
            os.makedirs(os.path.join(a.out, split, f"{k}_{name}"), exist_ok=True)
        ext = "png" if a.format == "png" else "jpg"
        for i in range(n):
            p = os.path.join(a.out, split, f"{y[i]}_{FMNIST_CLASSES[y[i]]}", f"{i:05d}.{ext}")
            im = Image.fromarray(x[i])
            if a.format == "png":
                im.save(p)
            else:
                im.save(p, quality=a.quality)
        print(f"{split}: {n} {a.format.upper()} files in {a.out}/{split}")


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def non_negative(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def quality(text):
    v = int(text)
    if not 1 <= v <= 100:
        raise argparse.ArgumentTypeError(f"a JPEG quality is 1 to 100, got {v}")
    return v


def size(text):
    parts = text.split("x")
    if len(parts) != 2 or not all(p.isdigit() and 8 <= int(p) <= 16384 for p in parts):
        raise argparse.ArgumentTypeError(f"WxH with each side from 8 to 16384 pixels (e.g. 500x375), got '{text}'")
    return text


def check_out(path):
    """OUT is an empty directory, or will be one: before any image is made."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise SystemExit(f"make_image_folder: {path}: exists and is not a directory")
    if os.path.isdir(path) and os.listdir(path):  # the files of an earlier run would stay among the new ones
        raise SystemExit(f"make_image_folder: {path}: exists and is not empty; give a new or empty directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise SystemExit(f"make_image_folder: {path}: the directory {parent} does not exist or is not writable")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    im = sub.add_parser("imagenet-like", help="generated ImageNet-like JPEGs")
    im.add_argument("out")
    im.add_argument("--classes", type=positive, default=1000)
    im.add_argument("--train-per-class", type=positive, default=50)
    im.add_argument("--val-per-class", type=non_negative, default=5)
    im.add_argument("--size", type=size, default="500x375", help="WxH before jitter (20%% are portrait)")
    im.add_argument("--quality", type=quality, default=90)
    im.add_argument("--seed", type=non_negative, default=0)
    im.add_argument("--workers", type=non_negative, default=0, help="processes (0: all CPUs)")
    fm = sub.add_parser("fashion-mnist", help="Fashion-MNIST's idx files as a folder of PNG or JPEG files")
    fm.add_argument("out")
    fm.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
    fm.add_argument("--format", choices=["png", "jpeg"], default="png")
    fm.add_argument("--quality", type=quality, default=95)
    fm.add_argument("--train-limit", type=non_negative, default=None, help="the first N train images only")
    fm.add_argument("--val-limit", type=non_negative, default=None, help="the first N test images only")
    a = ap.parse_args()
    check_out(a.out)
    (imagenet_like if a.kind == "imagenet-like" else fashion_mnist)(a)


if __name__ == "__main__":
    main()
