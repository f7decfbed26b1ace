#!/usr/bin/env python3
# Converts token ids (a text file of whitespace-separated integers, or a .npy array if numpy is installed)
# to the binary token files piper reads: .u16.bin (uint16) or, when any id is >= 65536, .u32.bin (uint32).
"""Usage: tools/tokens-to-bin.py INPUT [OUTPUT]

Writes little-endian token ids. OUTPUT ending in .u16.bin or .u32.bin fixes the width (an id too large for
it is an error); ending in .bin means uint16, as piper reads a plain .bin; any other OUTPUT (default: INPUT
without its extension) is a stem that gets .u16.bin or .u32.bin by the largest id. The file is written under
a temporary name in the same folder and renamed when complete, so a reader never sees half of it.
"""
import array
import os
import sys
import tempfile

U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
CHUNK = 1 << 24  # characters of text read at a time


def fail(msg):
    print(f"tokens-to-bin: {msg}", file=sys.stderr)
    sys.exit(2)


def read_text(path):
    """All ids of a text file, as an array of unsigned 32-bit ints (4 bytes each, not Python ints)."""
    code = next(c for c in "IL" if array.array(c).itemsize == 4)
    ids = array.array(code)
    count, rest = 0, ""
    with open(path, "r", encoding="ascii", errors="strict") as f:
        while True:
            try:
                chunk = f.read(CHUNK)
            except UnicodeDecodeError:
                fail(f"{path}: not a text file of ids (a byte that is not ASCII after token {count})")
            text = rest + chunk
            words = text.split()
            # A word cut by the chunk boundary waits for the next chunk.
            if chunk and words and not text[-1].isspace():
                rest = words.pop()
            else:
                rest = ""
            for w in words:
                if not w.isdigit():
                    fail(f"{path}: token {count}: '{w[:40]}' is not a non-negative integer id")
                v = int(w)
                if v > U32_MAX:
                    fail(f"{path}: token {count}: id {v} is outside 0..{U32_MAX} (uint32)")
                ids.append(v)
                count += 1
            if not chunk:
                return ids


def read_npy(path):
    try:
        import numpy as np
    except ImportError:
        fail(f"{path}: reading .npy needs numpy (pip install numpy), or give a text file of ids")
    a = np.load(path, mmap_mode="r", allow_pickle=False)
    if a.dtype.kind not in "iu":
        fail(f"{path}: holds {a.dtype} values, expected integer token ids")
    a = a.reshape(-1)
    if a.size and (int(a.min()) < 0 or int(a.max()) > U32_MAX):
        fail(f"{path}: ids range over {int(a.min())}..{int(a.max())}, outside 0..{U32_MAX} (uint32)")
    return a


def output_path(inp, out, max_id):
    """The file to write and its width in bytes."""
    if out is None:
        out = os.path.splitext(inp)[0]
    if out.endswith(".u32.bin"):
        return out, 4
    if out.endswith(".u16.bin") or out.endswith(".bin"):
        if max_id > U16_MAX:
            stem = out[: -len(".u16.bin")] if out.endswith(".u16.bin") else out[: -len(".bin")]
            fail(f"{out}: id {max_id} does not fit uint16, which piper reads from this name; "
                 f"write {stem}.u32.bin instead")
        return out, 2
    return (out + ".u32.bin", 4) if max_id > U16_MAX else (out + ".u16.bin", 2)


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    inp = argv[1]
    out = argv[2] if len(argv) == 3 else None
    if not os.path.isfile(inp):
        fail(f"{inp}: no such file")
    npy = inp.endswith(".npy")
    ids = read_npy(inp) if npy else read_text(inp)
    n = len(ids)
    if n == 0:
        fail(f"{inp}: holds no token ids")
    max_id = int(ids.max()) if npy else max(ids)
    path, width = output_path(inp, out, max_id)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        fail(f"{path}: no folder {folder}")
    fd, tmp = tempfile.mkstemp(prefix=".tokens-to-bin.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            if npy:
                dtype = "<u4" if width == 4 else "<u2"
                step = 1 << 22
                for i in range(0, n, step):
                    f.write(ids[i : i + step].astype(dtype).tobytes())
            else:
                data = ids if width == 4 else array.array("H", ids)
                if sys.byteorder == "big":
                    data.byteswap()
                data.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    kind = "uint32" if width == 4 else "uint16"
    print(f"tokens-to-bin: wrote {path}: {n} {kind} tokens, largest id {max_id}; "
          f"model.vocab must be at least {max_id + 1}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
