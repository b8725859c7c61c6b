#!/usr/bin/env python3
"""Golden end-to-end data for tests/golden (STYLE habit 7): PyTorch trains the twin of a Renaissance model on one
fixed batch and writes what a C++ test (tests/golden/test_golden.cpp) replays and compares tensor by tensor.

    # FP32 on the CPU (Debian: /usr/bin/python3 with python3-torch); this is how tests/golden/data/*_fp32 was made
    /usr/bin/python3 scripts/golden_pytorch.py --out tests/golden/data
    # AMP on the GPU machine (CUDA autocast FP16 + GradScaler, TF32 off): tests/golden/data/*_amp
    python3 scripts/golden_pytorch.py --out tests/golden/data --device cuda --amp

Cases (positional, default all): fmnist_cnn (the zoo model), tiny_resnet (models/tiny_resnet.yaml). Each goes to
OUT/<case>_<fp32|amp>/:

  data.h5    a Renaissance dataset, version 2 (data/README.md): /train = one batch of random uint8 images (16 grey
             levels, so they compress), balanced labels and their content checksum, /val the same batch (hard
             links); mean/std the batch's own
  init.h5    the initial weights as a Renaissance weights file (format 1, arch_plan attribute; converted as
             scripts/import_pytorch.py does): PyTorch's default initialisation after torch.manual_seed(seed),
             rounded to 16 significant bits (exact in FP32, a quarter smaller compressed)
  golden.h5  format "renaissance-golden", version 1, gzip-compressed datasets:
               /logits/init  [N, K] eval-mode logits of the initial weights on the normalised batch
               /logits/final [N, K] eval-mode logits after the last step (running BN statistics)
               /losses       [steps] float64: the train-mode loss of each step (its forward, before its update)
               /grad/<layer>.<tensor>    every parameter gradient of step 1, Renaissance names and layouts (exact)
               /update/<layer>.<tensor>  final − initial value of every parameter after the last step, rounded to
                                         16 significant bits (8e-6 relative: far below any tolerance it meets)
               /final/bn/<layer>.running_{mean,var}  after the last step (exact)
               /loss_scale   [steps] (AMP) the GradScaler scale each step used
             attributes: model, model_source, torch_version, device, dtype, seed, lr, momentum, steps, batch,
             bn_momentum, bn_eps, loss_scale, arch_plan (the ArchPlan YAML the names come from), command, and
             spread_* (below)

Training: SGD with momentum (PyTorch's: v = mu·v + g, w -= lr·v, Renaissance's `momentum` optimizer), constant lr,
no weight decay, no label smoothing, no augmentation, BN momentum 0.1 and eps 1e-5, mean cross-entropy over the
batch; the input is normalised exactly as Renaissance does it (renaissance_models.normalize). AMP follows
Renaissance's semantics where PyTorch can: FP16 compute, FP32 masters, a dynamic loss scale starting at 65536 that
halves on an overflow (the step is skipped) and doubles after 2000 clean steps; the FP16 rounding points differ
(autocast keeps BN and the loss in FP32, Renaissance stores every activation in FP16), so AMP agrees only loosely.

How well-conditioned each quantity is: the same training runs a second time in a more precise arithmetic (FP32
goldens: float64; AMP goldens: FP32 without autocast) and the distance between the two is recorded as
spread_logits_init, spread_grad, spread_losses, spread_update, spread_bn, spread_logits_final (max |a − b| / max |b|
over the tensors of that kind; losses: max relative). Two implementations of the same arithmetic can differ by about
that much, so the C++ test never demands less than a multiple of it where ten steps of training amplify differences.
FP32 goldens also record sensitivity_grad: the worst distance of step 1's gradients from the float64 run's over
SENSITIVITY_RUNS runs whose every convolution output carries uniform noise of ±SENSITIVITY_NOISE of its largest |value|
(an absolute error the size of FP32's rounding of the largest value, as a convolution engine with other tiling and
summation order makes: a pre-ReLU value that close to zero flips its ReLU's mask, a max-pool tie goes the other way,
and the batch sums of the gradients cancel). The GPU replays hold step 1's gradients to at least that.

Needs numpy, h5py, PyYAML, torch and the renaissance executable (`renaissance plan --yaml`: the ArchPlan, whose layer
and tensor names the files use; --renaissance PATH, default build/app/renaissance or build-gpu/app/renaissance).
"""

import argparse
import copy
import os
import shlex
import sys
import types
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import renaissance_models as rm  # noqa: E402
import import_pytorch as ip  # noqa: E402

torch = rm.torch
F = rm.F
h5py = rm.h5py

GOLDEN_FORMAT = "renaissance-golden"
# HDF5 1.10's file format at most: Renaissance links the system HDF5 (1.10 on Debian 12 and on the GPU machine),
# which cannot read what a newer h5py wheel (HDF5 1.14) writes with libver="latest".
LIBVER = ("earliest", "v110")
CASES = {  # case -> (zoo model | None, model file relative to the repository root | None)
    "fmnist_cnn": ("fmnist_cnn", None),
    "tiny_resnet": (None, "models/tiny_resnet.yaml"),
}
LOSS_SCALE = 65536.0  # TrainOptions::loss_scale
LOSS_SCALE_INTERVAL = 2000  # TrainOptions::loss_scale_interval


# ---- files --------------------------------------------------------------------------------------------------------

def make_batch(n, h, w, c, classes, seed):
    """Random uint8 images with 16 grey levels (0, 17, ..., 255) and balanced labels, a function of the seed only."""
    rng = np.random.RandomState(seed)
    images = (17 * rng.randint(0, 16, size=(n, h, w, c))).astype(np.uint8)
    labels = rng.permutation(np.arange(n) % classes).astype(np.int32)
    return images, labels


def write_dataset(path, images, labels, classes):
    x = images.astype(np.float64) / 255.0
    mean = x.mean(axis=(0, 1, 2)).astype(np.float32)
    std = x.std(axis=(0, 1, 2)).astype(np.float32)  # population std, as `renaissance data` computes it
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w", libver=LIBVER) as f:
            f.attrs["format"] = "renaissance-dataset"
            f.attrs["version"] = np.int32(2)  # with content checksums (data/README.md)
            f.attrs["num_classes"] = np.int32(classes)
            f.attrs["mean"] = mean
            f.attrs["std"] = std
            f.create_dataset("train/images", data=images, chunks=images.shape, compression="gzip",
                             compression_opts=9, fletcher32=True)
            f.create_dataset("train/labels", data=labels, chunks=labels.shape, fletcher32=True)
            # One block of all the samples (the images chunk): CRC-32 of its images, continued over its labels.
            crc = zlib.crc32(labels.astype("<i4").tobytes(), zlib.crc32(images.tobytes()))
            sums = f.create_dataset("train/checksums", data=np.asarray([crc], np.uint32), fletcher32=True)
            sums.attrs["block_samples"] = np.int64(len(images))
            f.create_group("val")
            for name in ("images", "labels", "checksums"):
                f[f"val/{name}"] = f[f"train/{name}"]  # hard links: the same batch, stored once
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return mean, std


def round_to_16_bits(a):
    """float32 values rounded (to nearest even) to 16 significant bits: the low 8 mantissa bits zero."""
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7F + ((b >> 8) & 1)) & ~np.uint64(0xFF)
    return b.astype(np.uint32).view(np.float32)


def write_weights(path, tensors, attrs):
    """A Renaissance weights file (format 1, as scripts/import_pytorch.py writes it) whose tensors are gzip-compressed
    where that keeps at least one stored byte per value (the reader refuses less as truncated: BN's ones and zeros,
    an AMP first conv's zero channels stay plain)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    plain = set()
    try:
        for _ in range(2):
            with h5py.File(tmp, "w", libver=LIBVER) as f:
                for k, v in attrs.items():
                    f.attrs[k] = np.bytes_(v.encode())  # fixed-length strings, as Renaissance writes them
                for key, value in tensors.items():
                    kw = {} if key in plain else dict(compression="gzip", compression_opts=9, shuffle=True)
                    f.require_group(key[0]).create_dataset(key[1], data=value.astype("<f4"), chunks=value.shape,
                                                           fletcher32=True, **kw)
            with h5py.File(tmp, "r") as f:
                small = {k for k, v in tensors.items() if f[k[0]][k[1]].id.get_storage_size() < v.size}
            if not small:
                break
            plain |= small
        if small:
            raise SystemExit(f"{path}: {sorted(small)} store less than one byte per value")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def put(f, name, value, dtype="<f4"):
    value = np.asarray(value)
    kw = dict(chunks=value.shape, compression="gzip", compression_opts=9, shuffle=True) if value.size > 16 else {}
    f.create_dataset(name, data=value.astype(dtype), **kw)


# ---- the PyTorch run ----------------------------------------------------------------------------------------------

def plain_tensors(layers):
    """(layer index, layer, Renaissance tensor name, PyTorch attribute, group) of every tensor of the plan."""
    out = []
    for i, l in enumerate(layers):
        if l["kind"] not in rm.TENSOR_ROLES:
            continue
        for tname, pname in rm.TENSOR_ROLES[l["kind"]]:
            if l["kind"] == "Conv" and tname == "b" and not l.get("params", {}).get("bias", False):
                continue
            out.append((i, l, tname, pname, rm.tensor_group(tname)))
    return out


def renaissance_tensors(model, layers, which):
    """{(group, "<layer>.<tensor>"): float64 array in Renaissance layout} of the model's values or gradients."""
    out = {}
    for i, l, tname, pname, group in plain_tensors(layers):
        if which == "grad" and group != "params":
            continue
        t = getattr(model.mods[rm.module_key(l["name"])], pname)
        if which == "grad":
            if t.grad is None:
                raise SystemExit(f"no gradient for {l['name']}.{tname}")
            t = t.grad
        value = t.detach().cpu().double().numpy().copy()  # a copy: on the CPU .numpy() shares the tensor's memory
        shape = ip.renaissance_shape(l, tname)
        out[(group, f"{l['name']}.{tname}")] = rm.from_torch(l, tname, value, shape, layers, i).astype(np.float64)
    return out


def train(model, layers, x, y, args, amp):
    """Eval logits, `steps` training steps, eval logits: everything the golden records, as float64 arrays."""
    def forward():
        if amp:
            with torch.autocast("cuda", dtype=torch.float16):
                return model(x).float()
        return model(x)

    def eval_logits():
        model.eval()
        with torch.no_grad():
            z = forward().detach().cpu().double().numpy()
        model.train()
        return z

    r = {"logits_init": eval_logits(), "scales": []}
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=0.0)
    scaler = None
    if amp:
        kw = dict(init_scale=LOSS_SCALE, growth_factor=2.0, backoff_factor=0.5, growth_interval=LOSS_SCALE_INTERVAL)
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # PyTorch >= 2.3
            scaler = torch.amp.GradScaler("cuda", **kw)
        else:
            scaler = torch.cuda.amp.GradScaler(**kw)
    losses = []
    model.train()
    for step in range(args.steps):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(forward(), y)  # mean over the batch, no label smoothing
        if scaler:
            r["scales"].append(scaler.get_scale())
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        if step == 0:
            r["grads"] = renaissance_tensors(model, layers, "grad")
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        losses.append(float(loss.detach().cpu()))
    r["losses"] = np.asarray(losses)
    r["logits_final"] = eval_logits()
    r["final"] = renaissance_tensors(model, layers, "value")
    return r


SENSITIVITY_NOISE = 1e-7  # of a convolution output's largest |value|: about FP32's rounding of the largest value
SENSITIVITY_RUNS = 4


def step1_grads(model, layers, x, y, seed):
    """Step 1's gradients (float64 arrays) of a copy of `model` whose every convolution output carries uniform noise
    of ±SENSITIVITY_NOISE × its largest |value| (seeded)."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)

    def perturb(_mod, _inp, out):
        u = torch.rand(out.shape, generator=g, dtype=out.dtype).to(out.device) * 2 - 1
        return out + u * (SENSITIVITY_NOISE * out.detach().abs().max())

    for mod in m.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(perturb)
    m.train()
    m.zero_grad(set_to_none=False)
    F.cross_entropy(m(x), y).backward()
    return renaissance_tensors(m, layers, "grad")


def spread(a, b):
    """max |a − b| / max |b| over arrays (or dicts of arrays, the worst tensor)."""
    if isinstance(a, dict):
        return max(spread(a[k], b[k]) for k in b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# ---- one case ------------------------------------------------------------------------------------------------------

def run_case(case, args):
    zoo, model_file = CASES[case]
    tag = f"{case}_{'amp' if args.amp else 'fp32'}"
    out_dir = os.path.join(args.out, tag)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:  # a file in the way, no permission
        raise SystemExit(f"--out {args.out}: cannot make {out_dir} ({e.strerror or e})")
    ns = types.SimpleNamespace(like=None, renaissance=args.renaissance, model=zoo,
                               model_file=os.path.join(ROOT, model_file) if model_file else None,
                               classes=0, resolution=0, amp=args.amp)
    arch_text = ip.arch_yaml(ns)
    arch = rm.arch_from_yaml(arch_text)
    layers, classes, in_c = rm.model_info(arch)
    _, h, w, _ = arch["input"]  # its channels are padded under AMP; the images have input_channels
    device = torch.device(args.device)

    images, labels = make_batch(args.batch, h, w, in_c, classes, args.seed)
    mean, std = write_dataset(os.path.join(out_dir, "data.h5"), images, labels, classes)

    torch.manual_seed(args.seed)
    model = rm.torch_model(layers, classes, in_c, "renaissance")  # PyTorch's default initialisation, on the CPU
    for m in model.modules():
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            m.momentum, m.eps = args.bn_momentum, args.bn_eps
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(round_to_16_bits(p.detach().numpy())))
    init = renaissance_tensors(model, layers, "value")
    write_weights(os.path.join(out_dir, "init.h5"), {k: v.astype(np.float32) for k, v in init.items()},
                  {"format": rm.WEIGHTS_FORMAT, "version": "1", "model": str(arch.get("model", "")),
                   "arch_plan": arch_text, "step": "0", "plan_hash": "imported",
                   "source": f"scripts/golden_pytorch.py seed {args.seed}"})
    precise = copy.deepcopy(model)  # the second run: float64 (FP32 goldens) or FP32 (AMP goldens)
    perturbed = copy.deepcopy(model)  # FP32 goldens: step 1 again with noisy convolution outputs

    x = rm.normalize(images, mean, std).to(device)
    y = torch.from_numpy(labels.astype(np.int64)).to(device)
    r = train(model.to(device), layers, x, y, args, args.amp)
    if args.amp:
        p = train(precise.to(device), layers, x, y, args, False)
    else:
        p = train(precise.to(device, torch.float64), layers, x.double(), y, args, False)
    updates = {k: v - init[k] for k, v in r["final"].items() if k[0] == "params"}
    sensitivity = {}
    if not args.amp:
        sensitivity["sensitivity_grad"] = max(
            spread(step1_grads(perturbed.to(device), layers, x, y, s), p["grads"])
            for s in range(SENSITIVITY_RUNS))
    spreads = {
        "spread_logits_init": spread(r["logits_init"], p["logits_init"]),
        "spread_grad": spread(r["grads"], p["grads"]),
        "spread_losses": float(np.max(np.abs(r["losses"] - p["losses"]) / np.abs(p["losses"]))),
        "spread_update": spread(updates, {k: p["final"][k] - init[k] for k in updates}),
        "spread_bn": spread({k: v for k, v in r["final"].items() if k[0] == "bn"},
                            {k: v for k, v in p["final"].items() if k[0] == "bn"}),
        "spread_logits_final": spread(r["logits_final"], p["logits_final"]),
    }

    attrs = {
        "format": GOLDEN_FORMAT,
        "version": np.int32(1),
        "model": str(arch.get("model", "")),
        "model_source": f"--model {zoo}" if zoo else f"--model-file {model_file}",
        "torch_version": str(torch.__version__),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": "amp" if args.amp else "fp32",
        "seed": np.int64(args.seed),
        "lr": np.float64(args.lr),
        "momentum": np.float64(args.momentum),
        "steps": np.int64(args.steps),
        "batch": np.int64(args.batch),
        "bn_momentum": np.float64(args.bn_momentum),
        "bn_eps": np.float64(args.bn_eps),
        "loss_scale": np.float64(LOSS_SCALE if args.amp else 1.0),
        "arch_plan": arch_text,
        "command": " ".join(shlex.quote(s) for s in ["scripts/golden_pytorch.py"] + sys.argv[1:]),
        "spread_reference": "fp32" if args.amp else "float64",
    }
    attrs.update({k: np.float64(v) for k, v in spreads.items()})
    attrs.update({k: np.float64(v) for k, v in sensitivity.items()})
    path = os.path.join(out_dir, "golden.h5")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w", libver=LIBVER) as f:
            f.attrs.update(attrs)
            put(f, "logits/init", r["logits_init"])
            put(f, "logits/final", r["logits_final"])
            put(f, "losses", r["losses"], "<f8")
            if r["scales"]:
                put(f, "loss_scale", np.asarray(r["scales"]), "<f8")
            for (_, name), v in r["grads"].items():
                put(f, f"grad/{name}", v)
            for (_, name), v in updates.items():
                put(f, f"update/{name}", round_to_16_bits(v.astype(np.float32)))
            for (group, name), v in r["final"].items():
                if group == "bn":
                    put(f, f"final/bn/{name}", v)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    size = sum(os.path.getsize(os.path.join(out_dir, n)) for n in ("data.h5", "init.h5", "golden.h5"))
    print(f"{tag}: {len(r['grads'])} gradients, losses {r['losses'][0]:.6f} -> {r['losses'][-1]:.6f}, "
          f"{size / 1024:.0f} KiB in {out_dir} (torch {attrs['torch_version']}, {attrs['device']}); spread against "
          f"{attrs['spread_reference']}: " + ", ".join(f"{k[7:]} {v:.1e}" for k, v in spreads.items()) +
          "".join(f"; {k} {v:.1e}" for k, v in sensitivity.items()))


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=list(CASES), help=f"cases to write (default: {' '.join(CASES)})")
    ap.add_argument("--out", required=True, help="directory; each case goes to OUT/<case>_<fp32|amp>/")
    ap.add_argument("--device", default="cpu", help="PyTorch device: cpu or cuda (AMP needs cuda)")
    ap.add_argument("--amp", action="store_true", help="CUDA autocast FP16 + GradScaler; the AMP (fused) plan")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed and the batch's random images")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--steps", type=positive, default=10)
    ap.add_argument("--batch", type=positive, default=32)
    ap.add_argument("--bn-momentum", type=float, default=0.1)
    ap.add_argument("--bn-eps", type=float, default=1e-5)
    ap.add_argument("--threads", type=positive, default=1, help="torch.set_num_threads on the CPU")
    ap.add_argument("--renaissance", help="the renaissance executable (default: build/app/renaissance, then "
                    "build-gpu/app/renaissance)")
    args = ap.parse_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    if args.amp and not args.device.startswith("cuda"):
        raise SystemExit("--amp needs --device cuda (PyTorch's CPU autocast has no FP16)")
    rm.check_device(args.device)  # before any file is written
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise SystemExit(f"--out {args.out}: not a directory (each case goes to OUT/<case>_<fp32|amp>/)")
    if not args.renaissance:  # import_pytorch.find_cli's places, and scripts/gpu-test's build directory
        gpu_build = os.path.join(ROOT, "build-gpu", "app", "renaissance")
        try:
            args.renaissance = ip.find_cli(None)
        except SystemExit:
            if not os.access(gpu_build, os.X_OK):
                raise
            args.renaissance = gpu_build
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # Renaissance's FP32 is strict FP32 (no TF32 by default)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    for case in args.cases:
        run_case(case, args)


if __name__ == "__main__":
    main()
