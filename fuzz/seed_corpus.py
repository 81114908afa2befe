#!/usr/bin/env python3
"""Seed corpora for the rext4 fuzz targets, cut from images made with mkfs.ext4 (nothing is
committed: run this before fuzzing; it writes fuzz/corpus/<target>/seed-*).

Needs mkfs.ext4, debugfs and e2fsck (e2fsprogs). Usage: python3 fuzz/seed_corpus.py
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

VARIANTS = [
    ("csum4k", ["-b", "4096"], "8M"),
    ("nocsum1k", ["-b", "1024", "-O", "^metadata_csum,uninit_bg"], "8M"),
    ("ext2", ["-t", "ext2", "-b", "1024"], "8M"),
    ("inline", ["-b", "4096", "-O", "inline_data,^metadata_csum"], "8M"),
]


def sh(*args, **kw):
    return subprocess.run(args, check=False, capture_output=True, text=True, **kw)


def debugfs(img, cmd):
    return sh("debugfs", "-R", cmd, img, env={**os.environ, "PAGER": "__none__"}).stdout


def tree(src):
    os.makedirs(os.path.join(src, "dir1/sub"))
    open(os.path.join(src, "dir1/sub/file"), "w").write("hello\n")
    os.makedirs(os.path.join(src, "big"))
    for i in range(300):
        open(os.path.join(src, "big/entry_%04d_padding_name" % i), "w").write("%d\n" % i)
    with open(os.path.join(src, "frag"), "wb") as f:
        for i in range(12):
            f.seek(i * 8192)
            f.write(bytes([65 + i]) * 4096)
    open(os.path.join(src, "small"), "w").write("small file\n")
    os.symlink("dir1/sub/file", os.path.join(src, "fastlink"))
    os.symlink("d/" * 50 + "target", os.path.join(src, "slowlink"))


def save(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "seed-" + name), "wb").write(data)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        tree(src)
        val = os.path.join(tmp, "val")
        open(val, "wb").write(b"x" * 700)
        for name, args, size in VARIANTS:
            img = os.path.join(tmp, name + ".img")
            r = sh("mkfs.ext4", "-q", "-F", *args, "-d", src, img, size)
            if r.returncode != 0:
                sys.exit("mkfs.ext4 failed: " + r.stderr)
            sh("debugfs", "-w", "-R", "ea_set -f %s /small user.big" % val, img)
            sh("debugfs", "-w", "-R", "ea_set /small user.tiny abc", img)
            sh("e2fsck", "-fyD" if name != "inline" else "-fy", img)
            b = open(img, "rb").read()
            bs = 1024 << struct.unpack_from("<I", b, 1024 + 0x18)[0]
            isz = struct.unpack_from("<H", b, 1024 + 0x58)[0]
            incompat = struct.unpack_from("<I", b, 1024 + 0x60)[0]
            ds = struct.unpack_from("<H", b, 1024 + 0xFE)[0] if incompat & 0x80 else 32
            first = 1 if bs == 1024 else 0
            blk = lambda n: b[n * bs:(n + 1) * bs]
            sel_bs = {1024: 0, 2048: 1, 4096: 2, 65536: 3}[bs]

            save("superblock", name, b[1024:1024 + 16384])
            gdt = blk(first + 1)
            save("group_desc", name, bytes([{32: 0, 64: 1}[ds]]) + gdt[:ds * 4])

            def inode_bytes(path):
                m = re.search(r"located at block (\d+), offset 0x([0-9a-f]+)", debugfs(img, "imap " + path))
                if not m:
                    return None
                o = int(m.group(1)) * bs + int(m.group(2), 16)
                return b[o:o + isz]

            def blocks(path):
                return [int(x) for x in debugfs(img, "blocks " + path).split()]

            for p in ["/", "/frag", "/big", "/small", "/fastlink", "/slowlink", "/dir1/sub/file"]:
                rec = inode_bytes(p)
                if rec:
                    tag = name + p.replace("/", "_")
                    save("inode", tag, bytes([{128: 0, 256: 1, 512: 2, 1024: 3}[isz]]) + rec)
                    save("extent_node", tag + "-root", b"\x00" + rec[0x28:0x28 + 60])
                    save("xattr", tag + "-ibody", b"\x01" + rec[128 + 32:])
            m = re.search(r"\(ETB0\):(\d+)", debugfs(img, "stat /frag"))
            if m:
                save("extent_node", name + "-etb", b"\x01" + blk(int(m.group(1))))
            for p in ["/", "/dir1", "/big"]:
                for i, n in enumerate(blocks(p)[:3]):
                    save("dir_block", "%s%s-%d" % (name, p.replace("/", "_"), i), bytes([sel_bs]) + blk(n))
                    save("dx_block", "%s%s-%d" % (name, p.replace("/", "_"), i), b"\x00" + blk(n))
            m = re.search(r"File ACL: (\d+)", debugfs(img, "stat /small"))
            if m and int(m.group(1)):
                save("xattr", name + "-block", b"\x00" + blk(int(m.group(1))))
            m = re.search(r"\(0(?:-\d+)?\):(\d+)", debugfs(img, "stat <8>"))
            if m:
                jsb = blk(int(m.group(1)))
                save("jbd2_blocks", name + "-jsb", b"\x00" + jsb[:1024])
                # A descriptor, commit and revoke block header on the journal's geometry.
                for t, kind in [(1, "desc"), (2, "commit"), (5, "revoke")]:
                    h = struct.pack(">III", 0xC03B3998, t, 1) + bytes(bs - 12)
                    save("jbd2_blocks", "%s-%s" % (name, kind), b"\x02" + h)
            for i, sel in enumerate([0, 1, 2, 3, 0x80, 0x83]):
                save("image_walk", "%s-%d" % (name, i), bytes([sel]))
    for i, n in enumerate([b"", b".", b"..", b"lost+found", b"entry_0123_padding_name", bytes(range(1, 256))]):
        save("dx_hash", str(i), bytes([i % 6]) + bytes(16) + n)
    print("seed corpora written to", CORPUS)


if __name__ == "__main__":
    main()
