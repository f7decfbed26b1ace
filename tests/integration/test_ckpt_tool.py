"""piper-ckpt on real checkpoints of real runs: ls, show (values, --stats, --slice), diff (exit 1 beyond the
tolerance), verify (planted damage found, per file), meta, and export -> import round trips for GPT-2 and
Qwen3 that are bit-identical; export --dtype bf16 writes each value rounded to the nearest bfloat16 (ties to
even), which imports; an imported checkpoint starts a run; files written by other writers (a
hand-written BF16 file in Hugging Face's GPT-2 layout, and the Python `safetensors` package when installed)
import; bad input exits 2 with a message naming the file."""
import json
import os
import shutil
import struct

from common import fail, losses, piper_ckpt, run, tempdir, tiny_gpt, tiny_qwen3, write


def read_st(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}, meta


def bf16_of_f32(raw):
    """The bytes of float32 values `raw` rounded to bfloat16, nearest with ties to even (finite values)."""
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    return struct.pack(f"<{len(words)}H", *(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF for u in words))


def write_st(path, tensors):
    """tensors: [(name, dtype, shape, bytes)] in this order."""
    header, off = {}, 0
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors))


def floats(raw):
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def to_bf16(raw):
    """float32 bytes -> bfloat16 bytes (truncated)."""
    return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))


def help_per_command():
    """piper-ckpt COMMAND --help prints that command's usage and exits 0."""
    for cmd in ("ls", "show", "diff", "verify", "meta", "export", "import"):
        out = piper_ckpt(cmd, "--help").stdout
        if not out.startswith(f"usage: piper-ckpt {cmd} ") or "usage: piper-ckpt COMMAND" in out:
            fail(f"piper-ckpt {cmd} --help printed:\n{out}")
    piper_ckpt("export", "-h")
    print("ok  piper-ckpt COMMAND --help (and -h): that command's usage, exit 0, for every command")


def main():
    help_per_command()
    d = tempdir()
    ck = os.path.join(d, "ck")
    cfg = write(d, "gpt.toml", tiny_gpt(steps=20) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\nkeep = 5\n')
    run(1, cfg)
    s10, s20 = os.path.join(ck, "step_00000010.h5"), os.path.join(ck, "step_00000020.h5")

    out = piper_ckpt("ls", s20).stdout
    if "params/wte" not in out or "(256, 32)" not in out or "adam_v/blocks.3.mlp.proj.weight" not in out:
        fail(f"ls does not list the tensors with their shapes:\n{out}")
    print("ok  ls lists every tensor with its shape, and the attributes")

    values = [float(x) for line in piper_ckpt("show", s20, "wte", "--all").stdout.splitlines()[1:]
              for x in line.split()]
    if len(values) != 256 * 32:
        fail(f"show --all printed {len(values)} values of wte, expected {256 * 32}")
    stats = piper_ckpt("show", s20, "params/wte", "--stats").stdout.split()
    got = {stats[i]: float(stats[i + 1]) for i in range(stats.index("count"), len(stats) - 1, 2)}
    mean = sum(values) / len(values)
    want = {"min": min(values), "max": max(values), "mean": mean, "norm": sum(v * v for v in values) ** 0.5,
            "std": (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5}
    for k, v in want.items():
        if abs(got[k] - v) > 1e-5 * max(1.0, abs(v)):
            fail(f"show --stats {k} = {got[k]}, the printed values give {v}")
    if got["non-finite"] != 0 or got["count"] != len(values):
        fail(f"show --stats: {got}")
    sl = piper_ckpt("show", s20, "wte", "--slice", "1:3,2:5").stdout.splitlines()[1:]
    if [[float(x) for x in line.split()] for line in sl] != [values[32 + 2:32 + 5], values[64 + 2:64 + 5]]:
        fail(f"show --slice 1:3,2:5 printed {sl}")
    print("ok  show prints values, --slice selects rows and columns, --stats agrees with the values")

    piper_ckpt("diff", s20, s20, want=0)
    out = piper_ckpt("diff", s10, s20, want=1).stdout
    if "params/wte" not in out or "attribute step: 10 against 20" not in out:
        fail(f"diff of step 10 and 20 does not show the tensors and the step:\n{out}")
    piper_ckpt("diff", s10, s20, "--atol", "100", want=0)
    piper_ckpt("diff", s10, s20, "--only", "params/", "--rtol", "0.5", want=1)
    print("ok  diff: identical files exit 0, trained-apart files exit 1, a wide --atol exits 0")
    # the relative column is ‖a − b‖ / ‖b‖ per tensor: finite and small for biases that started at zero, where an
    # elementwise ratio is unbounded; and the job texts' differing lines are shown
    rows = {l.split()[0]: l.split() for l in out.splitlines() if l.startswith("params/")}
    rel = float(rows["params/blocks.0.attn.qkv.bias"][2])
    if not 0 < rel < 10:
        fail(f"diff: relative difference of blocks.0.attn.qkv.bias between steps 10 and 20 is {rel}")
    ck2 = os.path.join(d, "ck2")
    run(1, cfg, "--set", "optimizer.lr=0.002", "--set", f'checkpoint.dir="{ck2}"', "--steps", "10")
    out = piper_ckpt("diff", s10, os.path.join(ck2, "step_00000010.h5"), want=1).stdout
    if "attribute job differs" not in out or "+ # --set optimizer.lr=0.002" not in out:
        fail(f"diff of runs with another lr does not show the job line that differs:\n{out}")
    print(f"ok  diff: relative column ‖a−b‖/‖b‖ ({rel:.3g} for a bias that started at 0); the job lines that differ")

    out = piper_ckpt("verify", ck).stdout
    if out.count("ok ") != 2 or "2 of 2 checkpoints verify" not in out:
        fail(f"verify of a good folder:\n{out}")
    bad = os.path.join(d, "bad")
    os.makedirs(bad)
    shutil.copy(s10, bad)
    damaged = os.path.join(bad, "step_00000020.h5")
    shutil.copy(s20, damaged)
    with open(damaged, "r+b") as f:  # one byte of tensor data, in the middle of the file
        f.seek(os.path.getsize(damaged) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x55]))
    write(bad, "step_00000030.h5", "not a checkpoint\n")
    out = piper_ckpt("verify", bad, want=1).stdout
    if (f"ok    {os.path.join(bad, 'step_00000010.h5')}" not in out or f"FAIL  {damaged}" not in out
            or "step_00000030.h5: not a readable HDF5 file" not in out or "1 of 3 checkpoints verify" not in out):
        fail(f"verify of a folder with planted damage:\n{out}")
    piper_ckpt("verify", damaged, want=1)
    piper_ckpt("diff", s20, damaged, want=2)
    print("ok  verify names each damaged file and exits 1; diff of a damaged file exits 2")

    out = piper_ckpt("meta", s20).stdout
    if "[model]" not in out or "kind=gpt" not in out or "world=1" not in out:
        fail(f"meta lacks the job text, model or layout:\n{out}")
    print("ok  meta prints the job text, model keys and layout")

    # export -> import -> export: bit-identical parameters, GPT-2 names and Conv1D layout
    st = os.path.join(d, "gpt.safetensors")
    piper_ckpt("export", s20, "--to", st)
    tensors, meta = read_st(st)
    if meta.get("format") != "pt" or tensors["transformer.h.0.attn.c_attn.weight"][1] != [32, 96] or \
            "transformer.wte.weight" not in tensors or any(k.startswith("blocks.") for k in tensors):
        fail(f"export: not GPT2LMHeadModel's names and layout: {sorted(tensors)[:5]} {meta}")
    imp = os.path.join(d, "imp", "step_00000000.h5")
    os.makedirs(os.path.dirname(imp))
    piper_ckpt("import", st, "--job", cfg, "--to", imp)
    piper_ckpt("diff", s20, imp, "--only", "params/", want=0)
    if "max 0 " not in piper_ckpt("show", imp, "adam_v/wte", "--stats").stdout:
        fail("import: the optimizer state is not fresh (zeros)")
    st2 = os.path.join(d, "gpt2.safetensors")
    piper_ckpt("export", imp, "--to", st2)
    t2, _ = read_st(st2)
    if t2 != tensors:
        fail("export of the imported checkpoint differs from the first export")
    piper_ckpt("verify", imp)
    print("ok  GPT-2 export -> import -> export is bit-identical; the import verifies, moments are zero")

    # export --dtype bf16: the same tensors, each value rounded to the nearest bfloat16
    st16 = os.path.join(d, "gpt-bf16.safetensors")
    piper_ckpt("export", s20, "--to", st16, "--dtype", "bf16")
    t16, _ = read_st(st16)
    if sorted(t16) != sorted(tensors):
        fail(f"export --dtype bf16 names other tensors: {sorted(t16)[:5]}")
    for name, (dt, shape, raw) in tensors.items():
        if t16[name][0] != "BF16" or t16[name][1] != shape or t16[name][2] != bf16_of_f32(raw):
            fail(f"export --dtype bf16: {name} is {t16[name][0]} {t16[name][1]}, not the float32 export rounded to BF16")
    imp16 = os.path.join(d, "imp16", "step_00000000.h5")
    os.makedirs(os.path.dirname(imp16))
    piper_ckpt("import", st16, "--job", cfg, "--to", imp16)
    if piper_ckpt("diff", s20, imp16, "--only", "params/", "--rtol", "0.004", want=None).returncode != 0:
        fail("the bf16 export imports to parameters further than bf16 rounding (2^-8) from the checkpoint's")
    err = piper_ckpt("export", s20, "--to", os.path.join(d, "x.safetensors"), "--dtype", "fp16", want=2).stderr
    if "--dtype" not in err:
        fail(f"export --dtype fp16: the error does not name --dtype: {err}")
    print("ok  export --dtype bf16 writes the float32 export rounded to nearest-even bfloat16; it imports; fp16 exits 2")

    # the imported checkpoint starts a run from the trained weights
    m = os.path.join(d, "ft.jsonl")
    run(1, cfg, "--resume", imp, "--steps", "3", "--metrics", m, "--set", f'checkpoint.dir="{d}/ft"')
    fresh = os.path.join(d, "fresh.jsonl")
    run(1, cfg, "--steps", "3", "--metrics", fresh, "--set", 'checkpoint.dir=""')
    if not losses(m)[0] < losses(fresh)[0] - 0.3:
        fail(f"a run from the imported weights starts at loss {losses(m)[0]}, a fresh one at {losses(fresh)[0]}")
    print(f"ok  a run resumed from the import starts at loss {losses(m)[0]:.3f} (fresh weights: {losses(fresh)[0]:.3f})")

    # a file of another writer: BF16, another order, the tied lm_head and the causal-mask buffers of HF GPT-2
    hf = os.path.join(d, "hf.safetensors")
    other = [(k.replace("transformer.", ""), "BF16", v[1], to_bf16(v[2])) for k, v in reversed(sorted(tensors.items()))]
    other.append(("lm_head.weight", "BF16", tensors["transformer.wte.weight"][1],
                  to_bf16(tensors["transformer.wte.weight"][2])))
    other.append(("h.0.attn.bias", "F32", [1, 1, 16, 16], struct.pack("<256f", *([1.0] * 256))))
    write_st(hf, other)
    imp2 = os.path.join(d, "imp2.h5")
    piper_ckpt("import", hf, "--job", cfg, "--to", imp2)
    w = [float(x) for line in piper_ckpt("show", imp2, "wte", "--all").stdout.splitlines()[1:] for x in line.split()]
    wte_bf16 = to_bf16(tensors["transformer.wte.weight"][2])
    want_w = floats(b"".join(b"\0\0" + wte_bf16[i:i + 2] for i in range(0, len(wte_bf16), 2)))
    if any(abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(w, want_w)):
        fail("import of a BF16 file: wte is not the BF16 values")
    print("ok  a BF16 file in Hugging Face's GPT-2 layout (no prefix, tied lm_head, mask buffers) imports")

    try:
        import numpy as np
        from safetensors.numpy import save_file
    except ImportError:
        print("skipped (counted): the Python safetensors package is not installed; its files are not tried")
    else:
        pkg = os.path.join(d, "pkg.safetensors")
        save_file({k: np.frombuffer(v[2], dtype="<f4").reshape(v[1]) for k, v in tensors.items()}, pkg)
        imp3 = os.path.join(d, "imp3.h5")
        piper_ckpt("import", pkg, "--job", cfg, "--to", imp3)
        piper_ckpt("diff", s20, imp3, "--only", "params/", want=0)
        print("ok  a file written by the safetensors package imports bit-identically")

    # Qwen3 (tied embeddings): names are already Hugging Face's
    qck = os.path.join(d, "qck")
    qcfg = write(d, "q.toml", tiny_qwen3(steps=4, tied=True) + f'\n[checkpoint]\ndir = "{qck}"\nevery = 4\n')
    run(1, qcfg)
    qs = os.path.join(qck, "step_00000004.h5")
    qst = os.path.join(d, "q.safetensors")
    piper_ckpt("export", qs, "--to", qst)
    qt, _ = read_st(qst)
    if "model.layers.0.self_attn.q_proj.weight" not in qt or "lm_head.weight" in qt:
        fail(f"Qwen3 export names: {sorted(qt)[:6]}")
    qimp = os.path.join(d, "qimp.h5")
    piper_ckpt("import", qst, "--job", qcfg, "--to", qimp)
    piper_ckpt("diff", qs, qimp, "--only", "params/", want=0)
    print("ok  Qwen3 export -> import is bit-identical")

    # bad input: exit 2 and a message naming the file or what is wrong
    small = write(d, "small.toml", tiny_gpt(steps=20).replace("d_model = 32", "d_model = 16"))
    p = piper_ckpt("import", st, "--job", small, "--to", os.path.join(d, "x.h5"), want=2)
    if "shape" not in p.stderr or "gpt.safetensors" not in p.stderr:
        fail(f"import into another model: {p.stderr}")
    if os.path.exists(os.path.join(d, "x.h5")) or any(n.startswith(".x.h5") for n in os.listdir(d)):
        fail("a refused import left a file behind")
    p = piper_ckpt("import", st, "--job", cfg, "--to", imp, want=2)
    if "exists" not in p.stderr:
        fail(f"import over an existing file: {p.stderr}")
    trunc = os.path.join(d, "trunc.safetensors")
    with open(st, "rb") as f, open(trunc, "wb") as g:
        g.write(f.read(os.path.getsize(st) // 2))
    p = piper_ckpt("import", trunc, "--job", cfg, "--to", os.path.join(d, "y.h5"), want=2)
    if "trunc.safetensors" not in p.stderr:
        fail(f"truncated safetensors: {p.stderr}")
    for args in (["show", s20, "nope"], ["ls", os.path.join(d, "missing.h5")], ["verify", os.path.join(d, "nothing")],
                 ["diff", s20], ["frobnicate"], ["show", s20, "wte", "--slice", "9:300"],
                 ["diff", s10, s20, "--rtol", "x"]):
        p = piper_ckpt(*args, want=2)
        if "piper-ckpt: error:" not in p.stderr:
            fail(f"piper-ckpt {' '.join(args)}: no error message: {p.stderr}")
    print("ok  bad input (another model's shape, an existing target, a truncated file, unknown names) exits 2")


if __name__ == "__main__":
    main()
