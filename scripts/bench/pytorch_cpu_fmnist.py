#!/usr/bin/env python3
"""PyTorch on the same CPU cores, same network and recipe as the default `renaissance train`; with --device cuda the
GPU Fashion-MNIST recipe (recipes/fmnist-resnet18.yaml) on one GPU, for comparing training curves.

Trains fmnist_cnn (cbr32-pool-cbr64-pool-cbr64-flatten-fc10), or with --model resnet18_fmnist_narrow the
quarter-width ResNet-18 of models/resnet18_fmnist_narrow.yaml (scripts/renaissance_models.py), on the Renaissance
Fashion-MNIST file
(read with h5py), batch 128, SGD Nesterov + OneCycleLR (max lr 0.1), label smoothing 0.1, weight decay
5e-4 on conv/fc weights only, random horizontal flips, and reports training images/s per epoch and the
test accuracy, in the same JSONL keys `renaissance train --metrics` writes.

    /usr/bin/python3 scripts/bench/pytorch_cpu_fmnist.py --data data/fashion-mnist.h5 --epochs 1 --threads 2
    /usr/bin/python3 scripts/bench/pytorch_cpu_fmnist.py --model resnet18_fmnist_narrow --channels-last --epochs 1
    python3 scripts/bench/pytorch_cpu_fmnist.py --recipe-gpu --seed 3 --loss-log torch-3.jsonl   # the GPU recipe

--recipe-gpu sets what recipes/fmnist-resnet18.yaml sets: resnet18_fmnist (width 64), CUDA, AMP (autocast FP16 and
a GradScaler), channels-last, batch 512, 11 epochs, lr 0.4, label smoothing 0.2, pad-crop 2 (zero pixels, as
`--crop-padding`), flips, full batches only (`--drop-last`), validation after the last epoch only; OneCycleLR cycles
the momentum between 0.85 and 0.95 (PyTorch's default, `--onecycle-momentum 0.85,0.95` in Renaissance;
--no-cycle-momentum: 0.9 throughout). --loss-log writes each step's training loss in the keys of `renaissance train --loss-log` ({"step",
"epoch", "loss", "lr", "momentum"}; the loss is the batch's plain cross-entropy, label smoothing left out, as there).
"""
import argparse
import contextlib
import json
import os
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def cbr(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def fmnist_cnn():
    return nn.Sequential(*cbr(1, 32), nn.MaxPool2d(2), *cbr(32, 64), nn.MaxPool2d(2), *cbr(64, 64), nn.Flatten(),
                         nn.Linear(7 * 7 * 64, 10))


def load(path, split, mean, std):
    with h5py.File(path, "r") as f:
        x = f[split]["images"][...].astype(np.float32) / 255.0  # N,H,W,C
        y = f[split]["labels"][...].astype(np.int64)
    x = (x - mean) / std
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/fashion-mnist.h5")
    ap.add_argument("--model", default="fmnist_cnn",
                    choices=["fmnist_cnn", "resnet18_fmnist_narrow", "resnet18_fmnist"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--channels-last", action="store_true", help="NHWC memory format for the model and the inputs")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--amp", action="store_true", help="autocast to FP16 with a GradScaler (CUDA)")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--crop-padding", type=int, default=0, help="random shifts of up to this many pixels, zero-filled")
    ap.add_argument("--drop-last", action="store_true", help="only full batches each epoch")
    ap.add_argument("--validate-last", action="store_true", help="validate only after the last epoch")
    ap.add_argument("--onecycle-div", type=float, default=25.0)
    ap.add_argument("--onecycle-pct", type=float, default=0.25)
    ap.add_argument("--loss-log", help="JSONL file of every step's training loss (a device sync each step)")
    ap.add_argument("--no-cycle-momentum", action="store_true", help="OneCycleLR's cycle_momentum=False")
    ap.add_argument("--recipe-gpu", action="store_true", help="the settings of recipes/fmnist-resnet18.yaml")
    args = ap.parse_args()
    if args.recipe_gpu:
        args.model, args.device, args.amp, args.channels_last = "resnet18_fmnist", "cuda", True, True
        args.batch, args.epochs, args.lr, args.label_smoothing = 512, 11, 0.4, 0.2
        args.crop_padding, args.drop_last, args.validate_last = 2, True, True
    dev = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with h5py.File(args.data, "r") as f:
        mean = np.array(f.attrs["mean"], dtype=np.float32)
        std = np.array(f.attrs["std"], dtype=np.float32)
    xtr, ytr = load(args.data, "train", mean, std)
    xva, yva = load(args.data, "val", mean, std)
    if args.model == "fmnist_cnn":
        model = fmnist_cnn()
    else:  # torchvision's resnet18 with the 3x3 stride-1 stem, no max-pool, 1 input channel; narrow: 16-32-64-128
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import renaissance_models as rm
        width = 16 if args.model == "resnet18_fmnist_narrow" else 64
        model = rm.ResNet(rm.BasicBlock, [2, 2, 2, 2], num_classes=10, in_channels=1, width=width, small_stem=True)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(dev, memory_format=fmt)
    xtr, ytr, xva, yva = xtr.to(dev), ytr.to(dev), xva.to(dev), yva.to(dev)
    xtr, xva = xtr.contiguous(memory_format=fmt), xva.contiguous(memory_format=fmt)
    # A zero pixel after normalisation: what --crop-padding shifts in.
    zero = torch.from_numpy(-mean / std).to(dev).view(1, -1, 1, 1)
    scaler = (torch.amp.GradScaler("cuda", enabled=args.amp) if hasattr(torch.amp, "GradScaler")  # torch >= 2.3
              else torch.cuda.amp.GradScaler(enabled=args.amp))
    log = open(args.loss_log, "w") if args.loss_log else None
    autocast = (lambda: torch.autocast(args.device, dtype=torch.float16)) if args.amp else contextlib.nullcontext
    step = 0
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=args.lr, momentum=0.9, nesterov=True)
    steps_per_epoch = len(xtr) // args.batch if args.drop_last else (len(xtr) + args.batch - 1) // args.batch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps_per_epoch * args.epochs,
                                                pct_start=args.onecycle_pct, div_factor=args.onecycle_div,
                                                cycle_momentum=not args.no_cycle_momentum)
    for epoch in range(1, args.epochs + 1):
        model.train()
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        order = torch.randperm(len(xtr), generator=g)
        t0 = time.perf_counter()
        loss_sum = correct = 0.0
        for b in range(steps_per_epoch):
            idx = order[b * args.batch:(b + 1) * args.batch].to(dev)
            x, y = xtr[idx], ytr[idx]
            flip = (torch.rand(len(idx), generator=g) < 0.5).to(dev)
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
            if args.crop_padding:
                p = args.crop_padding
                n, h, w = len(idx), x.shape[2], x.shape[3]
                shift = torch.randint(-p, p + 1, (n, 2), generator=g).to(dev)
                pad = zero.expand(n, -1, h + 2 * p, w + 2 * p).clone()
                pad[:, :, p:p + h, p:p + w] = x
                iy = torch.arange(h, device=dev) + p + shift[:, :1]  # [n, h]: the rows each sample keeps
                ix = torch.arange(w, device=dev) + p + shift[:, 1:]
                x = pad[torch.arange(n, device=dev)[:, None, None], :, iy[:, :, None], ix[:, None, :]]  # n, h, w, c
                x = x.permute(0, 3, 1, 2)
            x = x.contiguous(memory_format=fmt)
            with autocast():
                out = model(x)
                loss = F.cross_entropy(out.float(), y, label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            step += 1
            batch_ce = float(F.cross_entropy(out.detach().float(), y, reduction="sum"))  # no smoothing
            if log:
                log.write(json.dumps({"step": step, "epoch": epoch, "loss": batch_ce / len(idx),
                                      "lr": opt.param_groups[0]["lr"],
                                      "momentum": opt.param_groups[0]["momentum"]}) + "\n")
            sched.step()
            loss_sum += batch_ce
            correct += float((out.argmax(1) == y).sum())
        if args.device == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        trained = steps_per_epoch * args.batch if args.drop_last else len(xtr)
        model.eval()
        vloss = vcorrect = float("nan")
        if not args.no_validate and (epoch == args.epochs or not args.validate_last):
          with torch.no_grad():
            vloss = vcorrect = 0.0
            for b in range(0, len(xva), 512):
                with autocast():
                    out = model(xva[b:b + 512].contiguous(memory_format=fmt)).float()
                vloss += float(F.cross_entropy(out, yva[b:b + 512], reduction="sum"))
                vcorrect += float((out.argmax(1) == yva[b:b + 512]).sum())
        print(json.dumps({"framework": "pytorch", "model": args.model, "torch": torch.__version__, "threads": args.threads,
                          "channels_last": args.channels_last, "epoch": epoch,
                          "seed": args.seed, "device": args.device, "amp": args.amp,
                          "train_loss": loss_sum / trained, "train_top1": correct / trained,
                          "val_loss": vloss / len(xva), "val_top1": vcorrect / len(xva),
                          "images_per_s": trained / train_s, "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main()
