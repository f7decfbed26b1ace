"""piper-ckpt export --to DIR writes a Hugging Face model folder: config.json with every key transformers reads,
taken from the checkpoint's own model keys (GPT2LMHeadModel for GPT-2, Qwen3MoeForCausalLM here for Qwen3 with
experts), and model.safetensors, or past --max-shard-size numbered shards with model.safetensors.index.json that
lists each tensor once. It never replaces an existing file or folder, and a family transformers has no class for
is refused (exit 2). Where an interpreter has transformers (TRANSFORMERS_PYTHON names one), from_pretrained on the
folder alone loads every tensor (nothing missing or unexpected) with piper's parameter count. import takes such a
folder back (a file, or shards through their index) bit for bit, and refuses a --set that contradicts config.json,
naming the key; with transformers, a model it builds and saves goes through import, two steps of training and export
into a folder that from_pretrained loads alone (Qwen3 and Qwen3-MoE)."""
import json
import os
import subprocess

from common import (checkpoint, fail, piper_ckpt, python_with, run, tempdir, tiny_gpt, tiny_mlp, tiny_qwen3,
                    tiny_qwen3_moe, write)

LOAD = """
import json, sys
from transformers import AutoModelForCausalLM
m, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
print(json.dumps({"class": type(m).__name__, "params": sum(p.numel() for p in m.parameters()),
                  "problems": {k: list(v) for k, v in info.items() if v}}))
"""


def model_keys(ckpt):
    line = next(l for l in piper_ckpt("meta", ckpt).stdout.splitlines() if l.startswith("model "))
    return dict(w.split("=", 1) for w in line.split()[1:])


def main():
    d = tempdir()
    gpt = checkpoint(d, "gpt", tiny_gpt(steps=2))
    moe = checkpoint(d, "moe", tiny_qwen3_moe())
    folders = {}
    for name, ckpt, shard in (("gpt", gpt, "5GB"), ("moe", moe, "100KB")):
        folder = os.path.join(d, f"{name}-hf")
        piper_ckpt("export", ckpt, "--to", folder, "--max-shard-size", shard)
        config = json.load(open(os.path.join(folder, "config.json")))
        m = model_keys(ckpt)
        if name == "gpt":
            want = {"architectures": ["GPT2LMHeadModel"], "n_embd": int(m["d_model"]), "n_layer": int(m["n_layers"]),
                    "n_head": int(m["n_heads"]), "n_inner": int(m["d_ff"]), "vocab_size": int(m["vocab"]),
                    "n_positions": int(m["seq_len"]), "activation_function": "gelu_new"}
        else:
            want = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": int(m["d_model"]),
                    "num_key_value_heads": int(m["n_kv_heads"]), "head_dim": int(m["head_dim"]),
                    "num_experts": int(m["moe.experts"]), "num_experts_per_tok": int(m["moe.top_k"]),
                    "moe_intermediate_size": int(m["moe.d_expert"]), "decoder_sparse_step": int(m["moe.every"]),
                    "norm_topk_prob": m["moe.norm_topk_prob"] == "true", "rope_theta": float(m["rope_theta"]),
                    "tie_word_embeddings": m["tie_embeddings"] == "true", "rms_norm_eps": float(m["norm_eps"])}
        wrong = {k: (config.get(k), v) for k, v in want.items() if config.get(k) != v}
        if wrong:
            fail(f"{name}: config.json differs from the model keys (got, want): {wrong}")
        files = sorted(os.listdir(folder))
        if name == "moe":
            index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
            shards = sorted(f for f in files if f.startswith("model-"))
            sizes = sum(os.path.getsize(os.path.join(folder, f)) for f in shards)
            if (len(shards) < 2 or sorted(set(index["weight_map"].values())) != shards
                    or not 0 < index["metadata"]["total_size"] < sizes):
                fail(f"moe: shards {shards} against the index {index['metadata']}, {len(index['weight_map'])} tensors")
            print(f"ok  moe: config.json from the model keys; {len(shards)} shards of at most 100KB, "
                  f"{len(index['weight_map'])} tensors in the index")
        elif files != ["config.json", "model.safetensors"]:
            fail(f"gpt: the folder holds {files}")
        else:
            print("ok  gpt: config.json from the model keys and one model.safetensors")
        folders[name] = folder

    for target in (folders["gpt"], os.path.join(folders["gpt"], "model.safetensors")):
        p = piper_ckpt("export", gpt, "--to", target, want=2)
        if "exists already" not in p.stderr:
            fail(f"export over {target}: {p.stderr}")
    mlp = checkpoint(d, "mlp", tiny_mlp())
    p = piper_ckpt("export", mlp, "--to", os.path.join(d, "mlp-hf"), want=2)
    if "no Hugging Face model class" not in p.stderr or os.path.exists(os.path.join(d, "mlp-hf")):
        fail(f"export of an mlp to a folder: {p.stderr}")
    print("ok  export never replaces a folder or file; a family without a transformers class is refused, "
          "nothing written")

    # import takes the folder back (one file, or the shards through their index): the same parameters to the bit;
    # a --set that contradicts config.json is named and refused
    for name, ckpt, job in (("gpt", gpt, tiny_gpt(steps=2)), ("moe", moe, tiny_qwen3_moe())):
        cfg = write(d, f"{name}-import.toml", job)
        for source in ([folders[name]] + ([os.path.join(folders[name], "model.safetensors.index.json")]
                                          if name == "moe" else [])):
            out = os.path.join(d, f"{name}-{len(os.listdir(d))}.h5")
            piper_ckpt("import", source, "--job", cfg, "--to", out)
            piper_ckpt("diff", ckpt, out, "--only", "params/", want=0)
    p = piper_ckpt("import", folders["moe"], "--job", write(d, "moe-import.toml", tiny_qwen3_moe()), "--set",
                   "model.rope_theta=1e6", "--to", os.path.join(d, "never.h5"), want=2)
    if "rope_theta = 10000.0 but the job's model has 1000000.0 (model.rope_theta)" not in p.stderr \
            or os.path.exists(os.path.join(d, "never.h5")):
        fail(f"import with a --set that contradicts config.json: {p.stderr}")
    print("ok  import of the folders (file, shards through the index) gives the parameters back to the bit; "
          "a --set contradicting config.json is named and refused")

    python = python_with("TRANSFORMERS_PYTHON", "transformers, torch")
    if python is None:
        print("ok  from_pretrained: skipped, no interpreter here has transformers and torch")
        return
    round_trip(d, python)
    for name, ckpt in (("gpt", gpt), ("moe", moe)):
        r = subprocess.run([python, "-c", LOAD, folders[name]], capture_output=True, text=True, timeout=300)
        got = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
        line = next(l for l in run(1, write(d, f"{name}-count.toml", (tiny_gpt(steps=1) if name == "gpt" else
                                                                       tiny_qwen3_moe())), "--steps", "1").stdout
                    .splitlines() if l.startswith("model: "))
        piper_params = int(line.split()[1])
        if r.returncode != 0 or got["problems"] or got["params"] != piper_params:
            fail(f"{name}: from_pretrained(folder) gave {got or r.stderr[-2000:]}; piper has {piper_params} parameters")
        print(f"ok  {name}: from_pretrained(folder) alone loads {got['class']}, every tensor, {got['params']} "
              f"parameters as piper")


def round_trip(d, python):
    """A model transformers builds and saves (Qwen3 and Qwen3-MoE), imported from its folder alone, trained two
    steps, exported to a folder, and loaded by from_pretrained with nothing else: every tensor, piper's count."""
    for name, job, cls, extra in (
            ("qwen3", tiny_qwen3(steps=2, layers=2, tied=True), "Qwen3", ""),
            ("qwen3-moe", tiny_qwen3_moe(layers=2).replace("tie_embeddings = false", "tie_embeddings = true"),
             "Qwen3Moe",
             ", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, decoder_sparse_step=1, "
             "norm_topk_prob=True")):
        saved = os.path.join(d, f"{name}-saved")
        make = (f"import torch\nfrom transformers import {cls}Config, {cls}ForCausalLM\ntorch.manual_seed(0)\n"
                f"c = {cls}Config(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, "
                f"num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, "
                f"rms_norm_eps=1e-6, tie_word_embeddings=True{extra})\n"
                f"{cls}ForCausalLM(c).save_pretrained({saved!r})\n")
        subprocess.run([python, "-c", make], check=True, capture_output=True, timeout=300)
        cfg = write(d, f"{name}-rt.toml", job + f'\n[checkpoint]\ndir = "{os.path.join(d, name + "-rt")}"\nevery = 2\n')
        start = os.path.join(d, f"{name}-rt", "step_00000000.h5")
        piper_ckpt("import", saved, "--job", cfg, "--set", "model.norm_eps=1e-6", "--to", start)
        run(1, cfg, "--set", "model.norm_eps=1e-6", "--resume", start)
        out = os.path.join(d, f"{name}-trained-hf")
        piper_ckpt("export", os.path.join(d, f"{name}-rt", "step_00000002.h5"), "--to", out)
        r = subprocess.run([python, "-c", LOAD, out], capture_output=True, text=True, timeout=300)
        got = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
        if r.returncode != 0 or got["problems"] or not got["class"].startswith(cls):
            fail(f"{name}: the trained export did not load alone: {got or r.stderr[-2000:]}")
        print(f"ok  {name}: transformers' save_pretrained -> import -> 2 steps -> export -> from_pretrained alone "
              f"({got['class']}, {got['params']} parameters)")


if __name__ == "__main__":
    main()
