#!/usr/bin/env python3
"""Check a Renaissance dataset file with an independent reader, and against the sources it was imported from.

h5py + numpy (+ Pillow for images, tarfile + pickle for CIFAR), none of Renaissance's code. Always: the format
attributes, dtypes, shapes, chunking/Fletcher32, every block's content checksum (format >= 2) recomputed with
zlib.crc32, mean/std recomputed from the train split (JPEG stores: the JPEGs decoded with Pillow). With a source:

    scripts/check_dataset.py data/fashion-mnist.h5 --idx-dir /usr/share/datasets/fashion-mnist
    scripts/check_dataset.py imgs.h5 --folder DIR        # `data import folder DIR`: torchvision's ImageFolder listing,
                                                         # Pillow's decode, Resize + CenterCrop (raw stores) or the
                                                         # stored JPEG bytes (JPEG stores)
    scripts/check_dataset.py cifar.h5 --cifar cifar-10-python.tar.gz   # pickle.load(..., encoding="bytes")

Exit codes: 0 match, 1 mismatch, 77 skipped (h5py/numpy/Pillow or the inputs are missing; CTest's SKIP_RETURN_CODE).
"""
import argparse
import gzip
import io
import os
import pickle
import struct
import sys
import tarfile
import zlib

SKIP = 77

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: {e} (install python3-h5py / python3-numpy)", file=sys.stderr)
    sys.exit(SKIP)

# split in the dataset -> file-name prefix of the idx files (the Fashion-MNIST/MNIST convention)
SPLITS = {"train": "train", "val": "t10k"}
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png")


def open_idx(path):
    """gzip or plain, like the importer."""
    if not os.path.exists(path) and path.endswith(".gz") and os.path.exists(path[:-3]):
        path = path[:-3]
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def read_idx(path, expect_magic):
    """The idx file's array; ValueError naming the file when it is missing, truncated or not that idx file."""
    try:
        with open_idx(path) as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # missing, unreadable, a truncated or damaged .gz
        raise ValueError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})")
    if len(data) < 4 or len(data) < 4 + 4 * data[3]:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than an idx header")
    magic = struct.unpack(">I", data[:4])[0]
    if magic != expect_magic:
        raise ValueError(f"{path}: magic {magic}, expected {expect_magic}")
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {arr.size} bytes of data, header says {dims}")
    return arr.reshape(dims)


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def decode_jpeg(b, channels):
    from PIL import Image
    a = np.asarray(Image.open(io.BytesIO(b)).convert("L" if channels == 1 else "RGB"))
    return a[:, :, None] if a.ndim == 2 else a


class Store:
    """One split as h5py sees it: raw images, or a JPEG store's bytes/offsets/shapes."""

    def __init__(self, f, split):
        self.storage = text(f.attrs.get("storage", "raw"))
        self.labels = f[f"{split}/labels"][...]
        if self.storage == "jpeg":
            self.channels = int(f.attrs["channels"])
            self.bytes = f[f"{split}/jpeg"][...]
            self.offsets = f[f"{split}/offsets"][...]
            self.shapes = f[f"{split}/shapes"][...]
        else:
            self.images = f[f"{split}/images"][...]

    def __len__(self):
        return len(self.labels)

    def encoded(self, i):
        return self.bytes[self.offsets[i]:self.offsets[i + 1]].tobytes()

    def block_crc(self, a, b):
        """The content checksum of samples [a, b) (data/README.md)."""
        lab = self.labels[a:b].astype("<i4").tobytes()
        if self.storage == "jpeg":
            crc = zlib.crc32(lab, zlib.crc32(self.bytes[self.offsets[a]:self.offsets[b]].tobytes()))
            meta = np.stack([np.diff(self.offsets[a:b + 1]), self.shapes[a:b, 0], self.shapes[a:b, 1]], axis=1)
            return zlib.crc32(meta.astype("<u4").tobytes(), crc)
        return zlib.crc32(lab, zlib.crc32(self.images[a:b].tobytes()))


def structure_errors(f):
    """What the checks below read, missing or unusable: each a FAIL line, not a KeyError or ZeroDivision traceback."""
    errs = [f"no '{k}' attribute" for k in ("num_classes", "mean", "std") if k not in f.attrs]
    try:
        version = int(f.attrs.get("version", -1))
    except (TypeError, ValueError):
        return errs + [f"version attribute is {f.attrs.get('version')!r}, not a number"]
    storage = text(f.attrs.get("storage", "raw"))
    if storage == "jpeg" and "channels" not in f.attrs:
        errs.append("a JPEG store without a 'channels' attribute")
    for split in ("train", "val"):
        if not isinstance(f.get(split), h5py.Group):
            errs.append(f"no /{split} split")
            continue
        need = ["labels"] + (["jpeg", "offsets", "shapes"] if storage == "jpeg" else ["images"])
        need += ["checksums"] if version >= 2 else []
        for name in need:
            if not isinstance(f[split].get(name), h5py.Dataset):
                why = f" (version {version} files have one)" if name == "checksums" else ""
                errs.append(f"no /{split}/{name}{why}")
        sums = f[split].get("checksums")
        if version >= 2 and isinstance(sums, h5py.Dataset):
            block = sums.attrs.get("block_samples")
            if block is None:
                errs.append(f"/{split}/checksums has no block_samples attribute")
            elif np.asarray(block).size != 1 or int(np.asarray(block).reshape(-1)[0]) < 1:
                errs.append(f"/{split}/checksums: block_samples is {block!r}, not a count >= 1")
        images = f[split].get("images")
        if storage != "jpeg" and isinstance(images, h5py.Dataset) and images.ndim != 4:
            errs.append(f"/{split}/images has {images.ndim} dimensions, not [N, H, W, C]")
    return errs


def generic_checks(f, check):
    """Format, structure, content checksums, mean/std: what holds for every dataset."""
    fmt = text(f.attrs.get("format"))
    check(fmt == "renaissance-dataset", f"format attribute is {fmt!r}")
    version = int(f.attrs.get("version", -1))
    check(version in (1, 2, 3), f"version attribute is {f.attrs.get('version')!r}")
    storage = text(f.attrs.get("storage", "raw"))
    check(version >= 3 or "storage" not in f.attrs, "a 'storage' attribute before version 3")
    check(storage in ("raw", "jpeg"), f"storage attribute is {storage!r}")
    stores = {}
    for split in ("train", "val"):
        st = Store(f, split)
        stores[split] = st
        check(f[f"{split}/labels"].dtype == np.int32, f"/{split}/labels dtype {f[f'{split}/labels'].dtype}")
        if storage == "jpeg":
            check(f[f"{split}/jpeg"].dtype == np.uint8 and f[f"{split}/jpeg"].ndim == 1, f"/{split}/jpeg not uint8 [bytes]")
            check(f[f"{split}/offsets"].dtype == np.int64, f"/{split}/offsets dtype")
            check(st.shapes.shape == (len(st), 2), f"/{split}/shapes shape {st.shapes.shape}")
            check(len(st.offsets) == len(st) + 1 and st.offsets[0] == 0 and st.offsets[-1] == len(st.bytes)
                  and (np.diff(st.offsets) > 0).all(), f"/{split}/offsets do not run from 0 to the byte count")
            check(f[f"{split}/jpeg"].fletcher32, f"/{split}/jpeg has no Fletcher32 checksum")
        else:
            d = f[f"{split}/images"]
            check(d.dtype == np.uint8 and d.ndim == 4, f"/{split}/images not uint8 [N,H,W,C]")
            check(d.chunks is not None and d.fletcher32, f"/{split}/images not chunked with Fletcher32")
            check(len(st.images) == len(st), f"/{split}: {len(st.images)} images, {len(st)} labels")
            tr = f["train/images"]
            # One image shape for the whole file (the network's input): 32x32 val images under 28x28 train ones
            # were reported consistent.
            check(d.shape[1:] == tr.shape[1:] and d.dtype == tr.dtype,
                  f"/{split}/images are {list(d.shape[1:])} {d.dtype}, /train/images {list(tr.shape[1:])} {tr.dtype} "
                  "(H, W, C): the splits differ")
        if version >= 2:
            sums = f[f"{split}/checksums"]
            block = int(sums.attrs["block_samples"])
            want = [st.block_crc(a, min(a + block, len(st))) for a in range(0, len(st), block)]
            bad = [k for k, (w, s) in enumerate(zip(want, sums[...])) if w != int(s)]
            check(len(want) == len(sums) and not bad,
                  f"/{split}/checksums: {len(sums)} stored for {len(want)} blocks, mismatches at blocks {bad[:3]}")
            print(f"/{split}: {len(want)} content checksums (blocks of {block}) "
                  f"{'match' if not bad and len(want) == len(sums) else 'DIFFER'}")
    # mean/std over the train split's pixels as a reader sees them.
    tr = stores["train"]
    if not check(len(tr) > 0, "/train is empty"):
        return stores
    if storage == "jpeg":
        s1 = s2 = 0
        n = 0
        for i in range(len(tr)):
            a = decode_jpeg(tr.encoded(i), tr.channels).astype(np.float64)
            check(a.shape[:2] == tuple(tr.shapes[i]), f"/train sample {i}: decodes to {a.shape[:2]}, shapes says "
                                                      f"{tuple(tr.shapes[i])}")
            s1 = s1 + a.sum(axis=(0, 1))
            s2 = s2 + (a * a).sum(axis=(0, 1))
            n += a.shape[0] * a.shape[1]
        mean = s1 / n / 255.0
        std = np.sqrt(np.maximum(s2 / n - (s1 / n) ** 2, 0)) / 255.0
    else:
        x = tr.images.astype(np.float64) / 255.0
        mean, std = x.mean(axis=(0, 1, 2)), x.std(axis=(0, 1, 2))

    def close(a, b):  # one value per channel (allclose broadcast 2 values against 3 channels into a traceback)
        return np.shape(a) == np.shape(b) and np.allclose(a, b, atol=1e-5)
    ok = check(close(f.attrs["mean"], mean), f"mean {f.attrs['mean']} != {mean}")
    ok &= check(close(f.attrs["std"], std), f"std {f.attrs['std']} != {std}")
    print(f"mean {mean}, std {std} {'match' if ok else 'DIFFER from'} the attributes")
    return stores


def image_folder_listing(root):
    """torchvision.datasets.ImageFolder's make_dataset, written out: classes = sorted subfolders of train/; files by
    sorted(os.walk(class dir, followlinks=True)) and sorted(names), extensions case-insensitive."""
    classes = sorted(e.name for e in os.scandir(os.path.join(root, "train")) if e.is_dir())
    out = {}
    for split in ("train", "val"):
        d = os.path.join(root, split)
        items = []
        if os.path.isdir(d):
            for k, c in enumerate(classes):
                cd = os.path.join(d, c)
                if not os.path.isdir(cd):
                    continue
                for r, _, names in sorted(os.walk(cd, followlinks=True)):
                    for n in sorted(names):
                        if n.lower().endswith(IMG_EXTENSIONS):
                            items.append((os.path.join(r, n), k))
        out[split] = items
    return classes, out


def torchvision_resize_center_crop(im, size):
    """Resize(size) + CenterCrop(size) on a PIL image (torchvision's formulas)."""
    from PIL import Image
    w, h = im.size
    s, l = (w, h) if w <= h else (h, w)
    new_long = int(size * l / s)
    nw, nh = (size, new_long) if w <= h else (new_long, size)
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    a = np.asarray(im)[top:top + size, left:left + size]
    return a[:, :, None] if a.ndim == 2 else a


def folder_compare(f, stores, root, check):
    from PIL import Image
    if not check(os.path.isdir(os.path.join(root, "train")), f"{root}: no train/ directory (an ImageFolder tree is "
                                                             "train/<class>/*, val/<class>/*)"):
        return
    classes, listing = image_folder_listing(root)
    names = [text(n) for n in f.attrs.get("class_names", [])]
    check(names == classes, f"class_names {names[:3]}... differ from the folders {classes[:3]}...")
    storage = text(f.attrs.get("storage", "raw"))
    max_side = int(f.attrs.get("max_side", 0))
    for split, items in listing.items():
        st = stores[split]
        if not check(len(st) == len(items), f"/{split}: {len(st)} samples, the folder has {len(items)} images"):
            continue
        bad = kept = 0
        for i, (path, k) in enumerate(items):
            if st.labels[i] != k:
                bad += 1
                check(False, f"/{split} sample {i} ({path}): label {st.labels[i]}, folder says {k}")
                continue
            try:
                im = Image.open(path)
            except OSError as e:  # a file the importer could not have read either
                bad += 1
                check(False, f"/{split} sample {i} ({path}): Pillow cannot read it ({e})")
                continue
            if storage == "raw":
                c = f[f"{split}/images"].shape[3]
                ref = torchvision_resize_center_crop(im.convert("L" if c == 1 else "RGB"), f[f"{split}/images"].shape[1])
                if not np.array_equal(st.images[i], ref):
                    bad += 1
                    check(False, f"/{split} sample {i} ({path}): pixels differ from Pillow's Resize + CenterCrop")
                continue
            with open(path, "rb") as fh:
                raw = fh.read()
            stored = st.encoded(i)
            fits = max_side == 0 or max(im.size) <= max_side
            keepable = im.format == "JPEG" and im.mode != "CMYK" and fits and (st.channels == 3 or im.mode == "L")
            if keepable:
                kept += 1
                if stored != raw:
                    bad += 1
                    check(False, f"/{split} sample {i} ({path}): stored bytes differ from the file")
                continue
            # Re-encoded: Pillow's own encoding of the source (converted; the longer side resized to max_side, the
            # other in proportion) at the recorded quality (Pillow's defaults: 4:2:0, islow DCT) — the same bytes.
            src = im.convert("L" if st.channels == 1 else "RGB")
            if not fits:
                fct = max_side / max(im.size)
                w, h = im.size
                size = (max_side if w > h else max(1, round(w * fct)), max_side if h >= w else max(1, round(h * fct)))
                src = src.resize(size, Image.BILINEAR)
            buf = io.BytesIO()
            src.save(buf, "JPEG", quality=int(f.attrs["jpeg_quality"]))
            if stored != buf.getvalue():
                bad += 1
                a = decode_jpeg(buf.getvalue(), st.channels).astype(np.int32)
                b = decode_jpeg(stored, st.channels).astype(np.int32)
                err = np.abs(a - b).max() if a.shape == b.shape else f"shape {b.shape} vs {a.shape}"
                check(False, f"/{split} sample {i} ({path}): the re-encoded JPEG is not Pillow's (max diff {err})")
        print(f"/{split}: {len(items)} images against {root}/{split} ({kept} stored as the file's bytes, "
              f"{len(items) - kept} as Pillow encodes them): "
              f"{'match' if not bad else f'{bad} DIFFER'}")


def cifar_compare(f, stores, tarball, check):
    """The loading code of the CIFAR web page: pickle.load(fo, encoding='bytes')."""
    if not check(stores["train"].storage == "raw", "a JPEG store: --cifar compares raw pixels"):
        return
    try:
        cifar_members(f, stores, tarball, check)
    except (tarfile.TarError, OSError, EOFError, zlib.error, pickle.UnpicklingError, KeyError, ValueError,
            TypeError) as e:  # not a tarball, a member missing, a pickle of something else
        why = "not a tar archive" if isinstance(e, tarfile.ReadError) else f"{type(e).__name__}: {e}"
        check(False, f"{tarball}: not a cifar-10/100-python tarball ({why.splitlines()[0]})")


def cifar_members(f, stores, tarball, check):
    with tarfile.open(tarball) as t:
        members = {os.path.basename(m.name): m for m in t.getmembers() if m.isfile()}
        c10 = "data_batch_1" in members
        train = [f"data_batch_{i}" for i in range(1, 6)] if c10 else ["train"]
        test = "test_batch" if c10 else "test"
        k = int(f.attrs["num_classes"])
        key = b"labels" if c10 else (b"coarse_labels" if k == 20 else b"fine_labels")

        def load(name):
            d = pickle.load(t.extractfile(members[name]), encoding="bytes")
            x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            return x, np.asarray(d[key], np.int32)
        for split, names in (("train", train), ("val", [test])):
            xs, ys = zip(*(load(n) for n in names))
            x, y = np.concatenate(xs), np.concatenate(ys)
            st = stores[split]
            ok = check(st.images.shape == x.shape and np.array_equal(st.images, x), f"/{split}/images differ from {names}")
            ok &= check(np.array_equal(st.labels, y), f"/{split}/labels differ from {names}")
            print(f"/{split}: {len(y)} images and labels {'match' if ok else 'DIFFER from'} {', '.join(names)}")
        meta = "batches.meta" if c10 else "meta"
        if meta in members:
            m = pickle.load(t.extractfile(members[meta]), encoding="bytes")
            want = [text(n) for n in m[b"label_names" if c10 else (b"coarse_label_names" if k == 20 else b"fine_label_names")]]
            check([text(n) for n in f.attrs["class_names"]] == want, "class_names differ from the meta member")


def idx_compare(f, stores, idx_dir, check, labels_seen):
    raw = stores["train"].storage == "raw"
    if not check(raw, "a JPEG store: --idx-dir compares raw pixels (`data import fashion-mnist` writes raw stores)"):
        return
    for split, prefix in SPLITS.items():
        try:
            images = read_idx(os.path.join(idx_dir, f"{prefix}-images-idx3-ubyte.gz"), 2051)
            labels = read_idx(os.path.join(idx_dir, f"{prefix}-labels-idx1-ubyte.gz"), 2049)
        except ValueError as e:
            check(False, str(e))
            continue
        if not check(images.ndim == 3 and labels.ndim == 1 and len(images) == len(labels),
                     f"{idx_dir}: {prefix} images {list(images.shape)} and labels {list(labels.shape)} do not pair up"):
            continue
        st = stores[split]
        n_errors = len(ERRORS)
        want = images.shape + (1,)
        if not check(st.images.shape == want, f"/{split}/images shape {st.images.shape}, idx gives {want}"):
            continue
        check(st.labels.shape == labels.shape, f"/{split}/labels shape {st.labels.shape}, idx gives {labels.shape}")
        diff = np.nonzero((st.images.reshape(images.shape) != images).reshape(len(images), -1).any(axis=1))[0]
        check(diff.size == 0, f"/{split}/images: {diff.size} samples differ, first at index {diff[:1]}")
        diff = np.nonzero(st.labels != labels.astype(np.int32))[0]
        check(diff.size == 0, f"/{split}/labels: {diff.size} labels differ, first at index {diff[:1]}")
        labels_seen.append(labels)
        verdict = "match" if len(ERRORS) == n_errors else "DIFFER from"
        print(f"/{split}: {len(st.images)} images {st.images.shape[1:]} and labels {verdict} {prefix}-*-ubyte.gz")


ERRORS = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("file", help="Renaissance dataset (.h5)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--idx-dir", help="directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz")
    src.add_argument("--folder", help="the ImageFolder tree `data import folder` read")
    src.add_argument("--cifar", help="the cifar-10/100-python tarball `data import cifar10/cifar100` read")
    ap.add_argument("--num-classes", type=int, default=None, help="expected num_classes (default: from the source)")
    args = ap.parse_args()

    for what, path, isdir in (("idx directory", args.idx_dir, True), ("folder", args.folder, True),
                              ("tarball", args.cifar, False)):
        if path is not None and not (os.path.isdir(path) if isdir else os.path.isfile(path)):
            print(f"SKIP: {what} {path} not found", file=sys.stderr)
            return SKIP
    if args.folder or (args.file and os.path.exists(args.file)):
        try:
            import PIL  # noqa: F401 (JPEG stores, folders)
        except ImportError as e:
            if args.folder:
                print(f"SKIP: {e} (install python3-pil)", file=sys.stderr)
                return SKIP
    if not os.path.exists(args.file):
        print(f"FAIL: {args.file}: not found", file=sys.stderr)
        return 1

    def check(cond, msg):
        if not cond:
            ERRORS.append(msg)
        return cond

    try:
        f = h5py.File(args.file, "r")
    except OSError as e:
        print(f"FAIL: {args.file}: not an HDF5 file ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
              file=sys.stderr)
        return 1
    with f:
        missing = structure_errors(f)
        for e in missing:
            print(f"FAIL: {args.file}: {e}", file=sys.stderr)
        if missing:
            return 1
        num_classes = int(f.attrs["num_classes"])
        stores = generic_checks(f, check)
        labels_seen = []
        expected_classes = args.num_classes
        if args.idx_dir:
            idx_compare(f, stores, args.idx_dir, check, labels_seen)
            if labels_seen and all(len(y) for y in labels_seen):
                expected_classes = expected_classes or int(max(y.max() for y in labels_seen)) + 1
        elif args.folder:
            folder_compare(f, stores, args.folder, check)
            if os.path.isdir(os.path.join(args.folder, "train")):
                expected_classes = expected_classes or len(image_folder_listing(args.folder)[0])
        elif args.cifar:
            cifar_compare(f, stores, args.cifar, check)
        if expected_classes:
            check(num_classes == expected_classes, f"num_classes {num_classes}, expected {expected_classes}")
        if "class_names" in f.attrs:
            check(len(f.attrs["class_names"]) == num_classes, "class_names length != num_classes")
        for split, st in stores.items():
            check(len(st) == 0 or (st.labels.min() >= 0 and st.labels.max() < num_classes),
                  f"/{split}: labels outside [0, {num_classes})")

    for e in ERRORS:
        print(f"FAIL: {args.file}: {e}", file=sys.stderr)
    if not ERRORS:
        src = args.idx_dir or args.folder or args.cifar
        print(f"OK: {args.file}" + (f" matches {src}" if src else " is consistent"))
    return 1 if ERRORS else 0


if __name__ == "__main__":
    sys.exit(main())
