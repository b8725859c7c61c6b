#!/usr/bin/env python3
"""PyTorch on the same CPU cores, same network and recipe as the default `renaissance train`.

Trains fmnist_cnn (cbr32-pool-cbr64-pool-cbr64-flatten-fc10), or with --model resnet18_fmnist_narrow the
quarter-width ResNet-18 of models/resnet18_fmnist_narrow.yaml (scripts/renaissance_models.py), on the Renaissance
Fashion-MNIST file
(read with h5py), batch 128, SGD Nesterov + OneCycleLR (max lr 0.1), label smoothing 0.1, weight decay
5e-4 on conv/fc weights only, random horizontal flips, and reports training images/s per epoch and the
test accuracy, in the same JSONL keys `renaissance train --metrics` writes.

    /usr/bin/python3 scripts/bench/pytorch_cpu_fmnist.py --data data/fashion-mnist.h5 --epochs 1 --threads 2
    /usr/bin/python3 scripts/bench/pytorch_cpu_fmnist.py --model resnet18_fmnist_narrow --channels-last --epochs 1
"""
import argparse
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
    ap.add_argument("--model", default="fmnist_cnn", choices=["fmnist_cnn", "resnet18_fmnist_narrow"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--channels-last", action="store_true", help="NHWC memory format for the model and the inputs")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with h5py.File(args.data, "r") as f:
        mean = np.array(f.attrs["mean"], dtype=np.float32)
        std = np.array(f.attrs["std"], dtype=np.float32)
    xtr, ytr = load(args.data, "train", mean, std)
    xva, yva = load(args.data, "val", mean, std)
    if args.model == "fmnist_cnn":
        model = fmnist_cnn()
    else:  # torchvision's resnet18 with the 3x3 stride-1 stem, no max-pool, 16-32-64-128 channels, 1 input channel
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import renaissance_models as rm
        model = rm.ResNet(rm.BasicBlock, [2, 2, 2, 2], num_classes=10, in_channels=1, width=16, small_stem=True)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    xtr, xva = xtr.contiguous(memory_format=fmt), xva.contiguous(memory_format=fmt)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=args.lr, momentum=0.9, nesterov=True)
    steps_per_epoch = (len(xtr) + args.batch - 1) // args.batch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps_per_epoch * args.epochs,
                                                pct_start=0.25)
    for epoch in range(1, args.epochs + 1):
        model.train()
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        order = torch.randperm(len(xtr), generator=g)
        t0 = time.perf_counter()
        loss_sum = correct = 0.0
        for b in range(steps_per_epoch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            x, y = xtr[idx], ytr[idx]
            flip = torch.rand(len(idx), generator=g) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x).contiguous(memory_format=fmt)
            out = model(x)
            loss = F.cross_entropy(out, y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += float(F.cross_entropy(out.detach(), y, reduction="sum"))
            correct += float((out.argmax(1) == y).sum())
        train_s = time.perf_counter() - t0
        model.eval()
        vloss = vcorrect = float("nan")
        if not args.no_validate:
          with torch.no_grad():
            vloss = vcorrect = 0.0
            for b in range(0, len(xva), 512):
                out = model(xva[b:b + 512].contiguous(memory_format=fmt))
                vloss += float(F.cross_entropy(out, yva[b:b + 512], reduction="sum"))
                vcorrect += float((out.argmax(1) == yva[b:b + 512]).sum())
        print(json.dumps({"framework": "pytorch", "model": args.model, "torch": torch.__version__, "threads": args.threads,
                          "channels_last": args.channels_last, "epoch": epoch,
                          "train_loss": loss_sum / len(xtr), "train_top1": correct / len(xtr),
                          "val_loss": vloss / len(xva), "val_top1": vcorrect / len(xva),
                          "images_per_s": len(xtr) / train_s, "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main()
