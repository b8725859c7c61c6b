#!/usr/bin/env python3
"""PyTorch on one GPU, timed the way `renaissance bench` times itself: synthetic data already on the GPU,
SGD with momentum, `--warmup` untimed steps, then `--steps` timed steps between two synchronisations.

Modes: eager (AMP fp16 autocast + GradScaler + channels_last), compile (torch.compile, mode reduce-overhead),
compile-max (mode max-autotune). One JSON object per line:
{"framework": "pytorch", "model", "mode", "batch", "resolution", "images_per_s", "ms_per_step", "peak_allocated_bytes", ...}

    python3 scripts/bench/pytorch_gpu.py --model resnet50 --batch 256 --mode eager
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torchvision


def resnet18_cifar(classes=10):
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


def fmnist_cnn(classes=10):
    def cbr(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
    return nn.Sequential(*cbr(1, 32), nn.MaxPool2d(2), *cbr(32, 64), nn.MaxPool2d(2), *cbr(64, 64), nn.Flatten(),
                         nn.Linear(7 * 7 * 64, classes))


def vgg16():
    # as the zoo builds it: configuration D without BN and without dropout
    m = torchvision.models.vgg16()
    m.classifier = nn.Sequential(*[nn.Identity() if isinstance(l, nn.Dropout) else l for l in m.classifier])
    return m


def mobilenet_v2():
    # as the zoo builds it: ReLU for ReLU6, no dropout
    m = torchvision.models.mobilenet_v2()
    for mod in m.modules():
        for name, child in mod.named_children():
            if isinstance(child, nn.ReLU6):
                setattr(mod, name, nn.ReLU(inplace=True))
            elif isinstance(child, nn.Dropout):
                setattr(mod, name, nn.Identity())
    return m


MODELS = {
    "resnet50": (lambda: torchvision.models.resnet50(), 224, 3, 1000),
    "resnet101": (lambda: torchvision.models.resnet101(), 224, 3, 1000),
    "resnet18": (lambda: torchvision.models.resnet18(), 224, 3, 1000),
    "vgg16": (vgg16, 224, 3, 1000),
    "mobilenet_v2": (mobilenet_v2, 224, 3, 1000),
    "resnet18_cifar": (resnet18_cifar, 32, 3, 10),
    "fmnist_cnn": (fmnist_cnn, 28, 1, 10),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--mode", default="eager", choices=["eager", "compile", "compile-max"])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--amp", type=int, default=1)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    make, res, chans, classes = MODELS[args.model]
    dev = torch.device("cuda")
    model = make().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.amp))
    x = torch.randn(args.batch, chans, res, res, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (args.batch,), device=dev)
    crit = nn.CrossEntropyLoss()

    # torch.compile wraps the model (forward and backward); the optimizer and the scaler stay eager, the usual
    # recipe (compiling the whole step with reduce-overhead trips over CUDA-graph output reuse in SGD's foreach).
    net = model
    if args.mode != "eager":
        net = torch.compile(model, mode="reduce-overhead" if args.mode == "compile" else "max-autotune")

    def step(xb, yb):
        if args.mode != "eager":
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.amp)):
            loss = crit(net(xb), yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss
    t_compile = time.perf_counter()
    for _ in range(args.warmup):
        step(x, y)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t_compile
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(x, y)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"framework": "pytorch", "torch": torch.__version__, "model": args.model, "mode": args.mode,
                      "batch": args.batch, "resolution": res, "amp": bool(args.amp), "steps": args.steps,
                      "images_per_s": args.batch * args.steps / dt, "ms_per_step": 1e3 * dt / args.steps,
                      "warmup_s": warm_s, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                      # Under torch.compile's CUDA graphs (reduce-overhead) the activations live in the graphs'
                      # private pools, which max_memory_allocated does not count after the recording: reserved does.
                      "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                      "device": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
