#!/usr/bin/env python3
# Checks that a Piper checkpoint of model.kind = "qwen3" loads as-is into Hugging Face transformers'
# Qwen3ForCausalLM and that HF computes the same loss as Piper on the same (sequential) batch.
"""Usage:

  tools/hf-qwen3-check.py CHECKPOINT.h5 --metrics METRICS.jsonl [--step N] [--rtol 1e-5]
  tools/hf-qwen3-check.py CHECKPOINT.h5 --loss 4.00205931 [--step N]

The model and data settings come from the job text stored in the checkpoint (root attribute `job`, with
its `# --set` lines applied); `--config job.toml` is read instead when that attribute is missing.

N is Piper's step number as printed and written to the metrics file (1-based): its loss is that of the
batch of 0-based step N-1 under the weights before that step's update. The default, the checkpoint's
`step` attribute + 1, is the first step after the checkpoint, computed with exactly the saved weights.
Only `data.sampler = "sequential"` batches can be rebuilt here.

Needs torch, transformers (5.x: rope_parameters), h5py and numpy. Exit status: 0 when the relative
difference is at most --rtol, 1 when above, 2 on any other error.
"""
import argparse
import json
import os
import sys
import tomllib

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM


class CheckError(Exception):
    pass


def apply_set_line(job, arg):
    """Applies one `--set a.b.c=value` as Piper does: the value is TOML, or a bare string if it is not."""
    key, sep, text = arg.partition("=")
    if not sep or not key:
        raise CheckError(f"cannot apply '# --set {arg}' from the job text")
    try:
        value = tomllib.loads("v = " + text)["v"]
    except tomllib.TOMLDecodeError:
        value = text
    parts = key.split(".")
    node = job
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def read_job(ckpt_attrs, config_path):
    """The job as a dict: the checkpoint's `job` attribute (with its `# --set` lines), else --config."""
    if "job" in ckpt_attrs:
        text = ckpt_attrs["job"]
        if isinstance(text, bytes):
            text = text.decode()
        source = "the checkpoint's job attribute"
    elif config_path:
        with open(config_path) as f:
            text = f.read()
        source = config_path
    else:
        raise CheckError("the checkpoint has no `job` attribute; give the job file with --config")
    job = tomllib.loads(text)
    for line in text.splitlines():
        if line.startswith("# --set "):
            apply_set_line(job, line[len("# --set "):])
    return job, source


def qwen3_config(model, tied):
    """A transformers Qwen3Config from Piper's [model] keys, with Piper's defaults for absent keys."""
    if model.get("kind") != "qwen3":
        raise CheckError(f"model.kind = {model.get('kind')!r}: this tool checks qwen3 checkpoints only")
    if not model.get("qk_norm", True):
        raise CheckError("qk_norm = false: Qwen3ForCausalLM always normalizes q and k; no HF equivalent")
    n_heads = model.get("n_heads", 8)
    d_model = model.get("d_model", 256)
    return Qwen3Config(
        vocab_size=model.get("vocab", 256),
        hidden_size=d_model,
        intermediate_size=model.get("d_ff", 1024),
        num_hidden_layers=model.get("n_layers", 4),
        num_attention_heads=n_heads,
        num_key_value_heads=model.get("n_kv_heads", n_heads),
        head_dim=model.get("head_dim", d_model // n_heads),
        max_position_embeddings=model.get("seq_len", 128),
        rms_norm_eps=model.get("norm_eps", 1e-6),
        rope_parameters={"rope_type": "default", "rope_theta": float(model.get("rope_theta", 1e6))},
        tie_word_embeddings=tied,
        attention_bias=False,
        use_sliding_window=False,
        hidden_act="silu",
        attention_dropout=0.0,
    )


def load_model(ckpt, job):
    """Qwen3ForCausalLM in fp32 with the checkpoint's /params loaded; raises on any name or shape mismatch."""
    state = {name: torch.from_numpy(ckpt["params"][name][...]) for name in ckpt["params"]}
    tied = "lm_head.weight" not in state
    if tied != bool(job["model"].get("tie_embeddings", False)):
        raise CheckError(f"lm_head.weight is {'absent' if tied else 'present'} but the job says "
                         f"tie_embeddings = {job['model'].get('tie_embeddings', False)}")
    config = qwen3_config(job["model"], tied)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager", dtype=torch.float32)
    # Tied: lm_head.weight is the embedding, so it is the one key the checkpoint lacks; else load strictly.
    # (Strict loading raises on a missing or unexpected name; both modes raise on a shape mismatch.)
    try:
        result = model.load_state_dict(state, strict=not tied)
    except RuntimeError as e:
        raise CheckError(f"the checkpoint does not load into Qwen3ForCausalLM: {e}") from None
    missing = [k for k in result.missing_keys if not (tied and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise CheckError(f"state dict mismatch: missing {missing}, unexpected {result.unexpected_keys}")
    if tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise CheckError("tie_word_embeddings = True but lm_head.weight is not the embedding")
    model.eval()
    return model, config, len(state)


def read_tokens(path, token_bytes):
    """The data file's token ids, read as Piper does: by data.token_bytes, else by the file name."""
    if token_bytes == 0:
        token_bytes = 4 if path.endswith(".u32.bin") else 2 if path.endswith(".bin") else 1
    dtype = {1: np.uint8, 2: np.dtype("<u2"), 4: np.dtype("<u4")}[token_bytes]
    n = os.path.getsize(path) // token_bytes  # a partial last token is ignored, as in Piper
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def sequential_batch(tokens, data_step, batch, seq_len):
    """Inputs and targets (batch, seq_len) of 0-based step data_step, as src/data/data.cpp builds them."""
    span = len(tokens) - seq_len
    inputs = np.empty((batch, seq_len), dtype=np.int64)
    targets = np.empty((batch, seq_len), dtype=np.int64)
    for i in range(batch):
        start = ((data_step * batch + i) * seq_len) % span
        inputs[i] = tokens[start:start + seq_len]
        targets[i] = tokens[start + 1:start + seq_len + 1]
    return torch.from_numpy(inputs), torch.from_numpy(targets)


def piper_loss(metrics_path, step):
    with open(metrics_path) as f:
        for line in f:
            if line.strip():
                m = json.loads(line)
                if m["step"] == step:
                    return m["loss"]
    raise CheckError(f"{metrics_path}: no line with \"step\": {step}")


def main():
    ap = argparse.ArgumentParser(description="Compare a Piper qwen3 checkpoint's loss under HF transformers "
                                             "with the loss Piper computed.")
    ap.add_argument("checkpoint", help="a Piper checkpoint, e.g. runs/x/step_00000010.h5")
    ap.add_argument("--config", help="the job file, used when the checkpoint has no `job` attribute")
    ap.add_argument("--data", help="the data file (default: data.path of the job, relative to the cwd)")
    ap.add_argument("--step", type=int, help="Piper's 1-based step number (metrics \"step\"); "
                                             "default: the checkpoint's step + 1")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--loss", type=float, help="Piper's loss for that step")
    src.add_argument("--metrics", help="a Piper --metrics file to read that step's loss from")
    ap.add_argument("--rtol", type=float, default=1e-5, help="largest relative difference accepted (1e-5)")
    args = ap.parse_args()

    with h5py.File(args.checkpoint, "r") as ckpt:
        attrs = dict(ckpt.attrs)
        job, job_source = read_job(attrs, args.config)
        model, config, n_tensors = load_model(ckpt, job)
    ckpt_step = int(attrs.get("step", 0))
    step = args.step if args.step is not None else ckpt_step + 1
    data = job.get("data", {})
    if data.get("sampler", "random") != "sequential":
        raise CheckError(f"data.sampler = {data.get('sampler', 'random')!r}: only \"sequential\" batches "
                         f"can be rebuilt here")
    data_path = args.data or data.get("path")
    if not data_path:
        raise CheckError("no data.path in the job; give --data")
    seq_len, batch = config.max_position_embeddings, int(data.get("batch", 16))
    tokens = read_tokens(data_path, int(data.get("token_bytes", 0)))
    inputs, targets = sequential_batch(tokens, step - 1, batch, seq_len)

    with torch.no_grad():
        logits = model(input_ids=inputs).logits  # (batch, seq_len, vocab), fp32
    # Piper's targets are the next tokens of the same window: no shift inside the sequence, no ignored labels.
    hf = F.cross_entropy(logits.reshape(-1, config.vocab_size).double(), targets.reshape(-1)).item()
    ref = args.loss if args.loss is not None else piper_loss(args.metrics, step)
    rel = abs(hf - ref) / max(abs(ref), 1e-12)

    print(f"checkpoint   {args.checkpoint} (step {ckpt_step}, {n_tensors} tensors, "
          f"{'tied' if config.tie_word_embeddings else 'untied'} embeddings; job from {job_source})")
    print(f"versions     torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"batch        step {step} (0-based data step {step - 1}): {batch} x {seq_len} tokens of {data_path}")
    if step - 1 != ckpt_step:
        print(f"note         step {step} did not run with these weights (they are those before step "
              f"{ckpt_step + 1}); expect a mismatch")
    print(f"piper loss   {ref:.9g}")
    print(f"hf loss      {hf:.9g}")
    print(f"rel diff     {rel:.3e} ({'ok' if rel <= args.rtol else 'ABOVE'} rtol {args.rtol:g})")
    return 0 if rel <= args.rtol else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (CheckError, OSError, KeyError, tomllib.TOMLDecodeError) as e:
        print(f"hf-qwen3-check: error: {e}", file=sys.stderr)
        sys.exit(2)
