#!/usr/bin/env python3
"""JPEG test cases for test_gpu_jpeg (the GPU machine has Pillow but no libturbojpeg for the project's CPU decoder).

  make_jpeg_cases.py OUTDIR
  make_jpeg_cases.py --tinted OUTDIR CLASSES TRAIN VAL

The first writes OUTDIR/<name>.jpg, OUTDIR/<name>.raw (Pillow's decode: Image.open(f).convert("RGB" or "L"), HWC uint8) and
OUTDIR/manifest.txt, one line per case: name height width channels kind (kind: ok, progressive, cmyk, corrupt).
The pictures are photograph-like: smooth gradients, blurred noise and a few hard edges, deterministic (seeded).
The second writes a learnable set for a training test: TRAIN + VAL pictures of 40..64 pixels a side, each tinted by
its class (label = index % CLASSES), as OUTDIR/<split>_<i>.jpg and .raw, listed in OUTDIR/tinted.txt
(split index height width label).
"""
import io
import os
import random
import sys

from PIL import Image, ImageDraw, ImageFilter


def picture(w, h, seed):
    rnd = random.Random(seed)
    img = Image.new("RGB", (w, h))
    px = img.load()
    a, b, c = rnd.random(), rnd.random(), rnd.random()
    for y in range(h):
        for x in range(w):
            px[x, y] = (int(255 * x / max(1, w - 1) * a + 40 * b) % 256, int(255 * y / max(1, h - 1)) % 256,
                        int(128 + 100 * c * ((x + y) % 64) / 64) % 256)
    noise = Image.frombytes("RGB", (w, h), bytes(rnd.getrandbits(8) for _ in range(w * h * 3)))
    noise = noise.filter(ImageFilter.GaussianBlur(2))
    img = Image.blend(img, noise, 0.35)
    d = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = rnd.randrange(w), rnd.randrange(h)
        d.rectangle([x0, y0, x0 + w // 5, y0 + h // 6],
                    fill=(rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
    return img


TINTS = [(255, 40, 40), (40, 255, 40), (40, 40, 255), (240, 240, 40), (240, 40, 240), (40, 240, 240)]


def tinted(out, classes, n_train, n_val):
    os.makedirs(out, exist_ok=True)
    rnd = random.Random(11)
    lines = []
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            label = i % classes
            w, h = rnd.randrange(40, 65), rnd.randrange(40, 65)
            img = Image.blend(picture(w, h, rnd.getrandbits(30)), Image.new("RGB", (w, h), TINTS[label % len(TINTS)]),
                              0.45)
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=90)
            with open(os.path.join(out, f"{split}_{i}.jpg"), "wb") as f:
                f.write(buf.getvalue())
            with open(os.path.join(out, f"{split}_{i}.raw"), "wb") as f:
                f.write(Image.open(io.BytesIO(buf.getvalue())).convert("RGB").tobytes())
            lines.append(f"{split} {i} {h} {w} {label}")
    with open(os.path.join(out, "tinted.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    if sys.argv[1] == "--tinted":
        tinted(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cases = []

    def save(name, img, kind, mode, **kw):
        buf = io.BytesIO()
        img.save(buf, "JPEG", **kw)
        data = buf.getvalue()
        if kind == "corrupt":  # the header intact, the entropy-coded data garbage and cut short
            data = data[: len(data) // 3] + bytes(random.Random(7).getrandbits(8) for _ in range(200))
        with open(os.path.join(out, name + ".jpg"), "wb") as f:
            f.write(data)
        ref = Image.open(io.BytesIO(buf.getvalue())).convert(mode)
        with open(os.path.join(out, name + ".raw"), "wb") as f:
            f.write(ref.tobytes())
        cases.append(f"{name} {ref.height} {ref.width} {1 if mode == 'L' else 3} {kind}")

    save("rgb420_q90", picture(500, 375, 1), "ok", "RGB", quality=90)
    save("rgb444_q95_odd", picture(157, 201, 2), "ok", "RGB", quality=95, subsampling=0)
    save("rgb422_q85", picture(320, 240, 3), "ok", "RGB", quality=85, subsampling=1)
    save("rgb420_small_odd", picture(45, 33, 4), "ok", "RGB", quality=90)
    save("grey_q90", picture(300, 200, 5).convert("L"), "ok", "L", quality=90)
    save("rgb420_progressive", picture(256, 192, 6), "progressive", "RGB", quality=90, progressive=True)
    save("cmyk_q90", picture(120, 90, 7).convert("CMYK"), "cmyk", "RGB", quality=90)
    save("rgb420_corrupt", picture(200, 150, 8), "corrupt", "RGB", quality=90)
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write("\n".join(cases) + "\n")


if __name__ == "__main__":
    main()
