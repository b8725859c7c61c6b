#!/usr/bin/env python3
"""PyTorch DistributedDataParallel on the GPUs of one host, timed like `renaissance bench`: synthetic data already on
each GPU, AMP (fp16 autocast + GradScaler), channels_last, SGD with momentum, `--warmup` untimed steps, then
`--steps` timed steps between two barriers. Rank 0 prints one JSON line with the total and per-GPU images/s.

    torchrun --standalone --nproc_per_node 2 scripts/bench/pytorch_ddp.py --model resnet50 --batch-per-gpu 256
    python3 scripts/bench/pytorch_ddp.py ...      (one process, no torchrun: world size 1, still wrapped in DDP)
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from pytorch_gpu import MODELS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    ap.add_argument("--batch-per-gpu", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    if "RANK" not in os.environ:  # a single process without torchrun
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.backends.cudnn.benchmark = True
    make, res, chans, classes = MODELS[args.model]
    dev = torch.device("cuda", local)
    model = make().to(dev).to(memory_format=torch.channels_last)
    net = nn.parallel.DistributedDataParallel(model, device_ids=[local], gradient_as_bucket_view=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    scaler = torch.amp.GradScaler("cuda")
    b = args.batch_per_gpu
    x = torch.randn(b, chans, res, res, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (b,), device=dev)
    crit = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        total = world * b * args.steps / dt
        print(json.dumps({"framework": "pytorch-ddp", "torch": torch.__version__, "model": args.model, "world": world,
                          "batch_per_gpu": b, "resolution": res, "steps": args.steps, "images_per_s": total,
                          "images_per_s_per_gpu": total / world, "ms_per_step": 1e3 * dt / args.steps,
                          "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                          "device": torch.cuda.get_device_name()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
