#!/usr/bin/env python3
"""`renaissance train --tensorboard DIR` read back by TensorBoard's own event reader.

    check_tensorboard.py CLI WORK_DIR [VENV_DIR]

Trains a small run with --tensorboard and --metrics, then, in a Python that has the `tensorboard` package (a
project-local venv, VENV_DIR, that this script creates and fills from PyPI with `pip install tensorboard` when it is
not there yet), reads the event file with tensorboard's EventAccumulator and checks: every record's length and
data CRC-32C against tensorboard's own masked_crc32c, the scalar tags, that each epoch scalar equals the metrics
JSONL's value at the same step (float32 rounding), the per-step losses against --loss-log, and the run/config text;
then a run killed after a checkpoint and resumed: each step once in TensorBoard and the loss log.
Exit 0 pass, 1 fail, 77 skip (tensorboard cannot be installed: no network, no venv/pip).
"""
import json
import os
import struct
import subprocess
import sys
import time


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def read_back(tb_dir, metrics_path, loss_path):
    from tensorboard.backend.event_processing import event_accumulator as ea_mod
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    files = [f for f in os.listdir(tb_dir) if "tfevents" in f]
    if len(files) != 1:
        fail(f"expected one event file in {tb_dir}, found {files}")
    raw = open(os.path.join(tb_dir, files[0]), "rb").read()
    pos, records = 0, 0
    while pos < len(raw):
        header = raw[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        data = raw[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", raw[pos + 12 + length:pos + 16 + length])
        if masked_crc32c(header) != len_crc or masked_crc32c(data) != data_crc:
            fail(f"record {records}: CRC mismatch")
        pos += 16 + length
        records += 1
    print(f"{records} records, every length and data CRC-32C matches tensorboard's masked_crc32c")

    acc = ea_mod.EventAccumulator(tb_dir, size_guidance={ea_mod.SCALARS: 0, ea_mod.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    want = {"train/loss", "train/top1", "val/loss", "val/top1", "val/top5", "opt/lr", "opt/loss_scale",
            "perf/images_per_s", "train/step_loss"}
    missing = want - set(tags["scalars"])
    if missing:
        fail(f"scalar tags missing: {sorted(missing)} (have {tags['scalars']})")
    for t in sorted(tags["scalars"]):
        print(t, [(e.step, round(e.value, 6)) for e in acc.Scalars(t)])
    metrics = [json.loads(line) for line in open(metrics_path) if line.strip()]
    keys = {"train/loss": "train_loss", "train/top1": "train_top1", "val/loss": "val_loss", "val/top1": "val_top1",
            "val/top5": "val_top5", "opt/lr": "lr", "opt/loss_scale": "loss_scale", "perf/images_per_s": "images_per_s"}
    for tag, key in keys.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        ref = [(m["step"], struct.unpack("f", struct.pack("f", m[key]))[0]) for m in metrics]
        if [s for s, _ in got] != [s for s, _ in ref]:
            fail(f"{tag}: steps {[s for s, _ in got]} != the metrics file's {[s for s, _ in ref]}")
        for (s, g), (_, r) in zip(got, ref):
            if abs(g - r) > 1e-6 * max(1.0, abs(r)):
                fail(f"{tag} at step {s}: {g} != {r} ({key} in {metrics_path})")
    losses = {d["step"]: d["loss"] for d in (json.loads(line) for line in open(loss_path) if line.strip())}
    steps = acc.Scalars("train/step_loss")
    if not steps:
        fail("no train/step_loss values")
    for e in steps:
        if e.step % 5 != 0 or abs(e.value - losses[e.step]) > 1e-6 * max(1.0, abs(losses[e.step])):
            fail(f"train/step_loss at step {e.step}: {e.value} (the loss log has {losses.get(e.step)})")
    texts = acc.Tensors("run/config")
    if len(texts) != 1:
        fail(f"run/config: {len(texts)} text events")
    text = texts[0].tensor_proto.string_val[0].decode()
    for needle in ("model `fmnist_cnn`", "epochs=2", "batch=32", "log-every=5"):
        if needle not in text:
            fail(f"run/config text lacks '{needle}':\n{text}")
    print("run/config:", text.splitlines()[0])
    print("PASS")


def read_resumed(tb_dir, loss_path, last="10"):
    """A run killed after its checkpoint of step 4 (it had logged steps 5-7), then resumed: the resumed run's event
    file starts with a SessionLog START at step 5, so TensorBoard keeps each step once, the resumed run's values.
    The same for a run killed before any checkpoint, then started again by --resume auto: START at step 0."""
    last = int(last)
    from tensorboard.backend.event_processing import event_accumulator as ea_mod

    files = sorted(f for f in os.listdir(tb_dir) if "tfevents" in f)
    if len(files) != 2:
        fail(f"expected two event files (the killed run's, the resumed run's) in {tb_dir}, found {files}")
    acc = ea_mod.EventAccumulator(tb_dir, size_guidance={ea_mod.SCALARS: 0, ea_mod.TENSORS: 0})
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("train/step_loss")]
    losses = [(d["step"], d["loss"]) for d in (json.loads(line) for line in open(loss_path) if line.strip())]
    if [s for s, _ in got] != list(range(1, last + 1)) or [s for s, _ in losses] != list(range(1, last + 1)):
        fail(f"after the resume: train/step_loss steps {[s for s, _ in got]}, the loss log's {[s for s, _ in losses]} "
             f"(each of 1-{last} once expected)")
    for (s, g), (_, r) in zip(got, losses):
        if abs(g - r) > 1e-6 * max(1.0, abs(r)):
            fail(f"after the resume: train/step_loss at step {s}: {g} != the loss log's {r}")
    print(f"resumed: steps 1-{last} once each in TensorBoard and the loss log, the same values")
    print("PASS")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--read":
        read_back(*sys.argv[2:5])
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "--read-resumed":
        read_resumed(*sys.argv[2:5])
        return
    cli, work = sys.argv[1], sys.argv[2]
    venv = sys.argv[3] if len(sys.argv) > 3 else os.path.join(work, "venv")
    os.makedirs(work, exist_ok=True)
    tb, metrics, loss_log, data = (os.path.join(work, n) for n in ("tb", "metrics.jsonl", "loss.jsonl", "data.h5"))
    subprocess.run(["rm", "-rf", tb, metrics, loss_log], check=True)
    subprocess.run([cli, "data", "synthetic", "--out", data, "--train", "300", "--val", "100", "--shape", "28,28,1",
                    "--classes", "10", "--seed", "2"], check=True, stdout=subprocess.DEVNULL)
    r = subprocess.run([cli, "train", "--device", "cpu", "--data", data, "--epochs", "2", "--batch", "32", "--lr", "0.01",
                        "--log-every", "5", "--tensorboard", tb, "--metrics", metrics, "--loss-log", loss_log],
                       capture_output=True, text=True)
    print(r.stdout)
    if r.returncode != 0:
        fail(f"train exited {r.returncode}: {r.stderr}")
    py = os.path.join(venv, "bin", "python")
    ok = os.path.exists(py) and subprocess.run([py, "-c", "import tensorboard"], capture_output=True).returncode == 0
    if not ok:
        print(f"installing tensorboard from PyPI into {venv}")
        steps = [[sys.executable, "-m", "venv", venv], [py, "-m", "pip", "install", "-q", "tensorboard"]]
        for cmd in steps:
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"SKIP: cannot install tensorboard ({' '.join(cmd)}: {p.stderr.strip()[-400:]})")
                sys.exit(77)
    rc = subprocess.run([py, os.path.abspath(__file__), "--read", tb, metrics, loss_log]).returncode
    if rc != 0:
        sys.exit(rc)
    # A run killed after its checkpoint of step 4 (here: it stopped at step 7 and loses its later checkpoint), then
    # resumed to step 10 from step 4.
    tb2, ck, loss2 = (os.path.join(work, n) for n in ("tb-resumed", "ck", "loss-resumed.jsonl"))
    subprocess.run(["rm", "-rf", tb2, ck, loss2], check=True)
    common = [cli, "train", "--device", "cpu", "--data", data, "--epochs", "2", "--batch", "32", "--lr", "0.01",
              "--schedule", "constant", "--log-every", "1", "--tensorboard", tb2, "--loss-log", loss2,
              "--checkpoint-dir", ck, "--checkpoint-every", "4", "--resume", "auto"]
    for max_steps in ("7", "10"):
        r = subprocess.run(common + ["--max-steps", max_steps], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"train --max-steps {max_steps} exited {r.returncode}: {r.stdout}{r.stderr}")
        if max_steps == "7":
            for name in ("ckpt-step00000007.h5", "latest.h5"):
                os.remove(os.path.join(ck, name))
            time.sleep(1.1)  # the event file names start with the second: the resumed run's sorts after
    rc = subprocess.run([py, os.path.abspath(__file__), "--read-resumed", tb2, loss2]).returncode
    if rc != 0:
        sys.exit(rc)
    # Killed before its first checkpoint (here: its checkpoints removed), then started again by --resume auto, which
    # finds none: the first attempt's points stayed beside the second's (no SessionLog START was written).
    subprocess.run(["rm", "-rf", tb2, ck, loss2], check=True)
    for max_steps in ("3", "5"):
        r = subprocess.run(common + ["--max-steps", max_steps], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"train --max-steps {max_steps} exited {r.returncode}: {r.stdout}{r.stderr}")
        if max_steps == "3":
            subprocess.run(["rm", "-rf", ck], check=True)
            time.sleep(1.1)
    sys.exit(subprocess.run([py, os.path.abspath(__file__), "--read-resumed", tb2, loss2, "5"]).returncode)


if __name__ == "__main__":
    main()
