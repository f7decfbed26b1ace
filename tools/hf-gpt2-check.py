#!/usr/bin/env python3
# Checks `piper-ckpt export` against Hugging Face transformers: a GPT-2 checkpoint exported to safetensors
# loads into GPT2LMHeadModel with from_pretrained and gives the loss Piper computed on the same batch.
"""Usage:

  tools/hf-gpt2-check.py CHECKPOINT.h5 --metrics METRICS.jsonl [--piper-ckpt build/piper-ckpt] [--rtol 1e-5]

The job (model keys, data file, batch) comes from the checkpoint's `job` attribute; its data.sampler must
be "sequential" so that the batch can be rebuilt here. The loss compared is that of the first step after
the checkpoint (metrics step = the checkpoint's step + 1), computed by Piper with exactly the saved weights.
The export goes to a temporary folder as model.safetensors next to a config.json; from_pretrained must
report no missing, unexpected or mismatched tensor.

Needs torch, transformers, h5py and numpy. Exit status: 0 when the relative difference is at most --rtol,
1 when above, 2 on any other error.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import h5py
import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

_spec = importlib.util.spec_from_file_location("hf_qwen3_check", os.path.join(os.path.dirname(__file__),
                                                                              "hf-qwen3-check.py"))
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)  # read_job, read_tokens, sequential_batch, piper_metrics, CheckError


def main():
    ap = argparse.ArgumentParser(description="Load a piper-ckpt GPT-2 export into GPT2LMHeadModel and compare "
                                             "its loss with Piper's.")
    ap.add_argument("checkpoint")
    ap.add_argument("--metrics", required=True, help="the run's --metrics file")
    ap.add_argument("--piper-ckpt", default=os.path.join("build", "piper-ckpt"))
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()

    with h5py.File(args.checkpoint, "r") as f:
        attrs = dict(f.attrs)
    job, _ = common.read_job(attrs, None)
    m, data = job["model"], job.get("data", {})
    if m.get("kind") != "gpt":
        raise common.CheckError(f"model.kind = {m.get('kind')!r}: this check is for \"gpt\"")
    if data.get("sampler", "random") != "sequential":
        raise common.CheckError("data.sampler must be \"sequential\" for the batch to be rebuilt here")
    C = int(m.get("d_model", 256))
    config = GPT2Config(vocab_size=int(m.get("vocab", 256)), n_positions=int(m.get("seq_len", 128)), n_embd=C,
                        n_layer=int(m.get("n_layers", 4)), n_head=int(m.get("n_heads", 8)),
                        n_inner=int(m.get("d_ff", 4 * C)), activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                        bos_token_id=None, eos_token_id=None)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([args.piper_ckpt, "export", args.checkpoint, "--to", os.path.join(d, "model.safetensors")],
                       check=True, stdout=subprocess.DEVNULL)
        config.save_pretrained(d)
        model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True, attn_implementation="eager")
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise common.CheckError(f"from_pretrained reported {problems}")
    model.eval()
    step = int(attrs["step"]) + 1
    tokens = common.read_tokens(data["path"], int(data.get("token_bytes", 0)))
    inputs, targets = common.sequential_batch(tokens, step - 1, int(data.get("batch", 16)), config.n_positions)
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.double()
    hf = F.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1)).item()
    ref = common.piper_metrics(args.metrics, step)["loss"]
    rel = abs(hf - ref) / abs(ref)
    print(f"checkpoint  {args.checkpoint} (step {step - 1}); torch {torch.__version__}, transformers "
          f"{transformers.__version__}")
    print(f"loaded      GPT2LMHeadModel.from_pretrained of the piper-ckpt export: no missing, unexpected or "
          f"mismatched tensors")
    print(f"piper loss  {ref:.9g} (step {step})")
    print(f"hf loss     {hf:.9g}")
    print(f"rel diff    {rel:.3e} ({'ok' if rel <= args.rtol else 'ABOVE'} rtol {args.rtol:g})")
    return 0 if rel <= args.rtol else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (common.CheckError, OSError, KeyError, subprocess.CalledProcessError) as e:
        print(f"hf-gpt2-check: error: {e}", file=sys.stderr)
        sys.exit(2)
