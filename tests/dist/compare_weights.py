#!/usr/bin/env python3
"""Compares two weights files written by `renaissance train --save` tensor by tensor.

    compare_weights.py A.h5 B.h5 --max-rel 1e-5      exit 0 when every tensor agrees within max-rel
    compare_weights.py A.h5 B.h5 --min-rel 1e-3      exit 0 when some tensor differs by at least min-rel
                                                       (the check that the comparison can fail)
Relative difference of a tensor: max|a - b| / max(max|a|, 1e-12). Also prints how many tensors differ at all
("N of M tensors differ": bit-identity of two runs). Exit 77 when h5py is missing.
"""
import argparse
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = np.asarray(obj[...], dtype=np.float64)
        f.visititems(visit)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--max-rel", type=float)
    ap.add_argument("--min-rel", type=float)
    args = ap.parse_args()
    ta, tb = tensors(args.a), tensors(args.b)
    if sorted(ta) != sorted(tb):
        print(f"FAIL: tensor names differ: {sorted(set(ta) ^ set(tb))}")
        return 1
    if not ta:
        print("FAIL: no tensors")
        return 1
    worst, worst_name, differing = 0.0, "", 0
    for name in sorted(ta):
        a, b = ta[name], tb[name]
        if a.shape != b.shape:
            print(f"FAIL: {name}: shape {a.shape} vs {b.shape}")
            return 1
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            print(f"FAIL: {name}: NaN or inf")
            return 1
        rel = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-12))
        print(f"{name:40s} {str(a.shape):20s} rel diff {rel:.3e}")
        differing += bool(np.any(a != b))
        if rel > worst:
            worst, worst_name = rel, name
    print(f"{differing} of {len(ta)} tensors differ")
    print(f"worst: {worst_name} {worst:.3e} over {len(ta)} tensors")
    if args.max_rel is not None and worst > args.max_rel:
        print(f"FAIL: {worst_name} differs by {worst:.3e} > {args.max_rel:g}")
        return 1
    if args.min_rel is not None and worst < args.min_rel:
        print(f"FAIL: the files agree within {worst:.3e}, expected a difference >= {args.min_rel:g}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
