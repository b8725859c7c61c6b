#!/usr/bin/env python3
"""Checks the library's image decoding, resampling and augmentation against independent references.

    check_image.py IMAGE_TOOL WORKDIR

IMAGE_TOOL is tests/io/image_tool (the library's functions behind a jobs file). References:
  - decoding: Pillow's Image.open(f).convert("L" / "RGB"), byte for byte, on JPEGs (baseline, progressive, 4:2:0,
    4:4:4, grey, CMYK) and PNGs (RGB, RGBA, L, LA, palette with and without transparency, 1-bit, 16-bit RGB)
    written by Pillow;
  - resampling: Pillow's img.crop(box).resize(size, Image.BILINEAR), byte for byte, over random boxes and sizes
    (reductions, enlargements, one axis only);
  - the validation transform: torchvision's Resize(S) + CenterCrop(C) written out with Pillow (the torchvision
    formulas, torchvision itself is not needed);
  - augmentation geometry: a Python implementation of Philox4x32-10 and of the documented random-resized-crop /
    pad-crop / flip draws (io/augment.h), value for value;
  - rendering: Pillow crop + resize, then the documented shift and mirror in numpy, byte for byte;
  - statistics of the random-resized crop: area fraction and log aspect ratio against their distributions.
Exit 0: all match; 1: a mismatch (printed); 77: numpy or Pillow missing (CTest's SKIP_RETURN_CODE).
"""
import math
import os
import subprocess
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: {e} (install python3-numpy / python3-pil)", file=sys.stderr)
    sys.exit(77)

TOOL, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("MISMATCH:", msg)


def run_jobs(lines):
    path = os.path.join(WORK, "jobs.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = subprocess.run([TOOL, path], check=True, capture_output=True, text=True).stdout
    return out.splitlines()


def test_image(rng, h, w, c):
    """Noise on a smooth field: edges and texture, like photographs."""
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(127 + 100 * np.sin(xx / (5 + 3 * k) + yy / (7 + k))) for k in range(c)], axis=-1)
    img = base + rng.normal(0, 30, size=(h, w, c))
    return np.clip(img, 0, 255).astype(np.uint8)


def pil(a):
    return Image.fromarray(a[:, :, 0] if a.shape[2] == 1 else a)


def arr(im):
    a = np.asarray(im)
    return a[:, :, None] if a.ndim == 2 else a


# ---- decoding -------------------------------------------------------------------------------------------------------

def check_decoding(rng):
    files = []
    rgb = test_image(rng, 61, 83, 3)
    grey = test_image(rng, 47, 39, 1)[:, :, 0]
    rgba = np.concatenate([rgb, rng.integers(0, 256, size=rgb.shape[:2] + (1,), dtype=np.uint8)], axis=2)

    def save(name, im, **kw):
        p = os.path.join(WORK, name)
        im.save(p, **kw)
        files.append(p)

    save("q75.jpg", Image.fromarray(rgb), quality=75)
    save("q95_444.jpg", Image.fromarray(rgb), quality=95, subsampling=0)
    save("progressive.jpg", Image.fromarray(rgb), quality=85, progressive=True)
    save("grey.jpg", Image.fromarray(grey), quality=90)
    save("cmyk.jpg", Image.fromarray(rgb).convert("CMYK"), quality=90)
    save("rgb.png", Image.fromarray(rgb))
    save("rgba.png", Image.fromarray(rgba, "RGBA"))
    save("grey.png", Image.fromarray(grey))
    save("la.png", Image.fromarray(np.stack([grey, grey[::-1]], axis=2), "LA"))
    save("palette.png", Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=50))
    pt = Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=20)
    pt.info["transparency"] = 3
    save("palette_trns.png", pt, transparency=3)
    save("bits1.png", Image.fromarray(grey > 128))
    # 16-bit RGB: Pillow reads it as RGB keeping the high byte; written by hand (Pillow writes no 16-bit RGB).
    rgb16 = (rgb.astype(np.uint16) * 257 + rng.integers(0, 200, size=rgb.shape)).astype(">u2")
    files.append(write_png16(os.path.join(WORK, "rgb16.png"), rgb16))
    jobs, expect = [], []
    for f in files:
        for c in (1, 3):
            out = f"{f}.{c}.npy"
            jobs.append(f"decode {f} {c} {out}")
            im = Image.open(f)
            ref = arr(im.convert("L" if c == 1 else "RGB"))
            expect.append((f, c, out, ref))
    for line, (f, c, out, ref) in zip(run_jobs(jobs), expect):
        if line != "ok":
            fail(f"decode {os.path.basename(f)} to {c}: {line}")
            continue
        got = np.load(out)
        if got.shape != ref.shape or not np.array_equal(got, ref):
            diff = int(np.abs(got.astype(int) - ref.astype(int)).max()) if got.shape == ref.shape else "shape"
            fail(f"decode {os.path.basename(f)} to {c} channels: {got.shape} vs Pillow {ref.shape}, max diff {diff}")
    print(f"decoding: {len(expect)} cases against Pillow")
    check_regions(rng, [f for f in files if f.endswith(".jpg")])


def check_regions(rng, jpegs):
    """decode_image_region (partial JPEG decoding: the loader's random-resized crops) against Pillow's whole decode
    cropped, byte for byte, over random boxes and the edge cases (one pixel, a row, a column, the corners, all)."""
    big = test_image(rng, 203, 301, 3)
    for name, kw in (("big_420.jpg", {"quality": 90}), ("big_422.jpg", {"quality": 90, "subsampling": 1}),
                     ("big_444.jpg", {"quality": 90, "subsampling": 0}),
                     ("big_progressive.jpg", {"quality": 90, "progressive": True}),
                     ("big_restart.jpg", {"quality": 90, "restart_marker_rows": 1})):
        p = os.path.join(WORK, name)
        try:
            Image.fromarray(big).save(p, **kw)
        except (TypeError, ValueError, OSError):  # an older Pillow without restart markers
            continue
        jpegs.append(p)
    jobs, expect = [], []
    partial = False
    for f in jpegs:
        im = Image.open(f)
        W, H = im.size
        boxes = [(0, 0, H, W), (0, 0, 1, 1), (H - 1, W - 1, 1, 1), (H // 2, 0, 1, W), (0, W // 2, H, 1),
                 (H - 2, 0, 2, W), (0, W - 3, H, 3)]
        for _ in range(24):
            h = int(rng.integers(1, H + 1))
            w = int(rng.integers(1, W + 1))
            boxes.append((int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), h, w))
        for c in (1, 3):
            ref_full = arr(im.convert("L" if c == 1 else "RGB"))
            for k, (y0, x0, h, w) in enumerate(boxes):
                out = f"{f}.r{c}_{k}.npy"
                jobs.append(f"region {f} {c} {y0} {x0} {h} {w} {out}")
                expect.append((f, c, (y0, x0, h, w), out, ref_full))
    for line, (f, c, box, out, ref_full) in zip(run_jobs(jobs), expect):
        what = f"region {os.path.basename(f)} to {c} channels, box (y0, x0, h, w) = {box}"
        parts = line.split()
        if len(parts) != 4 or parts[0] != "ok":
            fail(f"{what}: {line}")
            continue
        row0, col0, partial = int(parts[1]), int(parts[2]), partial or parts[3] == "1"
        got = np.load(out)
        y0, x0, h, w = box
        if not (row0 <= y0 and col0 <= x0 and row0 + got.shape[0] >= y0 + h and col0 + got.shape[1] >= x0 + w):
            fail(f"{what}: the region at ({row0}, {col0}) of {got.shape[:2]} does not cover the box")
            continue
        ref = ref_full[row0:row0 + got.shape[0], col0:col0 + got.shape[1]]
        if got.shape != ref.shape or not np.array_equal(got, ref):
            diff = int(np.abs(got.astype(int) - ref.astype(int)).max()) if got.shape == ref.shape else "shape"
            fail(f"{what}: {got.shape} vs Pillow's {ref.shape}, max diff {diff}")
    print(f"regions: {len(expect)} boxes of {len(jpegs)} JPEGs against Pillow's whole decode"
          f"{'' if partial else ' (this build decodes them whole)'}")
    # The whole file is still read: a file cut in its last third fails for a box in its first rows too.
    src = os.path.join(WORK, "big_420.jpg")
    cut = os.path.join(WORK, "big_420_cut.jpg")
    data = open(src, "rb").read()
    open(cut, "wb").write(data[: len(data) * 2 // 3])
    line = run_jobs([f"region {cut} 3 0 0 8 8 {cut}.npy"])[0]
    if not (line.startswith("error:") and "truncated" in line):
        fail(f"region of a truncated JPEG's first rows: {line} (expected an error naming the truncation)")


def check_warned_jpegs():
    """libjpeg warnings (stray bytes before a marker) leave the image complete: decoded as Pillow decodes it. A fatal
    error after such a warning is an error (TurboJPEG reported it as a warning: the image was stored black)."""
    data = open(os.path.join(WORK, "progressive.jpg"), "rb").read()
    sos = [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xDA]
    if len(sos) < 3:
        fail(f"progressive.jpg has {len(sos)} scans, the test needs 3")
        return
    warned = data[: sos[1]] + b"\x00\x11" + data[sos[1]:]  # 2 extraneous bytes before the second scan
    broken = bytearray(warned)
    broken[sos[2] + 2 + 5] = 99  # the third scan's first component id: no such component
    paths = {}
    for name, b in (("warned.jpg", warned), ("warned_then_broken.jpg", bytes(broken))):
        paths[name] = os.path.join(WORK, name)
        open(paths[name], "wb").write(b)
    ref = arr(Image.open(paths["warned.jpg"]).convert("RGB"))
    try:
        Image.open(paths["warned_then_broken.jpg"]).convert("RGB")
        fail("Pillow decodes warned_then_broken.jpg: the test's broken file is not broken")
    except OSError:
        pass
    out = paths["warned.jpg"] + ".npy"
    lines = run_jobs([f"decode {paths['warned.jpg']} 3 {out}", f"decode {paths['warned_then_broken.jpg']} 3 {out}.x"])
    if lines[0] != "ok" or not np.array_equal(np.load(out), ref):
        fail(f"decode of a JPEG with a warning: {lines[0]} (expected Pillow's pixels)")
    if not (lines[1].startswith("error:") and "Invalid component ID" in lines[1]):
        fail(f"decode of a JPEG with a fatal error after a warning: {lines[1]} (expected an error)")
    print("warnings: a warned JPEG decodes as Pillow's, a fatal error after a warning is an error")


def write_png16(path, a):
    import struct
    import zlib
    h, w, _ = a.shape
    raw = b"".join(b"\x00" + a[y].tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(data)
    return path


# ---- resampling ------------------------------------------------------------------------------------------------------

def check_resize(rng):
    jobs, expect = [], []
    for k in range(120):
        c = (1, 3)[k % 2]
        h, w = int(rng.integers(1, 90)), int(rng.integers(1, 90))
        img = test_image(rng, h, w, c)
        src = os.path.join(WORK, f"r{k}.npy")
        np.save(src, img)
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        y0, x0 = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        mode = k % 4
        oh = bh if mode == 1 else int(rng.integers(1, 120))
        ow = bw if mode == 2 else int(rng.integers(1, 120))
        out = os.path.join(WORK, f"r{k}.out.npy")
        jobs.append(f"resize {src} {y0} {x0} {bh} {bw} {oh} {ow} {out}")
        ref = arr(pil(img).crop((x0, y0, x0 + bw, y0 + bh)).resize((ow, oh), Image.BILINEAR))
        expect.append((f"{w}x{h} box {bw}x{bh}@({x0},{y0}) -> {ow}x{oh} c{c}", out, ref))
    # The ImageNet-sized case: 500x375 crops to 224 (reduction ~2x) and small crops enlarged.
    big = test_image(rng, 375, 500, 3)
    np.save(os.path.join(WORK, "big.npy"), big)
    for k, (y0, x0, bh, bw, o) in enumerate([(0, 0, 375, 500, 224), (10, 40, 300, 280, 224), (100, 200, 50, 70, 224),
                                              (0, 0, 375, 500, 128)]):
        out = os.path.join(WORK, f"big{k}.out.npy")
        jobs.append(f"resize {WORK}/big.npy {y0} {x0} {bh} {bw} {o} {o} {out}")
        expect.append((f"500x375 box {bw}x{bh} -> {o}", out,
                       arr(pil(big).crop((x0, y0, x0 + bw, y0 + bh)).resize((o, o), Image.BILINEAR))))
    for line, (what, out, ref) in zip(run_jobs(jobs), expect):
        got = np.load(out) if line == "ok" else None
        if got is None or not np.array_equal(got, ref):
            fail(f"resize {what}: {line if got is None else 'max diff %d' % np.abs(got.astype(int) - ref).max()}")
    print(f"resampling: {len(expect)} crops and resizes against Pillow")


def torchvision_center(img, short, ch, cw):
    """torchvision.transforms.Resize(short) then CenterCrop((ch, cw)) on a PIL image, written out."""
    h, w = img.shape[:2]
    s, l = (w, h) if w <= h else (h, w)
    new_long = int(short * l / s)
    nw, nh = (short, new_long) if w <= h else (new_long, short)
    im = pil(img)
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), Image.BILINEAR)
    a = arr(im)
    # CenterCrop pads with zeros when the crop is larger, then crops at int(round((size - crop) / 2)).
    if ch > nh or cw > nw:
        pt, pl = (ch - nh) // 2 if ch > nh else 0, (cw - nw) // 2 if cw > nw else 0
        pb, pr = (ch - nh + 1) // 2 if ch > nh else 0, (cw - nw + 1) // 2 if cw > nw else 0
        a = np.pad(a, ((pt, pb), (pl, pr), (0, 0)))
        nh, nw = a.shape[:2]
    top, left = int(round((nh - ch) / 2.0)), int(round((nw - cw) / 2.0))
    return a[top:top + ch, left:left + cw]


def check_center(rng):
    jobs, expect = [], []
    cases = [(375, 500, 256, 224, 224), (500, 375, 256, 224, 224), (32, 32, 32, 28, 28), (257, 300, 256, 224, 224),
             (100, 60, 73, 64, 64), (28, 28, 32, 28, 28)]
    for k in range(20):
        cases.append((int(rng.integers(5, 200)), int(rng.integers(5, 200)), int(rng.integers(4, 150)),
                      int(rng.integers(4, 120)), int(rng.integers(4, 120))))
    for k, (h, w, short, ch, cw) in enumerate(cases):
        img = test_image(rng, h, w, 3)
        src, out = os.path.join(WORK, f"c{k}.npy"), os.path.join(WORK, f"c{k}.out.npy")
        np.save(src, img)
        jobs.append(f"center {src} {short} {ch} {cw} {out}")
        expect.append((f"{w}x{h} short {short} crop {cw}x{ch}", out, torchvision_center(img, short, ch, cw)))
    for line, (what, out, ref) in zip(run_jobs(jobs), expect):
        got = np.load(out) if line == "ok" else None
        if got is None or got.shape != ref.shape or not np.array_equal(got, ref):
            fail(f"center {what}: {line}")
    print(f"validation resize + centre crop: {len(expect)} cases against torchvision's formulas with Pillow")


# ---- geometry: Philox and the documented draws -------------------------------------------------------------------------

M32 = 0xffffffff


def philox(key, ctr):
    k0, k1 = key & M32, (key >> 32) & M32
    c = list(ctr)
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c


def unit(x):
    return float(np.float32((x >> 8) * (1.0 / 16777216.0)))


def geometry(crop, sh, sw, oh, ow, smin, smax, rmin, rmax, pad, flip, seed, epoch, sample):
    """io/augment.h's sample_geometry, written from its comment."""
    ctr = lambda purpose: [sample & M32, (sample >> 32) & M32, epoch & M32, purpose]
    g = dict(box_y=0, box_x=0, box_h=sh, box_w=sw, virt_h=oh, virt_w=ow, top=0, left=0, sy=0, sx=0, flip=0)
    if crop == "random-resized":
        area = float(sh) * float(sw)
        lmin, lmax = math.log(rmin), math.log(rmax)
        for a in range(10):
            r = philox(seed, ctr(0x52524300 + a))
            target = area * (smin + (smax - smin) * unit(r[0]))
            aspect = math.exp(lmin + (lmax - lmin) * unit(r[1]))
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= sw and 0 < h <= sh:
                g.update(box_y=(r[2] * (sh - h + 1)) >> 32, box_x=(r[3] * (sw - w + 1)) >> 32, box_h=h, box_w=w)
                break
        else:
            ratio = sw / sh
            w, h = sw, sh
            if ratio < rmin:
                h = round(w / rmin)
            elif ratio > rmax:
                w = round(h * rmax)
            g.update(box_y=(sh - h) // 2, box_x=(sw - w) // 2, box_h=h, box_w=w)
    if pad or flip:
        r = philox(seed, ctr(0x41554721))
        if pad:
            g.update(sy=r[0] % (2 * pad + 1) - pad, sx=r[1] % (2 * pad + 1) - pad)
        g["flip"] = int(bool(flip) and bool(r[2] & 1))
    return [g[k] for k in ("box_y", "box_x", "box_h", "box_w", "virt_h", "virt_w", "top", "left", "sy", "sx", "flip")]


def check_geometry():
    cases = [("random-resized", 375, 500, 224, 224, 0.08, 1.0, 3 / 4, 4 / 3, 0, 1, 7, 3),
             ("random-resized", 28, 28, 28, 28, 0.35, 1.0, 3 / 4, 4 / 3, 2, 1, 0, 0),
             ("random-resized", 10, 100, 8, 8, 0.08, 1.0, 3 / 4, 4 / 3, 0, 0, 5, 1),
             ("random-resized", 100, 10, 8, 8, 0.9, 1.0, 3 / 4, 4 / 3, 0, 0, 5, 1),
             ("random-resized", 50, 60, 16, 16, 1.5, 2.0, 3 / 4, 4 / 3, 0, 0, 1, 2),  # always the fallback
             ("none", 32, 32, 32, 32, 0.08, 1.0, 3 / 4, 4 / 3, 4, 1, 123456789012, 9)]
    n = 0
    for crop, sh, sw, oh, ow, smin, smax, rmin, rmax, pad, flip, seed, epoch in cases:
        first, count = (1 << 33) - 200, 400  # samples past 2^32: both counter words
        lines = run_jobs([f"geometry {crop} {sh} {sw} {oh} {ow} {smin!r} {smax!r} {rmin!r} {rmax!r} {pad} {flip} "
                          f"{seed} {epoch} {first} {count}"])
        for i, line in enumerate(lines):
            got = [int(v) for v in line.split()]
            want = geometry(crop, sh, sw, oh, ow, smin, smax, rmin, rmax, pad, flip, seed, epoch, first + i)
            n += 1
            if got != want:
                fail(f"geometry {crop} {sw}x{sh} sample {first + i}: {got} vs {want}")
                break
    print(f"geometry: {n} samples against a Python Philox and the documented draws")


def check_statistics():
    """Random-resized crops of a 400x400 image: the accepted area fraction and log aspect ratio are uniform
    (truncated where the box does not fit); their means match a Monte-Carlo of the same rule."""
    count = 20000
    lines = run_jobs([f"geometry random-resized 400 400 224 224 0.08 1.0 0.75 {4 / 3!r} 0 0 11 0 0 {count}"])
    g = np.array([[int(v) for v in line.split()] for line in lines])
    area = g[:, 2] * g[:, 3] / 160000.0
    logr = np.log(g[:, 3] / g[:, 2])
    rng = np.random.default_rng(0)
    s = rng.uniform(0.08, 1.0, 400000)
    r = np.exp(rng.uniform(math.log(0.75), math.log(4 / 3), 400000))
    w, h = np.round(np.sqrt(160000 * s * r)), np.round(np.sqrt(160000 * s / r))
    ok = (w <= 400) & (h <= 400)
    ref_area, ref_logr = (w * h / 160000.0)[ok], np.log(w / h)[ok]
    for name, a, b in (("area", area, ref_area), ("log ratio", logr, ref_logr)):
        se = b.std() / math.sqrt(count)
        if abs(a.mean() - b.mean()) > 5 * se:
            fail(f"random-resized {name}: mean {a.mean():.4f}, expected {b.mean():.4f} (5 sigma {5 * se:.4f})")
    if not ((g[:, 0] + g[:, 2] <= 400).all() and (g[:, 1] + g[:, 3] <= 400).all() and (g[:, :2] >= 0).all()):
        fail("random-resized: a box outside the image")
    # Crop positions are uniform: over boxes of at most half the image, the mean of the centre is the centre.
    cy = (g[:, 0] + g[:, 2] / 2.0) / 400.0
    if abs(cy.mean() - 0.5) > 0.01:
        fail(f"random-resized: mean box centre {cy.mean():.4f}, expected 0.5")
    print(f"statistics: {count} random-resized crops (area {area.mean():.4f} vs {ref_area.mean():.4f})")


def check_render(rng):
    jobs, expect = [], []
    specs = [("random-resized", 224, 224, 0, 1, 160, 213), ("random-resized", 28, 28, 2, 1, 28, 28),
             ("none", 32, 32, 4, 1, 32, 32), ("center", 64, 64, 0, 0, 90, 120), ("center", 28, 28, 3, 1, 28, 28),
             ("none", 20, 30, 0, 1, 40, 25)]
    for k, (crop, oh, ow, pad, flip, sh, sw) in enumerate(specs):
        for c in (1, 3):
            img = test_image(rng, sh, sw, c)
            src = os.path.join(WORK, f"g{k}{c}.npy")
            np.save(src, img)
            for sample in (0, 1, 2, 77, 1000):
                out = os.path.join(WORK, f"g{k}{c}_{sample}.out.npy")
                jobs.append(f"render {src} {crop} {oh} {ow} {pad} {flip} 42 3 {sample} {out}")
                expect.append((f"{crop} {sw}x{sh}->{ow}x{oh} pad {pad} flip {flip} c{c} sample {sample}", img, oh, ow,
                               out))
    for line, (what, img, oh, ow, out) in zip(run_jobs(jobs), expect):
        by, bx, bh, bw, vh, vw, top, left, sy, sx, fl = (int(v) for v in line.split())
        im = pil(img).crop((bx, by, bx + bw, by + bh))
        if (vw, vh) != im.size:
            im = im.resize((vw, vh), Image.BILINEAR)
        v = arr(im)
        win = np.zeros((oh, ow, img.shape[2]), np.uint8)
        for y in range(oh):
            for x in range(ow):
                yy, xx = y + top, x + left
                if 0 <= yy < vh and 0 <= xx < vw:
                    win[y, x] = v[yy, xx]
        ref = np.zeros_like(win)
        for y in range(oh):
            for x in range(ow):
                ys, xs = y + sy, (ow - 1 - x if fl else x) + sx
                if 0 <= ys < oh and 0 <= xs < ow:
                    ref[y, x] = win[ys, xs]
        got = np.load(out)
        if not np.array_equal(got, ref):
            fail(f"render {what}: max diff {np.abs(got.astype(int) - ref).max()}")
    print(f"rendering: {len(expect)} samples against Pillow crop/resize + the documented shift and flip")


def main():
    rng = np.random.default_rng(12)
    check_decoding(rng)
    check_warned_jpegs()
    check_resize(rng)
    check_center(rng)
    check_geometry()
    check_statistics()
    check_render(rng)
    if FAILS:
        print(f"{len(FAILS)} mismatch(es)")
        return 1
    print("all match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
