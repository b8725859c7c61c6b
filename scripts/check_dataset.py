#!/usr/bin/env python3
"""Check a Renaissance dataset file against the MNIST-format (idx) files it was imported from.

An independent reader: h5py + numpy + gzip, none of Renaissance's code. Verifies the format attributes,
shapes, dtypes, chunking/Fletcher32, every image and label, mean/std recomputed from the train split, and (format 2)
every block's content checksum recomputed with zlib.crc32.

    scripts/check_dataset.py data/fashion-mnist.h5 --idx-dir /usr/share/datasets/fashion-mnist

Exit codes: 0 match, 1 mismatch, 77 skipped (h5py/numpy or the inputs are missing; CTest's SKIP_RETURN_CODE).
"""
import argparse
import gzip
import zlib
import os
import struct
import sys

SKIP = 77

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: {e} (install python3-h5py / python3-numpy)", file=sys.stderr)
    sys.exit(SKIP)

# split in the dataset -> file-name prefix of the idx files (the Fashion-MNIST/MNIST convention)
SPLITS = {"train": "train", "val": "t10k"}


def open_idx(path):
    """gzip or plain, like the importer."""
    if not os.path.exists(path) and path.endswith(".gz") and os.path.exists(path[:-3]):
        path = path[:-3]
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def read_idx(path, expect_magic):
    with open_idx(path) as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    if magic != expect_magic:
        raise ValueError(f"{path}: magic {magic}, expected {expect_magic}")
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {arr.size} bytes of data, header says {dims}")
    return arr.reshape(dims)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("file", help="Renaissance dataset (.h5)")
    ap.add_argument("--idx-dir", required=True, help="directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz")
    ap.add_argument("--num-classes", type=int, default=None, help="expected num_classes (default: max label + 1)")
    args = ap.parse_args()

    if not os.path.isdir(args.idx_dir):
        print(f"SKIP: idx directory {args.idx_dir} not found", file=sys.stderr)
        return SKIP
    if not os.path.exists(args.file):
        print(f"FAIL: {args.file}: not found", file=sys.stderr)
        return 1

    errors = []

    def check(cond, msg):
        if not cond:
            errors.append(msg)
        return cond

    with h5py.File(args.file, "r") as f:
        fmt = f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        check(fmt == "renaissance-dataset", f"format attribute is {fmt!r}")
        version = int(f.attrs.get("version", -1))
        check(version in (1, 2), f"version attribute is {f.attrs.get('version')!r}")
        num_classes = int(f.attrs["num_classes"])
        labels_seen = []
        for split, prefix in SPLITS.items():
            images = read_idx(os.path.join(args.idx_dir, f"{prefix}-images-idx3-ubyte.gz"), 2051)
            labels = read_idx(os.path.join(args.idx_dir, f"{prefix}-labels-idx1-ubyte.gz"), 2049)
            d_img, d_lab = f[f"{split}/images"], f[f"{split}/labels"]
            n_errors = len(errors)
            check(d_img.dtype == np.uint8, f"/{split}/images dtype {d_img.dtype}")
            check(d_lab.dtype == np.int32, f"/{split}/labels dtype {d_lab.dtype}")
            want = images.shape + (1,)
            if not check(d_img.shape == want, f"/{split}/images shape {d_img.shape}, idx gives {want}"):
                continue
            check(d_lab.shape == labels.shape, f"/{split}/labels shape {d_lab.shape}, idx gives {labels.shape}")
            check(d_img.chunks is not None, f"/{split}/images is not chunked")
            check(d_img.fletcher32, f"/{split}/images has no Fletcher32 checksum")
            h5_img = d_img[...]
            h5_lab = d_lab[...]
            diff = np.nonzero((h5_img.reshape(images.shape) != images).reshape(len(images), -1).any(axis=1))[0]
            check(diff.size == 0, f"/{split}/images: {diff.size} samples differ, first at index {diff[:1]}")
            diff = np.nonzero(h5_lab != labels.astype(np.int32))[0]
            check(diff.size == 0, f"/{split}/labels: {diff.size} labels differ, first at index {diff[:1]}")
            if version >= 2:
                # Content checksums: CRC-32 of each block's image bytes, continued over its labels as int32 LE.
                sums = f[f"{split}/checksums"]
                block = int(sums.attrs["block_samples"])
                want = [zlib.crc32(h5_lab[a:a + block].astype("<i4").tobytes(), zlib.crc32(h5_img[a:a + block].tobytes()))
                        for a in range(0, len(h5_img), block)]
                bad = [k for k, (w, s) in enumerate(zip(want, sums[...])) if w != int(s)]
                check(len(want) == len(sums) and not bad,
                      f"/{split}/checksums: {len(sums)} stored for {len(want)} blocks, mismatches at blocks {bad[:3]}")
                print(f"/{split}: {len(want)} content checksums (blocks of {block}) "
                      f"{'match' if not bad and len(want) == len(sums) else 'DIFFER'}")
            labels_seen.append(labels)
            verdict = "match" if len(errors) == n_errors else "DIFFER from"
            print(f"/{split}: {len(h5_img)} images {h5_img.shape[1:]} and labels {verdict} {prefix}-*-ubyte.gz")
            if split == "train":
                x = h5_img.astype(np.float64) / 255.0
                mean = x.mean(axis=(0, 1, 2))
                std = x.std(axis=(0, 1, 2))
                ok = check(np.allclose(f.attrs["mean"], mean, atol=1e-5), f"mean {f.attrs['mean']} != {mean}")
                ok &= check(np.allclose(f.attrs["std"], std, atol=1e-5), f"std {f.attrs['std']} != {std}")
                print(f"mean {mean}, std {std} {'match' if ok else 'DIFFER from'} the attributes")
        expected_classes = args.num_classes or int(max(l.max() for l in labels_seen)) + 1
        check(num_classes == expected_classes, f"num_classes {num_classes}, expected {expected_classes}")
        if "class_names" in f.attrs:
            check(len(f.attrs["class_names"]) == num_classes, "class_names length != num_classes")

    for e in errors:
        print(f"FAIL: {args.file}: {e}", file=sys.stderr)
    if not errors:
        print(f"OK: {args.file} matches {args.idx_dir}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
