#!/usr/bin/env python3
"""Turn a Renaissance weights or checkpoint file (HDF5: /params, /bn, optional /ema) into a PyTorch state_dict.

    python3 scripts/export_pytorch.py run/weights.h5 --out model.pt            # torchvision layout when possible
    python3 scripts/export_pytorch.py run/weights.h5 --out model.pt --ema      # the EMA weights
    python3 scripts/export_pytorch.py run/weights.h5 --out model.pt --layout renaissance

    # Check: PyTorch logits on the first 256 validation images vs `renaissance predict` (docs/interop.md)
    python3 scripts/export_pytorch.py run/weights.h5 --out model.pt --check-logits logits.h5 \
        --data data/fashion-mnist.h5 [--device cuda]

Loading the result:
    import torch, renaissance_models as rm            # scripts/ on sys.path
    model = torchvision.models.resnet50(num_classes=...)   # or rm.FmnistCnn(), rm.ResNet(...), see --print-model
    model.load_state_dict(torch.load("model.pt")); model.eval()

The input must be normalised as Renaissance does it: x = pixel/255, (x - mean[c]) / std[c] with mean/std the
dataset file's root attributes, NCHW. Needs numpy, h5py, PyYAML and torch.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import renaissance_models as rm  # noqa: E402


def build_state_dict(path, attrs, tensors, layout, ema):
    arch = rm.arch_from_yaml(rm.arch_plan_text(path, attrs))
    layers, classes, in_c = rm.model_info(arch)
    layout, model = rm.pick_model(layers, classes, in_c, layout)
    names = rm.module_names(layers, layout)
    step = int(attrs.get("step", "0") or 0)
    sd = {}
    for i, l in enumerate(layers):
        if l["kind"] not in rm.TENSOR_ROLES:
            continue
        prefix = names.get(l["name"])
        if prefix is None:
            raise SystemExit(f"layer {l['name']} ({l['kind']}) has no place in the {layout} layout")
        for tname, pname in rm.TENSOR_ROLES[l["kind"]]:
            group = rm.tensor_group(tname)
            if l["kind"] == "Conv" and tname == "b" and not l.get("params", {}).get("bias", False):
                continue  # convs without bias (the default): before the /ema lookup, which has no such tensor either
            key = (group, f"{l['name']}.{tname}")
            if ema and group == "params":
                if ("ema", key[1]) not in tensors:
                    raise SystemExit(f"--ema: the file has no /ema/{key[1]} (train with --ema)")
                key = ("ema", key[1])
            if key not in tensors:
                raise SystemExit(f"the file has no /{key[0]}/{key[1]}")
            sd[f"{prefix}.{pname}"] = rm.torch.from_numpy(rm.to_torch(l, tname, tensors[key], layers, i))
        if l["kind"].startswith("Bn"):
            sd[f"{prefix}.num_batches_tracked"] = rm.torch.tensor(step, dtype=rm.torch.long)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise SystemExit(f"state_dict does not fit the {type(model).__name__}: missing {missing}, unexpected "
                         f"{unexpected}")
    return model, sd, layout, classes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", help="Renaissance weights/checkpoint HDF5 (renaissance train --save)")
    ap.add_argument("--out", required=True, help="state_dict file to write (.pt)")
    ap.add_argument("--layout", choices=["auto", "torchvision", "renaissance"], default="auto",
                    help="auto: torchvision keys where a torchvision-style twin (ResNet, fmnist_cnn) computes exactly "
                    "what the plan does, else Renaissance layer names")
    ap.add_argument("--ema", action="store_true", help="export the EMA weights (/ema) instead of /params")
    ap.add_argument("--print-model", action="store_true", help="print the PyTorch module")
    ap.add_argument("--check-logits", metavar="LOGITS_H5",
                    help="compare PyTorch's logits with `renaissance predict --out LOGITS_H5` (needs --data)")
    ap.add_argument("--data", help="the dataset the logits were computed on")
    ap.add_argument("--device", default="cpu", help="PyTorch device for --check-logits (cpu, cuda)")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="max relative error (max|diff| / max|ref|)")
    args = ap.parse_args()

    rm.refuse_same_file(args.out, {"the weights": args.weights, "--data": args.data, "--check-logits": args.check_logits})
    if os.path.isdir(args.out) or not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise SystemExit(f"{args.out}: --out must be a file in an existing directory")
    if args.check_logits:  # before any work: a check that cannot run is an error, not a traceback after the export
        if not args.data:
            raise SystemExit("--check-logits needs --data")
        rm.check_device(args.device)
    attrs, tensors = rm.read_weights(args.weights)
    model, sd, layout, classes = build_state_dict(args.weights, attrs, tensors, args.layout, args.ema)
    # The reference read before --out is written: logits that cannot be compared are an error without an export.
    ref = reference(args.check_logits, args.data, classes) if args.check_logits else None
    try:
        rm.torch.save(sd, args.out)
    except OSError as e:
        raise SystemExit(f"{args.out}: cannot write it ({e.strerror or e})")
    print(f"{args.weights}: model '{attrs.get('model')}' step {attrs.get('step')} -> {args.out} "
          f"({len(sd)} tensors, {layout} layout, {type(model).__name__})")
    if args.print_model:
        print(model)
    if ref:
        sys.exit(check_logits(model, ref, args.device, args.tolerance))


def reference(logits_path, data_path, classes):
    """(logits, labels, images, mean, std, split, data path) of a `renaissance predict --out` file and the dataset it
    ran on, checked to fit each other and a model of `classes` outputs."""
    import numpy as np
    for path in (logits_path, data_path):
        if not os.path.isfile(path):
            raise SystemExit(f"{path}: no such file")
    with rm.open_h5(logits_path, "logits file") as f:
        if rm._text(f.attrs.get("format", "")) != "renaissance-logits":
            raise SystemExit(f"{logits_path}: not a `renaissance predict --out` file")
        missing = [k for k in ("split", "first") if k not in f.attrs] + [k for k in ("logits", "labels") if k not in f]
        if missing:
            raise SystemExit(f"{logits_path}: no {', '.join(missing)}: not a complete `renaissance predict --out` file")
        ref = np.asarray(f["logits"][...], np.float32)
        labels = np.asarray(f["labels"][...])
        split = rm._text(f.attrs["split"])
        first = int(f.attrs["first"])
    if ref.ndim != 2 or ref.shape[0] == 0:
        raise SystemExit(f"{logits_path}: logits of shape {list(ref.shape)}: no samples to compare")
    if labels.shape != (ref.shape[0],):
        raise SystemExit(f"{logits_path}: {labels.size} labels for {ref.shape[0]} rows of logits")
    if ref.shape[1] != classes:
        raise SystemExit(f"{logits_path}: {ref.shape[1]} logits per sample, the model gives {classes}: the logits of "
                         "another model")
    with rm.open_h5(data_path, "dataset") as d:
        if split not in d or "images" not in d[split] or d[split]["images"].ndim != 4:
            raise SystemExit(f"{data_path}: no raw /{split}/images (a JPEG store cannot be checked here: import the "
                             "images as a raw store, `data import ... --store raw`)")
        if "labels" not in d[split] or "mean" not in d.attrs or "std" not in d.attrs:
            raise SystemExit(f"{data_path}: no /{split}/labels or mean/std attributes: not a Renaissance dataset")
        count = d[split]["images"].shape[0]
        if first + ref.shape[0] > count:
            raise SystemExit(f"{logits_path}: samples [{first}, {first + ref.shape[0]}) of {split}, but {data_path} "
                             f"has {count}: not the dataset the logits were computed on")
        images = d[split]["images"][first:first + ref.shape[0]]
        mean, std = np.atleast_1d(d.attrs["mean"]), np.atleast_1d(d.attrs["std"])
        if not (np.asarray(d[split]["labels"][first:first + ref.shape[0]]) == labels).all():
            raise SystemExit(f"{logits_path}: its labels differ from {data_path}'s: not the dataset the logits were "
                             "computed on")
    if images.shape[3] != len(mean):
        raise SystemExit(f"{data_path}: {images.shape[3]} channels but {len(mean)} mean values")
    return ref, labels, images, mean, std, split, data_path


def check_logits(model, reference, device, tolerance):
    torch = rm.torch
    ref, labels, images, mean, std, split, data_path = reference
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = model.to(device).eval()
    with torch.no_grad():
        try:
            out = model(rm.normalize(images, mean, std).to(device)).double().cpu().numpy()
        except RuntimeError as e:  # another shape or channel count than the model's
            raise SystemExit(f"{data_path}: its {split} images ({list(images.shape[1:])}, HWC) do not fit the model: "
                             f"{str(e).splitlines()[0]}")
    err = rm.relative_error(out, ref)
    agree = float((out.argmax(1) == ref.argmax(1)).mean())
    ok = rm.isfinite_all(out, ref) and err <= tolerance
    print(f"logits check on {ref.shape[0]} {split} samples ({device}): max relative error {err:.3e} "
          f"(tolerance {tolerance:g}), arg-max agreement {agree:.4f}, top1 pytorch "
          f"{float((out.argmax(1) == labels).mean()):.4f} renaissance {float((ref.argmax(1) == labels).mean()):.4f}"
          f" -> {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    main()
