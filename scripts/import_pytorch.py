#!/usr/bin/env python3
"""Turn a PyTorch state_dict into a Renaissance weights file (`renaissance eval --weights`, `predict`, ...).

    # the layer names come from the model's ArchPlan: from `renaissance plan --yaml` ...
    python3 scripts/import_pytorch.py model.pt --out weights.h5 --model resnet18_cifar [--renaissance build/app/renaissance]
    python3 scripts/import_pytorch.py model.pt --out weights.h5 --model-file models/tiny_resnet.yaml --classes 10
    # ... or from any weights file Renaissance wrote for the same model
    python3 scripts/import_pytorch.py model.pt --out weights.h5 --like run/weights.h5

The state_dict may use the torchvision layout (conv1, bn1, layer1.0.conv1, ..., fc; fmnist_cnn: conv1..conv3,
bn1..bn3, fc) or the "renaissance" layout that export_pytorch.py --layout renaissance writes (detected by its
"mods." prefix). Conv weights go OIHW -> OHWI, an fc after a flatten gets its columns back in NHWC order.
Needs numpy, h5py, PyYAML and torch.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import renaissance_models as rm  # noqa: E402


def find_cli(explicit):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for cand in ("build/app/renaissance", "build-interop/app/renaissance", "build/release/app/renaissance"):
        p = os.path.join(here, cand)
        if os.access(p, os.X_OK):
            return p
    p = shutil.which("renaissance")
    if p:
        return p
    raise SystemExit("cannot find the renaissance executable; pass --renaissance PATH or --like FILE.h5")


def arch_yaml(args):
    if args.like:
        attrs, _ = rm.read_weights(args.like)
        return attrs["arch_plan"]
    cmd = [find_cli(args.renaissance), "plan", "--yaml"]
    cmd += ["--model-file", args.model_file] if args.model_file else ["--model", args.model]
    if args.classes:
        cmd += ["--classes", str(args.classes)]
    if args.resolution:
        cmd += ["--resolution", str(args.resolution)]
    if args.amp:
        cmd += ["--amp"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr.strip()}")
    return r.stdout


def write_weights(path, tensors, attrs):
    import h5py
    import numpy as np
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in attrs.items():
                # as Renaissance writes them: integers as int64, strings variable-length UTF-8 (h5py's str)
                f.attrs[k] = np.int64(v) if isinstance(v, int) else str(v)
            for (group, name), value in tensors.items():
                g = f.require_group(group)
                g.create_dataset(name, data=value.astype("<f4"), chunks=value.shape, fletcher32=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("state_dict", help="PyTorch state_dict (.pt), e.g. written by export_pytorch.py")
    ap.add_argument("--out", required=True, help="Renaissance weights file to write (.h5)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="zoo model name (see `renaissance plan --help`)")
    src.add_argument("--model-file", help="model YAML")
    src.add_argument("--like", help="a Renaissance weights/checkpoint file of the same model (gives the ArchPlan)")
    ap.add_argument("--classes", type=int, default=0)
    ap.add_argument("--resolution", type=int, default=0)
    ap.add_argument("--amp", action="store_true", help="for an --amp run: the first conv padded to 8 input channels")
    ap.add_argument("--renaissance", help="path of the renaissance executable (default: build/app/renaissance)")
    ap.add_argument("--ema", action="store_true", help="also write the weights as the EMA copy (/ema)")
    args = ap.parse_args()

    rm.refuse_same_file(args.out, {"the state_dict": args.state_dict, "--like": args.like,
                                   "--model-file": args.model_file})
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if os.path.isdir(args.out) or not os.path.isdir(out_dir):
        raise SystemExit(f"{args.out}: --out must be a file in an existing directory")
    torch = rm.torch
    if not os.path.isfile(args.state_dict):
        raise SystemExit(f"{args.state_dict}: no such file")
    # weights_only: tensors and plain containers only; a pickle that would run code (a crafted .pt ran os.system
    # here) or a whole pickled module is refused.
    try:
        sd = torch.load(args.state_dict, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises UnpicklingError, RuntimeError, ...)
        # One line (the error is the last line) with torch's reason. PyTorch 1.13: "... WeightsUnpickler error:
        # Unsupported class posix.system"; 2.x: a paragraph of advice, then "Trying to load unsupported GLOBAL
        # posix.system whose module posix is blocked." on a line of its own.
        reason = re.search(r"\w+ error:\s*[^\n]+", str(e))
        lines = [" ".join(line.split()) for line in str(e).splitlines() if line.strip()]
        why = reason.group(0) if reason else next((line for line in lines if "unsupported" in line.lower()),
                                                 lines[0] if lines else type(e).__name__)
        why = why if len(why) <= 300 else why[:297] + "..."
        raise SystemExit(f"{args.state_dict}: not a plain state_dict (loaded with weights_only=True: {why}); save "
                         "model.state_dict() instead of the module")
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise SystemExit(f"{args.state_dict}: holds a {type(sd).__name__}, not a state_dict (a dict of tensors)")
    text = arch_yaml(args)
    arch = rm.arch_from_yaml(text)
    layers, classes, in_c = rm.model_info(arch)
    layout = "renaissance" if any(k.startswith("mods.") for k in sd) else "torchvision"
    names = rm.module_names(layers, layout)

    # Shapes come from the Renaissance side: the conversions need them (padded first-conv channels under AMP).
    out, used = {}, set()
    for i, l in enumerate(layers):
        if l["kind"] not in rm.TENSOR_ROLES:
            continue
        prefix = names[l["name"]]
        for tname, pname in rm.TENSOR_ROLES[l["kind"]]:
            key = f"{prefix}.{pname}"
            if l["kind"] == "Conv" and tname == "b" and not l.get("params", {}).get("bias", False):
                continue
            if key not in sd:
                raise SystemExit(f"{args.state_dict}: no '{key}' for Renaissance tensor {l['name']}.{tname}")
            value = sd[key].detach().cpu().float().numpy()
            shape = renaissance_shape(l, tname)
            out[(rm.tensor_group(tname), f"{l['name']}.{tname}")] = rm.from_torch(l, tname, value, shape, layers, i)
            used.add(key)
    unused = [k for k in sd if k not in used and not k.endswith("num_batches_tracked")]
    if unused:
        raise SystemExit(f"{args.state_dict}: tensors with no Renaissance counterpart: {unused[:8]}")
    if args.ema:
        for (g, n), v in list(out.items()):
            if g == "params":
                out[("ema", n)] = v
    attrs = {"format": rm.WEIGHTS_FORMAT, "version": 1, "model": str(arch.get("model", "")), "arch_plan": text,
             "step": 0, "plan_hash": "imported", "source": os.path.basename(args.state_dict)}
    write_weights(args.out, out, attrs)
    print(f"{args.state_dict} ({layout} layout) -> {args.out}: {len(out)} tensors for model '{attrs['model']}'")


def renaissance_shape(layer, tname):
    """(n, h, w, c) of a Renaissance tensor, as infer_tensors in lib/renaissance/plan/layers/ declares it."""
    kind, p = layer["kind"], layer.get("params", {})
    n, h, w, c = layer["in"]
    if kind == "Conv":
        if tname == "w":
            groups = p.get("groups", 1) or 1
            if groups < 1:
                groups = c
            return (p["out_c"], p["k"], p["k"], c // groups)
        return (1, 1, 1, layer["out"][3])
    if kind == "Fc":
        return (p["out"], 1, 1, h * w * c) if tname == "w" else (1, 1, 1, p["out"])
    return (1, 1, 1, c)


if __name__ == "__main__":
    main()
