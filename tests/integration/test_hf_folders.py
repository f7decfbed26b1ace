"""piper-ckpt export --to DIR writes a Hugging Face model folder: config.json with every key transformers reads,
taken from the checkpoint's own model keys (GPT2LMHeadModel for GPT-2, Qwen3MoeForCausalLM here for Qwen3 with
experts), and model.safetensors, or past --max-shard-size numbered shards with model.safetensors.index.json that
lists each tensor once. It never replaces an existing file or folder, and a family transformers has no class for
is refused (exit 2). Where an interpreter has transformers (TRANSFORMERS_PYTHON names one), from_pretrained on the
folder alone loads every tensor (nothing missing or unexpected) with piper's parameter count."""
import json
import os
import subprocess
import sys

from common import fail, piper_ckpt, run, tempdir, tiny_gpt, tiny_qwen3_moe, write

LOAD = """
import json, sys
from transformers import AutoModelForCausalLM
m, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
print(json.dumps({"class": type(m).__name__, "params": sum(p.numel() for p in m.parameters()),
                  "problems": {k: list(v) for k, v in info.items() if v}}))
"""


def checkpoint(d, name, text):
    ck = os.path.join(d, name)
    run(1, write(d, f"{name}.toml", text + f'\n[checkpoint]\ndir = "{ck}"\nevery = 2\n'), "--steps", "2")
    return os.path.join(ck, "step_00000002.h5")


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
    mlp = checkpoint(d, "mlp", """
[job]
name = "mlp"
steps = 2
threads = 1

[model]
kind = "mlp"
d_in = 8
d_hidden = 16
n_layers = 2
n_classes = 4

[data]
batch = 8
""")
    p = piper_ckpt("export", mlp, "--to", os.path.join(d, "mlp-hf"), want=2)
    if "no Hugging Face model class" not in p.stderr or os.path.exists(os.path.join(d, "mlp-hf")):
        fail(f"export of an mlp to a folder: {p.stderr}")
    print("ok  export never replaces a folder or file; a family without a transformers class is refused, nothing written")

    pythons = [os.environ.get("TRANSFORMERS_PYTHON"), sys.executable, "/usr/bin/python3"]
    python = next((p for p in pythons if p and os.path.exists(p) and subprocess.run(
        [p, "-c", "import transformers, torch"], capture_output=True).returncode == 0), None)
    if python is None:
        print("ok  from_pretrained: skipped, no interpreter here has transformers and torch")
        return
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


if __name__ == "__main__":
    main()
