#!/usr/bin/env python3
"""Writes a tarball in the format of cifar-10-python.tar.gz / cifar-100-python.tar.gz with generated images.

The real tarballs (https://www.cs.toronto.edu/~kriz/cifar.html) hold Python 2 pickles, protocol 2: dicts whose keys
are Python 2 str (SHORT_BINSTRING opcodes, read by Python 3 as bytes with encoding="bytes"), b"data" a numpy uint8
array [N, 3072] (numpy.core.multiarray._reconstruct + BUILD with the raw bytes as one BINSTRING), b"labels" (CIFAR-10)
or b"fine_labels"/b"coarse_labels" (CIFAR-100) lists of ints, b"filenames", b"batch_label"; batches.meta / meta with
the label names. Python 3's pickle writes bytes differently under protocol 2 (as _codecs.encode(str, "latin1")
calls), so --style py2 (the default) writes with a pickle._Pickler whose str and bytes are saved as Python 2 saved str
(SHORT_BINSTRING / BINSTRING): the opcodes of the real files. --style py3 writes Python 3's own protocol-2 (or
--protocol N) pickle of the same dicts, which the importer reads too.

  scripts/make_cifar_tarball.py --variant 10 --per-batch 100 --out /tmp/cifar-10-python.tar.gz

Deterministic (same arguments, same bytes). Needs numpy (exit 77 without it).
"""
import argparse
import gzip
import io
import os
import pickle
import struct
import sys
import tarfile

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (install python3-numpy)", file=sys.stderr)
    sys.exit(77)

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class Py2Pickler(pickle._Pickler):
    """Saves str and bytes the way Python 2's cPickle saved str under protocol 2."""
    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj):
        b = obj if isinstance(obj, bytes) else obj.encode("latin1")
        if len(b) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(b)]) + b)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(b)) + b)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def dumps(obj, style, protocol):
    if style == "py3":
        return pickle.dumps(obj, protocol=protocol)
    f = io.BytesIO()
    Py2Pickler(f, protocol=2).dump(obj)
    return f.getvalue()


def images(rng, labels, classes):
    """32x32x3 images: a class colour, a class stripe orientation and noise; rows of 1024 R, 1024 G, 1024 B."""
    n = len(labels)
    yy, xx = np.mgrid[0:32, 0:32]
    out = np.empty((n, 3, 32, 32), np.uint8)
    for i, k in enumerate(labels):
        colour = np.array([(k * 37) % 200 + 30, (k * 91) % 200 + 30, (k * 53) % 200 + 30], np.float64)
        stripe = np.sin((xx if k % 2 else yy) * (0.3 + 0.05 * (k % 7)))
        img = colour[:, None, None] + 40 * stripe[None] + rng.normal(0, 20, size=(3, 32, 32))
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out.reshape(n, 3072)


def batch(rng, n, classes, variant, label, first):
    fine = rng.integers(0, classes, size=n)
    d = {"batch_label" if variant == 10 else "batch_label": label,
         "data": images(rng, fine, classes),
         "filenames": [f"gen_{first + i:06d}.png" for i in range(n)]}
    if variant == 10:
        d["labels"] = [int(v) for v in fine]
    else:
        d["fine_labels"] = [int(v) for v in fine]
        d["coarse_labels"] = [int(v) // 5 for v in fine]
    return d


def keys_as_bytes(d):
    """Python 3 style: the dict as pickle.load(..., encoding='bytes') returns the real one (bytes keys and strings)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, str):
            v = v.encode()
        elif isinstance(v, list) and v and isinstance(v[0], str):
            v = [s.encode() for s in v]
        out[k.encode()] = v
    return out


def at_least(low):
    def parse(text):
        v = int(text)
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v
    return parse


def protocol(text):
    v = int(text)
    if not 0 <= v <= pickle.HIGHEST_PROTOCOL:
        raise argparse.ArgumentTypeError(f"a pickle protocol is 0 to {pickle.HIGHEST_PROTOCOL}, got {v}")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", type=int, choices=[10, 100], default=10)
    ap.add_argument("--per-batch", type=at_least(1), default=100, help="images per train batch (the real files: 10000)")
    ap.add_argument("--test", type=at_least(0), default=None, help="test images (default: --per-batch)")
    ap.add_argument("--style", choices=["py2", "py3"], default="py2")
    ap.add_argument("--protocol", type=protocol, default=2, help="--style py3: the pickle protocol")
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if os.path.isdir(a.out):
        sys.exit(f"make_cifar_tarball: --out {a.out}: is a directory")
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        sys.exit(f"make_cifar_tarball: --out {a.out}: the directory {out_dir} does not exist or is not writable")
    rng = np.random.default_rng(a.seed)
    classes = a.variant
    ntest = a.per_batch if a.test is None else a.test
    fix = (lambda d: d) if a.style == "py2" else keys_as_bytes
    members = []
    if a.variant == 10:
        root = "cifar-10-batches-py"
        for b in range(1, 6):
            members.append((f"{root}/data_batch_{b}",
                            fix(batch(rng, a.per_batch, classes, 10, f"training batch {b} of 5", (b - 1) * a.per_batch))))
        members.append((f"{root}/test_batch", fix(batch(rng, ntest, classes, 10, "testing batch 1 of 1", 0))))
        members.append((f"{root}/batches.meta", fix({"label_names": CIFAR10_NAMES, "num_cases_per_batch": a.per_batch,
                                                      "num_vis": 3072})))
    else:
        root = "cifar-100-python"
        members.append((f"{root}/train", fix(batch(rng, 5 * a.per_batch, classes, 100, "training batch 1 of 1", 0))))
        members.append((f"{root}/test", fix(batch(rng, ntest, classes, 100, "testing batch 1 of 1", 0))))
        members.append((f"{root}/meta", fix({"fine_label_names": [f"fine_{k:02d}" for k in range(100)],
                                             "coarse_label_names": [f"coarse_{k:02d}" for k in range(20)]})))
    # Written beside --out and renamed over it: an interrupted or failed run leaves no half tarball under its name.
    tmp = f"{a.out}.tmp-{os.getpid()}"
    try:
        # filename: the gzip header names --out, not the temporary (same arguments, same bytes)
        with open(tmp, "wb") as raw, gzip.GzipFile(a.out, mode="wb", fileobj=raw, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
            d = tarfile.TarInfo(root)
            d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(d)
            readme = tarfile.TarInfo(f"{root}/readme.html")
            body = b"<html>generated by scripts/make_cifar_tarball.py</html>\n"
            readme.size, readme.mtime = len(body), 0
            tar.addfile(readme, io.BytesIO(body))
            for name, obj in members:
                data = dumps(obj, a.style, a.protocol)
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, a.out)
    except OSError as e:
        sys.exit(f"make_cifar_tarball: --out {a.out}: {e.strerror or e}")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"wrote {a.out}: CIFAR-{a.variant} format ({a.style} pickles), {5 * a.per_batch} train, {ntest} test images")


if __name__ == "__main__":
    main()
