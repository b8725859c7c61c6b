#!/usr/bin/env python3
"""`renaissance data import folder|cifar10|cifar100` end to end, read back with independent readers.

    check_importers.py RENAISSANCE_CLI SOURCE_DIR WORKDIR

- folder round trips: a generated ImageFolder tree (scripts/make_image_folder.py) plus odd files (grey, CMYK and
  progressive JPEGs, RGBA/palette/grey PNGs, an upper-case .JPEG, a nested subfolder, a README) imported as a JPEG
  store (with and without --max-side) and as raw stores (RGB and grey), each checked by scripts/check_dataset.py
  --folder (h5py + Pillow + torchvision's ImageFolder listing and Resize/CenterCrop formulas); the same file for 1
  and 3 threads;
- CIFAR round trips: scripts/make_cifar_tarball.py tarballs (Python 2 opcodes as in the real files, and Python 3
  protocol 2, 4 and 5 pickles: numpy's _reconstruct, and _frombuffer in protocol 5) checked by check_dataset.py
  --cifar (pickle.load(..., encoding="bytes"));
- the scripts on bad input: check_dataset.py on files lacking a split, checksums, block_samples or num_classes, val
  images of another shape than train's, a text file, a --folder without train/, a --cifar that is no tarball, an
  --idx-dir missing or truncating a file, a JPEG store with --idx-dir (FAIL and exit 1, no traceback);
  make_cifar_tarball.py's argument checks and its --out replaced through a temporary;
- bad input: a corrupt JPEG, a truncated JPEG, a truncated PNG, a non-image file named .jpg, a dangling link and a
  FIFO named like images, an empty class folder,
  a val class that train lacks, a 20000x20000 PNG and JPEG (headers only), a missing train folder, a corrupt and a
  truncated tarball: exit status 1 (not a crash: < 128), one error line naming the file, no output file and no
  temporary left; --skip-bad turns unreadable images into a counted, listed skip. Also: a subfolder of a class that
  cannot be listed (its images were silently dropped), a class folder whose name is not UTF-8, --out inside a linked
  class folder, a tarball with two members of one name, label names that are not UTF-8, a batch claiming 2^54 rows;
- hostile archives: stored gzip streams whose CRC-32 mismatch or missing trailer only the end shows (tarballs, idx),
  pax headers that rename members (imported as tar reads them), a batch added again as a link, a pickle setting its
  labels twice, empty train splits, an unpacked Fashion-MNIST file as --out, idx images through a pipe, files named
  like a temporary of --out, an image named '.png'.
Exit 0 all pass, 1 a failure, 77 numpy/h5py/Pillow missing.
"""
import gzip
import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import zlib

try:
    import h5py
    import numpy as np
    from PIL import Image
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}", file=sys.stderr)
    sys.exit(77)

CLI, SRC, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
PY = sys.executable
FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL:", msg)


def run(args, **kw):
    # Paths are bytes: a Latin-1 folder name comes back in an error message as it is. A hang (an importer opening a
    # FIFO) ends the check with a TimeoutExpired traceback.
    kw.setdefault("timeout", 600)
    return subprocess.run(args, capture_output=True, text=True, errors="surrogateescape", **kw)


def script(name, *args):
    r = run([PY, os.path.join(SRC, "scripts", name), *args])
    if r.returncode != 0:
        fail(f"{name} {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r


def imp(*args):
    return run([CLI, "data", "import", *args])


def check_dataset(h5, *src):
    r = script("check_dataset.py", h5, *src)
    last = r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else ["(no output)"]
    print("  check_dataset:", last[0])


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def make_folder():
    root = os.path.join(WORK, "folder")
    shutil.rmtree(root, ignore_errors=True)
    script("make_image_folder.py", "imagenet-like", root, "--classes", "3", "--train-per-class", "6",
           "--val-per-class", "2", "--size", "120x90", "--workers", "1")
    rng = np.random.default_rng(3)
    rgb = np.clip(rng.normal(128, 50, size=(70, 90, 3)), 0, 255).astype(np.uint8)
    c = os.path.join(root, "train", "n00000001")
    Image.fromarray(rgb[:, :, 0]).save(os.path.join(c, "grey.jpg"), quality=90)
    Image.fromarray(rgb).convert("CMYK").save(os.path.join(c, "cmyk.jpg"), quality=90)
    Image.fromarray(rgb).save(os.path.join(c, "progressive.jpg"), quality=80, progressive=True)
    Image.fromarray(np.dstack([rgb, rgb[:, :, :1]]), "RGBA").save(os.path.join(c, "alpha.png"))
    Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=32).save(os.path.join(c, "palette.png"))
    Image.fromarray(rgb[:, :, 1]).save(os.path.join(c, "grey.png"))
    Image.fromarray(rgb).save(os.path.join(c, "UPPER.JPEG"), quality=85)
    os.makedirs(os.path.join(c, "nested"))
    Image.fromarray(rgb[::-1]).save(os.path.join(c, "nested", "deep.jpg"), quality=85)
    Image.fromarray(np.tile(rgb, (3, 3, 1))).save(os.path.join(c, "big.jpg"), quality=90)  # 270x210: > --max-side 160
    with open(os.path.join(c, "README.txt"), "w") as f:
        f.write("not an image\n")
    return root


def round_trips(root):
    print("folder round trips")
    files = {}
    for name, extra in (("jpeg", []), ("jpeg_max160", ["--max-side", "160", "--quality", "85"]),
                        ("raw64", ["--store", "raw", "--size", "64"]),
                        ("raw48_grey", ["--store", "raw", "--size", "48", "--channels", "1"]),
                        ("jpeg_grey", ["--channels", "1"])):
        out = os.path.join(WORK, f"{name}.h5")
        r = imp("folder", root, "--out", out, *extra)
        if r.returncode != 0:
            fail(f"import folder {extra}: exit {r.returncode}: {r.stderr}")
            continue
        print(f"  {name}: {r.stdout.strip().splitlines()[0]}")
        if "skipped 1 file(s) whose names do not end in .jpg" not in r.stdout:
            fail(f"import folder {extra}: the README was not reported as skipped:\n{r.stdout}")
        files[name] = out
        check_dataset(out, "--folder", root)
    with h5py.File(files["jpeg_max160"], "r") as f:
        if int(f["train/shapes"][...].max()) > 160:
            fail("--max-side 160: a stored image is larger")
    # The thread count changes nothing: the same bytes for 1 and 3 decoding threads.
    a, b = os.path.join(WORK, "t1.h5"), os.path.join(WORK, "t3.h5")
    for out, t in ((a, "1"), (b, "3")):
        r = imp("folder", root, "--out", out, "--store", "raw", "--size", "32", "--threads", t)
        if r.returncode:
            fail(f"--threads {t}: {r.stderr}")
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in ("train/images", "train/labels", "val/images", "train/checksums"):
            if not np.array_equal(fa[k][...], fb[k][...]):
                fail(f"--threads 1 and 3 differ in {k}")
    # `data inspect` reads a JPEG store (every block's checksum).
    r = run([CLI, "data", "inspect", files.get("jpeg", a)])
    if r.returncode or "storage:     jpeg" not in r.stdout or "every block's content checksum matches" not in r.stdout:
        fail(f"data inspect of a JPEG store: {r.returncode}\n{r.stdout}{r.stderr}")


def cifar_round_trips():
    print("CIFAR round trips")
    for variant, style, proto in ((10, "py2", 2), (100, "py2", 2), (10, "py3", 2), (100, "py3", 4), (10, "py3", 5)):
        tgz = os.path.join(WORK, f"cifar-{variant}-{style}{proto}.tar.gz")
        script("make_cifar_tarball.py", "--variant", str(variant), "--per-batch", "30", "--test", "20", "--style", style,
               "--protocol", str(proto), "--out", tgz)
        out = os.path.join(WORK, f"cifar{variant}-{style}{proto}.h5")
        r = imp(f"cifar{variant}", tgz, "--out", out)
        if r.returncode:
            fail(f"import cifar{variant} ({style}, protocol {proto}): {r.stderr}")
            continue
        print(f"  cifar{variant} {style} protocol {proto}: {r.stdout.strip()}")
        check_dataset(out, "--cifar", tgz)
    tgz = os.path.join(WORK, "cifar-100-py22.tar.gz")
    out = os.path.join(WORK, "cifar100-coarse.h5")
    r = imp("cifar100", tgz, "--coarse", "--out", out)
    if r.returncode or "20 classes" not in r.stdout:
        fail(f"import cifar100 --coarse: {r.stdout}{r.stderr}")
    else:
        check_dataset(out, "--cifar", tgz)


def script_refuses(name, args, code, must, what):
    """A script's error: exit `code` (1, or argparse's 2), `must` in its output, no traceback."""
    r = run([PY, os.path.join(SRC, "scripts", name), *args])
    out = r.stdout + r.stderr
    if r.returncode != code or must not in out or "Traceback" in out:
        fail(f"{name}, {what}: exit {r.returncode} (expected {code} with '{must}'):\n{out}")
    else:
        print(f"  {name}, {what}: exit {code}, {[l for l in out.splitlines() if must in l][0][:140]}")


def script_bad_inputs():
    """check_dataset.py: a FAIL line and exit 1, never a traceback or "consistent", for files that lack what it reads
    or whose splits differ; make_cifar_tarball.py: arguments checked, --out written through a temporary."""
    print("check_dataset.py and make_cifar_tarball.py on bad input")
    base = fresh(os.path.join(WORK, "scripts-bad"))
    good = os.path.join(WORK, "raw64.h5")

    def variant(name, change):
        path = os.path.join(base, f"{name}.h5")
        shutil.copyfile(good, path)
        with h5py.File(path, "r+") as f:
            change(f)
        return path

    def val32(f):  # 32x32 val images under 64x64 train ones: reported "consistent"
        n = f["val/images"].shape[0]
        del f["val/images"]
        f.create_dataset("val/images", data=np.zeros((n, 32, 32, 3), np.uint8), chunks=(1, 32, 32, 3), fletcher32=True)
    cases = [("val32", val32, "/val/images are [32, 32, 3] uint8, /train/images [64, 64, 3] uint8"),
             ("noval", lambda f: f.__delitem__("val"), "no /val split"),
             ("nochecksums", lambda f: f.__delitem__("train/checksums"), "no /train/checksums (version 3"),
             ("noblock", lambda f: f["train/checksums"].attrs.__delitem__("block_samples"),
              "/train/checksums has no block_samples attribute"),
             ("block0", lambda f: f["train/checksums"].attrs.__setitem__("block_samples", np.int64(0)),
              "block_samples is 0, not a count >= 1"),
             ("noclasses", lambda f: f.attrs.__delitem__("num_classes"), "no 'num_classes' attribute")]
    for name, change, must in cases:
        script_refuses("check_dataset.py", [variant(name, change)], 1, must, name)
    text = os.path.join(base, "text.h5")
    with open(text, "w") as f:
        f.write("not HDF5\n")
    script_refuses("check_dataset.py", [text], 1, "text.h5: not an HDF5 file", "a text file")
    os.makedirs(os.path.join(base, "folder", "val"))
    script_refuses("check_dataset.py", [good, "--folder", os.path.join(base, "folder")], 1, "no train/ directory",
                   "--folder without train/")
    script_refuses("check_dataset.py", [good, "--cifar", text], 1, "not a cifar-10/100-python tarball",
                   "--cifar on a text file")
    idx = os.path.join(base, "idx")
    os.makedirs(idx)
    for prefix, n in (("train", 27), ("t10k", 6)):
        with gzip.open(os.path.join(idx, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 64, 64) + bytes(n * 64 * 64))
    script_refuses("check_dataset.py", [good, "--idx-dir", idx], 1, "train-labels-idx1-ubyte.gz: cannot read it",
                   "--idx-dir without the label files")
    with gzip.open(os.path.join(idx, "train-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 2049, 27) + bytes(27))
    data = open(os.path.join(idx, "train-labels-idx1-ubyte.gz"), "rb").read()
    with open(os.path.join(idx, "train-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(data[:len(data) // 2])
    script_refuses("check_dataset.py", [good, "--idx-dir", idx], 1, "train-labels-idx1-ubyte.gz: cannot read it",
                   "a truncated idx .gz")
    script_refuses("check_dataset.py", [os.path.join(WORK, "jpeg.h5"), "--idx-dir", idx], 1,
                   "a JPEG store: --idx-dir compares raw pixels", "a JPEG store with --idx-dir")
    tgz = os.path.join(base, "c.tar.gz")
    for args, code, must in ((["--per-batch", "0"], 2, "argument --per-batch: must be >= 1, got 0"),
                             (["--style", "py3", "--protocol", "9"], 2, "argument --protocol: a pickle protocol is 0"),
                             (["--out", base], 1, "is a directory"),
                             (["--out", os.path.join(base, "none", "c.tgz")], 1, "does not exist or is not writable")):
        script_refuses("make_cifar_tarball.py", ["--per-batch", "2", "--out", tgz] + args, code, must, " ".join(args))
    with open(tgz, "w") as f:
        f.write("an older file\n")
    script("make_cifar_tarball.py", "--per-batch", "2", "--out", tgz)
    if not tarfile.is_tarfile(tgz) or [e for e in os.listdir(base) if e.startswith("c.tar.gz.")]:
        fail(f"make_cifar_tarball.py: {tgz} not replaced by a tarball, or a temporary left: {os.listdir(base)}")


def expect_error(args, must_name, what, out):
    existed = os.path.exists(out)  # an existing --out must stay, and nothing else appear beside it
    r = imp(*args)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    ok = True
    if r.returncode != 1:
        fail(f"{what}: exit status {r.returncode} (expected 1){'' if r.returncode < 128 else ' - a crash'}:\n{r.stderr}")
        ok = False
    elif not any("renaissance: error: " in l and must_name in l for l in lines):
        fail(f"{what}: the error does not name {must_name}:\n{r.stderr}")
        ok = False
    d = os.path.dirname(out)
    name = os.path.basename(out)
    left = [e for e in os.listdir(d) if e.startswith(name) and not (existed and e == name)]
    if left:
        fail(f"{what}: left {left} behind")
        ok = False
    if ok:
        print(f"  {what}: exit 1, {[l for l in lines if 'error' in l][0][:150]}")
    return r


def png_header(w, h):
    """A PNG whose IHDR claims w x h (8-bit RGB) with one small IDAT: the importer must refuse it from the header."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def jpeg_claiming(w, h, src):
    """A real JPEG whose SOF0 frame header is patched to claim w x h."""
    b = bytearray(open(src, "rb").read())
    i = 2
    while i < len(b):
        marker, length = b[i + 1], struct.unpack(">H", b[i + 2:i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            b[i + 5:i + 9] = struct.pack(">HH", h, w)
            return bytes(b)
        i += 2 + length
    raise RuntimeError("no SOF marker")


def bad_inputs(good):
    print("bad input")
    base = os.path.join(WORK, "bad")
    sample = os.path.join(good, "train", "n00000000", sorted(os.listdir(os.path.join(good, "train", "n00000000")))[0])
    jpeg = open(sample, "rb").read()

    def tree(name, mutate):
        root = os.path.join(base, name)
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(good, root)
        mutate(root)
        return root

    def write(path, data):
        with open(path, "wb") as f:
            f.write(data)
        return path

    def sparse(path, size):
        os.truncate(path, size)
        return path

    def dangling(path):
        os.symlink("gone.jpg", path)
        return path

    def fifo(path):
        os.mkfifo(path)
        return path

    out = os.path.join(fresh(os.path.join(WORK, "out")), "bad.h5")
    cls = os.path.join("train", "n00000002")
    cases = [
        ("corrupt JPEG", lambda r: write(os.path.join(r, cls, "corrupt.jpg"),
                                         jpeg[:600] + bytes((x * 37) & 0xff for x in range(400)) + jpeg[1000:])),
        ("truncated JPEG", lambda r: write(os.path.join(r, cls, "truncated.jpg"), jpeg[:len(jpeg) // 2])),
        ("truncated PNG", lambda r: write(os.path.join(r, cls, "truncated.png"),
                                          open(os.path.join(r, "train", "n00000001", "alpha.png"), "rb").read()[:300])),
        ("non-image file", lambda r: write(os.path.join(r, cls, "notes.jpg"), b"these are my notes, not an image\n")),
        ("20000x20000 PNG", lambda r: write(os.path.join(r, cls, "huge.png"), png_header(20000, 20000))),
        ("20000x20000 JPEG", lambda r: write(os.path.join(r, cls, "huge.jpg"), jpeg_claiming(20000, 20000, sample))),
        # A 20 GB (sparse) file named .png: refused from its size, before it is read (it ended with std::bad_alloc).
        ("20 GB file", lambda r: sparse(write(os.path.join(r, cls, "disk.png"), png_header(64, 64)), 20 << 30)),
        # Not regular files but named like images: they were dropped without a word (torchvision lists them as
        # samples); opening the FIFO would block until something wrote into it.
        ("dangling link", lambda r: dangling(os.path.join(r, cls, "moved.jpg"))),
        ("FIFO", lambda r: fifo(os.path.join(r, cls, "pipe.png"))),
    ]
    for what, mutate in cases:
        holder = {}
        root = tree(what.replace(" ", "_"), lambda r: holder.setdefault("file", mutate(r)))
        bad_file = holder["file"]
        expect_error(["folder", root, "--out", out], bad_file, what, out)
        # --skip-bad: imported, the file counted and named in the summary.
        r = imp("folder", root, "--out", out, "--skip-bad")
        if r.returncode != 0 or "skipped 1 unreadable image(s)" not in r.stdout or bad_file not in r.stdout:
            fail(f"{what} with --skip-bad: exit {r.returncode}\n{r.stdout}{r.stderr}")
        else:
            with h5py.File(out, "r") as f:
                n = len(f["train/labels"])
            print(f"  {what} with --skip-bad: imported {n} train images, the file counted and named")
        os.remove(out)
    # Structural problems: always errors.
    root = tree("empty_class", lambda r: os.makedirs(os.path.join(r, "train", "zz_empty")))
    expect_error(["folder", root, "--out", out], os.path.join(root, "train", "zz_empty"), "empty class folder", out)
    root = tree("val_only_class", lambda r: shutil.copytree(os.path.join(r, "val", "n00000000"),
                                                            os.path.join(r, "val", "n99999999")))
    expect_error(["folder", root, "--out", out], os.path.join(root, "val", "n99999999"), "val class not in train", out)
    # A link to a folder that contains it: std::filesystem followed it until the path was too long (3 images of a
    # class became 129 samples); a link elsewhere is followed, as torchvision's os.walk(followlinks=True) does.
    root = tree("link_cycle", lambda r: os.symlink("..", os.path.join(r, cls, "again")))
    expect_error(["folder", root, "--out", out], os.path.join(root, cls, "again"), "a link to a folder holding it", out)
    # Two class folders linking to each other: a cycle through both (each class filled with copies of both).
    root = tree("link_mutual", lambda r: (os.symlink(os.path.join("..", "n00000001"), os.path.join(r, cls, "to1")),
                                          os.symlink(os.path.join("..", "n00000002"),
                                                     os.path.join(r, "train", "n00000001", "to2"))))
    expect_error(["folder", root, "--out", out], "which holds it through other links",
                 "two folders linking to each other", out)
    # Links that reach one folder by several paths, without a cycle: 24 folders each linking twice to the next made
    # 2^24 walks of the last one's images (hours; at depth 10, 1,024 copies of one image).
    def diamond_chain(r):
        chain = os.path.join(r, "chain")
        for i in range(13):
            os.makedirs(os.path.join(chain, f"d{i}"))
        for i in range(12):
            for link in ("l1", "l2"):
                os.symlink(os.path.join("..", f"d{i + 1}"), os.path.join(chain, f"d{i}", link))
        shutil.copy(os.path.join(r, cls, sorted(os.listdir(os.path.join(r, cls)))[0]),
                    os.path.join(chain, "d12", "img.png"))
        os.symlink(os.path.join("..", "..", "chain", "d0"), os.path.join(r, cls, "top"))
    root = tree("link_diamonds", diamond_chain)
    t0 = time.monotonic()
    expect_error(["folder", root, "--out", out], "is reached again here", "links reaching one folder twice", out)
    if time.monotonic() - t0 > 30:
        fail(f"links reaching one folder twice: the import took {time.monotonic() - t0:.0f} s to say so")
    # --out inside the tree: the finished dataset would replace an image being imported (or join a class folder).
    root = tree("out_inside", lambda r: None)
    image = os.path.join(root, cls, sorted(os.listdir(os.path.join(root, cls)))[0])
    before = open(image, "rb").read()
    expect_error(["folder", root, "--out", image], "the folder being imported", "--out is one of the images", image)
    if open(image, "rb").read() != before:
        fail("--out is one of the images: the image was changed")
    new_in_val = os.path.join(root, "val", "n00000000", "dataset.h5")
    expect_error(["folder", root, "--out", new_in_val], "the folder being imported", "--out inside val/", new_in_val)
    linked = os.path.join(base, "linked_images")
    shutil.rmtree(linked, ignore_errors=True)
    shutil.copytree(os.path.join(good, "val", "n00000000"), linked)
    root = tree("out_linked", lambda r: os.symlink(linked, os.path.join(r, cls, "more")))
    image = os.path.join(linked, sorted(os.listdir(linked))[0])
    before = open(image, "rb").read()
    expect_error(["folder", root, "--out", image], "(through a link)", "--out is an image of a linked folder",
                 image)
    if open(image, "rb").read() != before:
        fail("--out is an image of a linked folder: the image was changed")
    # ... or the target of a linked file in a class folder.
    root = tree("out_linked_file", lambda r: os.symlink(image, os.path.join(r, cls, "linked.jpg")))
    expect_error(["folder", root, "--out", image], "(through a link)", "--out is the target of a linked image", image)
    if open(image, "rb").read() != before:
        fail("--out is the target of a linked image: the image was changed")
    root = tree("link_out", lambda r: os.symlink(os.path.join(r, "val", "n00000000"), os.path.join(r, cls, "more")))
    r = imp("folder", root, "--out", out)
    if r.returncode != 0:
        fail(f"a link to another folder: exit {r.returncode}\n{r.stderr}")
    else:
        with h5py.File(out, "r") as f:
            linked = len(os.listdir(os.path.join(root, "val", "n00000000")))
            n2 = int((f["train/labels"][...] == 2).sum())
        want = len(os.listdir(os.path.join(root, cls))) - 1 + linked  # the link itself is not an image
        if n2 != want:
            fail(f"a link to another folder: class 2 has {n2} train images, expected {want}")
        else:
            print(f"  a link to another folder: followed, class 2 has {n2} train images")
        os.remove(out)
    root = tree("no_train", lambda r: shutil.rmtree(os.path.join(r, "train")))
    expect_error(["folder", root, "--out", out], os.path.join(root, "train"), "missing train folder", out)
    expect_error(["folder", root + "-nonexistent", "--out", out], root + "-nonexistent", "missing folder", out)
    # Tarballs.
    tgz = os.path.join(WORK, "cifar-10-py22.tar.gz")
    data = open(tgz, "rb").read()
    cut = write(os.path.join(base, "truncated.tar.gz"), data[:len(data) // 2])
    expect_error(["cifar10", cut, "--out", out], cut, "truncated tarball", out)
    flipped = bytearray(data)
    for k in range(len(data) // 3, len(data) // 3 + 64):
        flipped[k] ^= 0x5A
    bad = write(os.path.join(base, "corrupt.tar.gz"), bytes(flipped))
    expect_error(["cifar10", bad, "--out", out], bad, "corrupt tarball", out)
    wrong = os.path.join(WORK, "cifar-100-py22.tar.gz")
    expect_error(["cifar10", wrong, "--out", out], wrong, "CIFAR-100 tarball given as CIFAR-10", out)
    notar = write(os.path.join(base, "plain.tar.gz"), b"hello" * 200)
    expect_error(["cifar10", notar, "--out", out], notar, "not a tarball", out)

    def retar(name, change):
        """The good CIFAR-10 tarball with its members changed by change(list of (TarInfo, bytes))."""
        members = []
        with tarfile.open(tgz) as t:
            for m in t.getmembers():
                members.append((m, t.extractfile(m).read() if m.isfile() else None))
        change(members)
        path = os.path.join(base, name)
        with tarfile.open(path, "w:gz") as t:
            for m, b in members:
                m.size = len(b) if b is not None else 0
                t.addfile(m, io.BytesIO(b) if b is not None else None)
        return path

    def member(members, base_name):
        return next(i for i, (m, _) in enumerate(members) if m.name.endswith("/" + base_name))

    # A second data_batch_1 appended (tar -r): tar extracts the last copy, the importer read the first.
    def dup(ms):
        m, b = ms[member(ms, "data_batch_1")]
        other = tarfile.TarInfo(m.name)
        ms.append((other, ms[member(ms, "data_batch_2")][1]))
    dup_tgz = retar("dup.tar.gz", dup)
    expect_error(["cifar10", dup_tgz, "--out", out], "two members named 'data_batch_1'", "a member twice", out)

    # Label names that are not UTF-8 (stored as UTF-8 strings: h5py then failed to read them).
    def bad_names(ms):
        import pickle
        i = member(ms, "batches.meta")
        meta = pickle.loads(ms[i][1], encoding="bytes")
        key = b"label_names" if b"label_names" in meta else "label_names"
        meta[key] = [b"\xff\xfe"] + list(meta[key][1:])
        ms[i] = (ms[i][0], pickle.dumps(meta, protocol=2))
    names_tgz = retar("names.tar.gz", bad_names)
    expect_error(["cifar10", names_tgz, "--out", out], "batches.meta", "a label name that is not UTF-8", out)

    # A batch claiming 2^54 rows of 3072 bytes with no bytes: 2^54 * 3072 wrapped to 0 in 64 bits and passed the
    # size check (protocol 2 opcodes written by hand: numpy cannot make such an array).
    def huge_rows(ms):
        shape = b"\x8a\x08" + struct.pack("<q", 2 ** 54) + b"\x8a\x08" + struct.pack("<q", 3072) + b"\x86"
        dtype = (b"cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R" +
                 b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
        p = (b"\x80\x02}(U\x04datacnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R" +
             b"(K\x01" + shape + dtype + b"\x89T" + struct.pack("<i", 0) + b"tbU\x06labels]u.")
        i = member(ms, "data_batch_1")
        ms[i] = (ms[i][0], p)
    rows_tgz = retar("rows.tar.gz", huge_rows)
    expect_error(["cifar10", rows_tgz, "--out", out], "claims 18014398509481984 x 3072 but holds 0 bytes",
                 "a batch claiming 2^54 rows", out)


def listing_and_names(good):
    """Folders that cannot be listed or named, and --out through a linked class folder."""
    print("listing, names, links")
    base = os.path.join(WORK, "listing")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    out_dir = os.path.join(base, "out")
    os.makedirs(out_dir)
    out = os.path.join(out_dir, "o.h5")
    cls = os.path.join("train", "n00000002")

    def tree(name):
        root = os.path.join(base, name)
        shutil.copytree(good, root)
        return root

    # A subfolder of a class that cannot be listed: the listing stopped there and the class's remaining images were
    # dropped, exit 0. Root reads any folder: as root the import runs as nobody (setpriv), the tree opened to it.
    root = tree("locked")
    locked = os.path.join(root, cls, "aaa_locked")  # listed early: most of the class came after it
    os.makedirs(locked)
    as_user = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            print("  (skipped: an unreadable subfolder needs setpriv to drop root)")
            root = None
        else:
            as_user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
            for d, dirs, files in os.walk(base):
                os.chmod(d, 0o777)
                for f in files:
                    os.chmod(os.path.join(d, f), 0o666)
            probe = run(as_user + ["test", "-x", base])
            if probe.returncode != 0:
                print(f"  (skipped: nobody cannot reach {base})")
                root = None
    if root:
        os.chmod(locked, 0)
        r = run(as_user + [CLI, "data", "import", "folder", root, "--out", out])
        os.chmod(locked, 0o777)
        if r.returncode != 1 or locked not in r.stderr or "cannot list" not in r.stderr:
            fail(f"an unreadable subfolder: exit {r.returncode} (expected 1, naming {locked}):\n{r.stdout}{r.stderr}")
        else:
            print(f"  an unreadable subfolder: exit 1, {r.stderr.strip().splitlines()[-1][:150]}")
        if os.path.exists(out):
            fail("an unreadable subfolder: a dataset was written")
            os.remove(out)

    # A class folder named in Latin-1: stored as a UTF-8 string, h5py could not read the class names back.
    root = tree("latin1")
    bad = os.path.join(os.fsencode(root), b"train", b"caf\xe9")
    os.rename(os.path.join(root, "train", "n00000001"), bad)
    os.rename(os.path.join(root, "val", "n00000001"), os.path.join(os.fsencode(root), b"val", b"caf\xe9"))
    expect_error(["folder", root, "--out", out], os.fsdecode(bad), "a class folder named in Latin-1", out)

    # File names that are not UTF-8: taken in the order Python sorts the names it decodes (surrogateescape: the byte
    # 0xff is U+DCFF, before an emoji's U+1F600), as torchvision takes them; the bytes' order put them the other way.
    root = fresh(os.path.join(base, "bytes_names"))
    names = [b"\xf0\x9f\x98\x80.png", b"\xff.png", b"a.png"]
    for split in ("train", "val"):
        os.makedirs(os.path.join(root, split, "c0"))
        for k, name in enumerate(names):
            Image.fromarray(np.full((8, 8, 3), 40 * (k + 1), np.uint8)).save(
                os.path.join(os.fsencode(root), split.encode(), b"c0", name), format="PNG")
    r = imp("folder", root, "--out", out, "--store", "raw", "--size", "8")
    if r.returncode:
        fail(f"file names that are not UTF-8: exit {r.returncode}:\n{r.stdout}{r.stderr}")
    else:
        want = [40 * (names.index(os.fsencode(n)) + 1) for n in sorted(os.listdir(os.path.join(root, "train", "c0")))]
        with h5py.File(out, "r") as f:
            got = [int(v) for v in f["train/images"][:, 0, 0, 0]]
        if got != want:
            fail(f"file names that are not UTF-8: samples in the order {got}, Python's sorted() gives {want}")
        else:
            print(f"  file names that are not UTF-8: in Python's sorted() order ({got})")
        os.remove(out)

    # --out inside a class folder reached through a link: the dataset became a file of that class.
    root = tree("linked_class")
    elsewhere = os.path.join(base, "elsewhere")
    shutil.move(os.path.join(root, cls), elsewhere)
    os.symlink(elsewhere, os.path.join(root, cls))
    inside = os.path.join(root, cls, "new.h5")
    expect_error(["folder", root, "--out", inside], "(through a link)", "--out inside a linked class folder", inside)
    if os.path.exists(os.path.join(elsewhere, "new.h5")):
        fail("--out inside a linked class folder: the file was written")


def gzip_member(data, name_len=0, level=0):
    """A gzip file of `data` (a stored deflate stream at level 0) with an FNAME of name_len bytes."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    body = c.compress(data) + c.flush()
    flags = 0x08 if name_len else 0
    header = b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\xff" + (b"n" * name_len + b"\0" if name_len else b"")
    return bytearray(header + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF))


def hostile_archives():
    """gzip streams whose CRC-32 or trailer zlib checks only at the end, tar members renamed by pax headers or added
    again as links, pickles read two ways, empty splits, unpacked Fashion-MNIST files as --out, files named like a
    temporary of --out, a file named '.png'. Each read two ways before: the importer's way and tar's/gzip's/Python's."""
    print("hostile archives")
    base = fresh(os.path.join(WORK, "hostile"))
    out = os.path.join(base, "o.h5")
    tgz = os.path.join(WORK, "cifar-10-py22.tar.gz")
    with tarfile.open(tgz) as t:
        members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]

    def tar_bytes(ms, fmt=tarfile.GNU_FORMAT):
        b = io.BytesIO()
        with tarfile.open(fileobj=b, mode="w", format=fmt) as t:
            for m, d in ms:
                t.addfile(m, io.BytesIO(d) if d is not None else None)
        return b.getvalue()

    def write_file(name, data):
        path = os.path.join(base, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def labels_by_tar(path):
        """The train labels as `tar -x` + pickle would give them (the last member of each name wins)."""
        import pickle
        found = {}
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.isfile():
                    found[m.name.split("/")[-1]] = t.extractfile(m).read()
        labels = []
        for k in range(1, 6):
            d = pickle.loads(found[f"data_batch_{k}"], encoding="bytes")
            labels += list(d[b"labels"] if b"labels" in d else d["labels"])
        return labels

    def imports_as_tar_reads(path, what):
        fresh_out = out
        if os.path.exists(fresh_out):
            os.remove(fresh_out)
        r = imp("cifar10", path, "--out", fresh_out)
        if r.returncode:
            fail(f"{what}: exit {r.returncode}:\n{r.stderr}")
            return
        with h5py.File(fresh_out, "r") as f:
            got = list(f["train/labels"][...])
        if got != labels_by_tar(path):
            fail(f"{what}: the train labels differ from tar's members")
        else:
            print(f"  {what}: imported, {len(got)} train labels as tar reads them")
        os.remove(fresh_out)

    # A stored (level-0) gzip with one byte of a member flipped: inflate cannot see it, only the CRC-32 at the end;
    # the same cut before its 8-byte trailer; and followed by 4 MiB of tar padding before the trailer.
    raw = tar_bytes(members)
    inner = next(i for i, (m, _) in enumerate(members) if m.name.endswith("data_batch_3"))
    at = raw.index(members[inner][1][1000:1064]) + 10
    flipped_raw = bytearray(raw)
    flipped_raw[at] ^= 0x01
    bad = gzip_member(bytes(flipped_raw))
    bad[-8:-4] = struct.pack("<I", zlib.crc32(raw))  # the CRC of the intact archive: the data no longer matches it
    path = write_file("crc.tar.gz", bytes(bad))
    expect_error(["cifar10", path, "--out", out], path, "a gzip CRC-32 mismatch (a stored block)", out)
    path = write_file("notrailer.tar.gz", bytes(gzip_member(raw)[:-8]))
    expect_error(["cifar10", path, "--out", out], path, "a tarball without its gzip trailer", out)
    padded = gzip_member(bytes(flipped_raw) + bytes(4 << 20))
    padded[-8:-4] = struct.pack("<I", zlib.crc32(raw + bytes(4 << 20)))
    path = write_file("padded.tar.gz", bytes(padded))
    expect_error(["cifar10", path, "--out", out], path, "a CRC-32 mismatch behind 4 MiB of padding", out)

    # pax headers: a decoy whose ustar name is data_batch_1 but whose pax path is another, and the real batch named
    # only through its pax path; a pax tarball with a folder name too long for ustar.
    ms = []
    for m, d in members:
        m2 = tarfile.TarInfo(m.name)
        m2.size, m2.type, m2.mode = m.size, m.type, m.mode
        if m.name.endswith("data_batch_1"):
            decoy = tarfile.TarInfo(m.name)
            decoy.size = len(members[inner][1])
            decoy.pax_headers = {"path": "decoy/not_a_batch"}
            ms.append((decoy, members[inner][1]))
            m2.name = "x" * 90  # the ustar name field holds the truncated long name, the pax path the real one
            m2.pax_headers = {"path": m.name}
        ms.append((m2, d))
    path = write_file("pax_remap.tar", tar_bytes(ms, tarfile.PAX_FORMAT))
    imports_as_tar_reads(path, "pax paths that rename members")
    long_dir = "d" * 160 + "/cifar-10-batches-py/"
    ms = []
    for m, d in members:
        m2 = tarfile.TarInfo(long_dir + m.name.split("/")[-1])
        m2.size, m2.type, m2.mode = m.size, m.type, m.mode
        ms.append((m2, d))
    path = write_file("pax_long.tar", tar_bytes(ms, tarfile.PAX_FORMAT))
    imports_as_tar_reads(path, "a pax tarball with a 160-character folder name")

    # data_batch_1 added again later as a link to test_batch: tar -x leaves the link, the importer read the file.
    for kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        link = tarfile.TarInfo(next(m.name for m, _ in members if m.name.endswith("data_batch_1")))
        link.type = kind
        link.linkname = next(m.name for m, _ in members if m.name.endswith("test_batch"))
        if kind == tarfile.SYMTYPE:
            link.linkname = "test_batch"
        path = write_file(f"link{kind.decode()}.tar", tar_bytes(members + [(link, None)]))
        expect_error(["cifar10", path, "--out", out], "data_batch_1", f"data_batch_1 again as a link (type {kind.decode()})",
                     out)

    # Headers written by hand (what tarfile will not write). raw(name, size, type) is one ustar header; pax(records)
    # an extended header's data.
    def raw(name, size, typeflag):
        h = bytearray(512)
        h[0:len(name)] = name
        h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
        h[124:136], h[136:148] = b"%011o\0" % size, b"%011o\0" % 0
        h[148:156] = b" " * 8
        h[156] = typeflag
        h[257:263], h[263:265] = b"ustar\0", b"00"
        h[148:156] = b"%06o\0 " % sum(h)
        return bytes(h)

    def padded(data):
        return data + bytes(-len(data) % 512)

    def pax(**records):
        out = b""
        for k, v in records.items():
            body = b" %s=%s\n" % (k.encode(), v.encode())
            n = len(body) + 1
            while len(str(n)) + len(body) != n:
                n = len(str(n)) + len(body)
            out += str(n).encode() + body
        return out

    def member_bytes(name):
        return next(d for m, d in members if m.name.endswith("/" + name))

    def the_rest(skip):
        return b"".join(raw(m.name.encode(), len(d), ord("0")) + padded(d) for m, d in members
                        if d is not None and m.name.split("/")[-1] not in skip)

    real, decoy = member_bytes("data_batch_1"), member_bytes("data_batch_2")
    p1 = "cifar-10-batches-py/data_batch_1"
    # A pax header and then a GNU long name before each member: the pax path applies (as tar and Python read it),
    # to the member, not to the long name's header; the decoy comes first.
    x1, l1 = pax(path="elsewhere/not_a_batch"), p1.encode() + b"\0"
    x2, l2 = pax(path=p1), b"whatever\0"
    crafted = (raw(b"././@PaxHeader", len(x1), ord("x")) + padded(x1) + raw(b"././@LongLink", len(l1), ord("L")) +
               padded(l1) + raw(b"decoy", len(decoy), ord("0")) + padded(decoy) +
               raw(b"././@PaxHeader", len(x2), ord("x")) + padded(x2) + raw(b"././@LongLink", len(l2), ord("L")) +
               padded(l2) + raw(b"real", len(real), ord("0")) + padded(real) + the_rest({"data_batch_1"}) + bytes(1024))
    path = write_file("pax_and_longname.tar", crafted)
    imports_as_tar_reads(path, "a pax path and a long name before each member")
    # A hard link claiming data: tar reads none after it, so the importer must not skip its "data" (the real batch)
    # and read a decoy hidden in the next member's data as a header.
    fake = raw(p1.encode(), len(decoy), ord("0")) + padded(decoy)
    crafted = (raw(b"lnk", len(real) + 512, ord("1")) + raw(p1.encode(), len(real), ord("0")) + padded(real) +
               raw(b"blob", len(fake), ord("0")) + fake + the_rest({"data_batch_1"}) + bytes(1024))
    path = write_file("link_with_data.tar", crafted)
    expect_error(["cifar10", path, "--out", out], "claims", "a hard link claiming data", out)
    # A pax path ending in '/' (a directory to tar) naming the real batch, after a decoy of that name.
    x3 = pax(path=p1 + "/")
    crafted = (raw(p1.encode(), len(decoy), ord("0")) + padded(decoy) + raw(b"././@PaxHeader", len(x3), ord("x")) +
               padded(x3) + raw(b"xxxxx", len(real), ord("0")) + padded(real) + the_rest({"data_batch_1"}) +
               bytes(1024))
    path = write_file("pax_dir_name.tar", crafted)
    expect_error(["cifar10", path, "--out", out], "data_batch_1", "a pax path naming the batch with a trailing '/'",
                 out)

    # A batch pickle setting 'labels' twice (Python keeps the second).
    import pickle
    i1 = next(i for i, (m, _) in enumerate(members) if m.name.endswith("data_batch_1"))
    d = pickle.loads(members[i1][1], encoding="bytes")
    key = b"labels" if b"labels" in d else "labels"
    p = pickle.dumps(d, protocol=2)
    assert p.endswith(b"u.")
    other = pickle.dumps([(x + 1) % 10 for x in d[key]], protocol=2)[2:-1]  # the list's opcodes alone
    p = p[:-1] + pickle.dumps(key, protocol=2)[2:-1] + other + b"s."  # SETITEM 'labels' again, then STOP
    ms = list(members)
    ms[i1] = (members[i1][0], p)
    ms[i1][0].size = len(p)
    path = write_file("twice.tar", tar_bytes(ms))
    expect_error(["cifar10", path, "--out", out], "the key 'labels' is set 2 times", "a batch setting 'labels' twice",
                 out)
    members[i1][0].size = len(members[i1][1])

    # Train batches with no rows: the message named the output and finish() ("append training samples").
    empty = pickle.dumps({b"data": np.zeros((0, 3072), np.uint8), b"labels": []}, protocol=2)
    ms = []
    for m, dd in members:
        if "data_batch" in m.name:
            m2 = tarfile.TarInfo(m.name)
            m2.size = len(empty)
            ms.append((m2, empty))
        else:
            ms.append((m, dd))
    path = write_file("empty_train.tar", tar_bytes(ms))
    expect_error(["cifar10", path, "--out", out], path, "train batches without samples", out)

    # idx: a stored gzip whose compressed length is a multiple of zlib's 256 KiB buffer, one pixel flipped: the CRC
    # mismatch came with the read after the last image, which was taken as the end; the same without its trailer.
    n = 8000
    images = struct.pack(">IIII", 2051, n, 28, 28) + bytes((k * 7) % 251 for k in range(n * 784))
    labels = struct.pack(">II", 2049, n) + bytes(k % 10 for k in range(n))
    vimages = struct.pack(">IIII", 2051, 10, 28, 28) + bytes(10 * 784)
    vlabels = struct.pack(">II", 2049, 10) + bytes(10)
    plain = len(gzip_member(images))
    name_len = (plain // 262144 + 1) * 262144 - plain - 1
    g = gzip_member(images, name_len)
    assert len(g) % 262144 == 0
    g[len(g) - 8 - len(images) // 2 - 3] ^= 0x01
    paths = {k: write_file(k, v) for k, v in (("tl", labels), ("vi", vimages), ("vl", vlabels))}
    paths["ti"] = write_file("ti_crc.gz", bytes(g))
    args = ["idx", "--train-images", paths["ti"], "--train-labels", paths["tl"], "--val-images", paths["vi"],
            "--val-labels", paths["vl"], "--classes", "10", "--out", out]
    expect_error(args, paths["ti"], "an idx .gz with a CRC-32 mismatch found after the last image", out)
    cut = write_file("ti_cut.gz", bytes(gzip_member(images))[:-8])
    args[2] = cut
    expect_error(args, cut, "an idx .gz without its trailer", out)
    # Through a pipe: the header was read twice (a probe, then the import), the pipe had moved on.
    r = run(["bash", "-c", 'exec "$0" data import idx --train-images <(cat "$1") --train-labels "$2" '
             '--val-images "$3" --val-labels "$4" --classes 10 --out "$5"',
             CLI, write_file("ti", images), paths["tl"], paths["vi"], paths["vl"], out])
    if r.returncode or f"train {n}" not in r.stdout:
        fail(f"idx images through a pipe: exit {r.returncode}:\n{r.stdout}{r.stderr}")
    else:
        print(f"  idx images through a pipe: {r.stdout.strip()}")
        os.remove(out)
    # An empty train split names the images file.
    empty_imgs = write_file("ti0", struct.pack(">IIII", 2051, 0, 28, 28))
    empty_labs = write_file("tl0", struct.pack(">II", 2049, 0))
    expect_error(["idx", "--train-images", empty_imgs, "--train-labels", empty_labs, "--val-images", paths["vi"],
                  "--val-labels", paths["vl"], "--classes", "10", "--out", out], empty_imgs, "an empty train split", out)

    # Fashion-MNIST unpacked (no .gz): --out naming one of the files replaced it with the dataset.
    src = fresh(os.path.join(base, "fm"))
    for name, data in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels),
                       ("t10k-images-idx3-ubyte", vimages), ("t10k-labels-idx1-ubyte", vlabels)):
        write_file(os.path.join("fm", name), data)
    target = os.path.join(src, "train-labels-idx1-ubyte")
    expect_error(["fashion-mnist", "--src", src, "--out", target], "the same file as --src", "--out is an unpacked source",
                 target)
    if open(target, "rb").read() != labels:
        fail("--out is an unpacked source: the labels file was changed")

    # Files named like temporaries of --out: one without a host part (not ours: kept), and an input so named
    # (refused: the writer removes its dead writers' temporaries).
    for name in ("o.h5.tmp-20261207", "o.h5.tmp-x.tmp-4000000"):
        notes = write_file(name, b"notes\n")
        r = imp("cifar10", tgz, "--out", out)
        if r.returncode or not os.path.exists(notes):
            fail(f"a file '{name}' beside --out: exit {r.returncode}, kept: {os.path.exists(notes)}\n{r.stderr}")
        else:
            print(f"  a file named '{name}' beside --out: kept")
        os.remove(out)
        os.remove(notes)
    host = os.uname().nodename
    # An input named like a temporary of the file a linked --out points to (the writer resolves the link).
    os.makedirs(os.path.join(base, "linked"), exist_ok=True)
    target = write_file(os.path.join("linked", "real.h5"), b"")
    as_tmp_of_target = write_file(os.path.join("linked", f"real.h5.tmp-{host}-4000000"), open(tgz, "rb").read())
    link_out = os.path.join(base, "linked", "link.h5")
    os.symlink("real.h5", link_out)
    r = imp("cifar10", as_tmp_of_target, "--out", link_out)
    if r.returncode != 1 or "named like a temporary file" not in r.stderr or not os.path.exists(as_tmp_of_target):
        fail(f"an input named like a temporary of a linked --out's target: exit {r.returncode}, kept: "
             f"{os.path.exists(as_tmp_of_target)}\n{r.stderr}")
    else:
        print("  an input named like a temporary of a linked --out's target: refused, kept")
    if os.path.getsize(target) != 0:
        fail("an input named like a temporary of a linked --out's target: the target was written")
    as_tmp = write_file(f"o.h5.tmp-{host}-4000000", open(tgz, "rb").read())
    r = imp("cifar10", as_tmp, "--out", out)
    if r.returncode != 1 or "named like a temporary file" not in r.stderr or not os.path.exists(as_tmp):
        fail(f"an input named like a temporary of --out: exit {r.returncode}, kept: {os.path.exists(as_tmp)}\n{r.stderr}")
    else:
        print(f"  an input named like a temporary of --out: exit 1, {r.stderr.strip()[:120]}")

    # A file named ".png" is an image (torchvision: the name ends in .png).
    root = fresh(os.path.join(base, "dotname"))
    for split in ("train", "val"):
        os.makedirs(os.path.join(root, split, "c0"))
        for k, name in enumerate(("a.png", ".png")):
            pixels = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3) * (k + 1)
            Image.fromarray(pixels).save(os.path.join(root, split, "c0", name), format="PNG")
    r = imp("folder", root, "--out", out)
    if r.returncode or "train 2," not in r.stdout:
        fail(f"a file named '.png': exit {r.returncode}, expected 2 train images:\n{r.stdout}{r.stderr}")
    else:
        print(f"  a file named '.png': imported ({r.stdout.strip().splitlines()[0][:100]})")


def main():
    os.makedirs(WORK, exist_ok=True)
    root = make_folder()
    round_trips(root)
    cifar_round_trips()
    script_bad_inputs()
    bad_inputs(root)
    listing_and_names(root)
    hostile_archives()
    if FAILS:
        print(f"{len(FAILS)} failure(s)")
        return 1
    print("all pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
