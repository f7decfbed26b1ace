#!/usr/bin/env python3
# Checks that a Piper checkpoint of model.kind = "qwen3" loads into Hugging Face transformers'
# Qwen3ForCausalLM (Qwen3MoeForCausalLM with [model.moe]) and that HF computes the same loss as Piper on the
# same (sequential) batch.
"""Usage:

  tools/hf-qwen3-check.py CHECKPOINT.h5 --metrics METRICS.jsonl [--step N] [--rtol 1e-5] [--from-pretrained]
  tools/hf-qwen3-check.py CHECKPOINT.h5 --loss 4.00205931 [--step N]

The model and data settings come from the job text stored in the checkpoint (root attribute `job`, with
its `# --set` lines applied); `--config job.toml` is read instead when that attribute is missing.

N is Piper's step number as printed and written to the metrics file (1-based): its loss is that of the
batch of 0-based step N-1 under the weights before that step's update. The default, the checkpoint's
`step` attribute + 1, is the first step after the checkpoint, computed with exactly the saved weights.
Only `data.sampler = "sequential"` batches can be rebuilt here.

With [model.moe] the model is Qwen3MoeForCausalLM (dropless, so capacity_factor > 0 is refused) and the
number compared is Piper's cross-entropy: the metrics field `xent` (`loss` less `balance_loss`, Piper's
sequence-wise balance loss, which is not HF's router aux loss), or --loss given as that xent. transformers 5
holds a layer's experts fused (`mlp.experts.gate_up_proj` (E, 2*DE, C), gate rows first, and
`mlp.experts.down_proj` (E, C, DE)), which load_state_dict does not accept under the per-expert names Piper
stores, so the tool stacks them into that layout. --from-pretrained instead writes the checkpoint's tensors,
under Piper's names, as model.safetensors with config.json to a temporary folder and loads it with
from_pretrained, whose conversion does the fusing (also for dense jobs); missing, unexpected or mismatched
names are errors there too.

Needs torch, transformers (5.x: rope_parameters), h5py and numpy. Exit status: 0 when the relative
difference is at most --rtol, 1 when above, 2 on any other error.
"""
import argparse
import json
import os
import re
import sys
import tomllib

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM


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


def moe_keys(model):
    """Piper's [model.moe] keys with Piper's defaults, or None for a dense job."""
    moe = model.get("moe")
    if moe is None:
        return None
    m = {"experts": moe.get("experts", 8), "top_k": moe.get("top_k", 2),
         "d_expert": moe.get("d_expert", model.get("d_ff", 1024)), "every": moe.get("every", 1),
         "norm_topk_prob": moe.get("norm_topk_prob", True), "capacity_factor": moe.get("capacity_factor", 0.0)}
    if m["capacity_factor"] > 0:
        raise CheckError(f"model.moe.capacity_factor = {m['capacity_factor']:g}: Piper drops the tokens over an "
                         f"expert's capacity, Qwen3MoeForCausalLM never does (dropless); only capacity_factor = 0 "
                         f"can be compared")
    return m


def is_moe_layer(moe, layer):
    """Piper's rule: layer i's MLP is a mixture of experts when (i + 1) % every == 0."""
    return moe is not None and (layer + 1) % moe["every"] == 0


def qwen3_config(model, tied):
    """A transformers Qwen3Config (Qwen3MoeConfig with [model.moe]) from Piper's [model] keys, with Piper's
    defaults for absent keys."""
    if model.get("kind") != "qwen3":
        raise CheckError(f"model.kind = {model.get('kind')!r}: this tool checks qwen3 checkpoints only")
    if not model.get("qk_norm", True):
        raise CheckError("qk_norm = false: Qwen3ForCausalLM always normalizes q and k; no HF equivalent")
    n_heads = model.get("n_heads", 8)
    d_model = model.get("d_model", 256)
    common = dict(
        vocab_size=model.get("vocab", 256),
        hidden_size=d_model,
        intermediate_size=model.get("d_ff", 1024),  # the dense layers' width
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
    moe = moe_keys(model)
    if moe is None:
        return Qwen3Config(**common)
    # decoder_sparse_step = every with no mlp_only_layers is exactly Piper's (i + 1) % every == 0.
    return Qwen3MoeConfig(**common, num_experts=moe["experts"], num_experts_per_tok=moe["top_k"],
                          moe_intermediate_size=moe["d_expert"], decoder_sparse_step=moe["every"],
                          mlp_only_layers=[], norm_topk_prob=moe["norm_topk_prob"], output_router_logits=False)


EXPERT_NAME = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fuse_experts(state, expected):
    """Piper's per-expert tensors stacked into the fused layout of the model's state dict `expected`
    (name -> tensor): `{p}gate_up_proj` (E, 2*DE, C) = per expert [gate_proj; up_proj] and `{p}down_proj`
    (E, C, DE). A model that keeps per-expert names gets them as they are. Raises on a gap or a stray name."""
    per_layer = {}
    out = {}
    for name, t in state.items():
        m = EXPERT_NAME.match(name)
        if m and m.group(1) + "gate_up_proj" in expected:
            per_layer.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[name] = t
    for prefix, tensors in per_layer.items():
        n = expected[prefix + "gate_up_proj"].shape[0]
        want = {(e, w) for e in range(n) for w in ("gate_proj", "up_proj", "down_proj")}
        if set(tensors) != want:
            odd = sorted(f"{prefix}{e}.{w}.weight" for e, w in set(tensors) ^ want)
            raise CheckError(f"the experts of {prefix[:-1]} do not match the model's {n}: {odd[:6]}")
        out[prefix + "gate_up_proj"] = torch.stack(
            [torch.cat([tensors[(e, "gate_proj")], tensors[(e, "up_proj")]], dim=0) for e in range(n)])
        out[prefix + "down_proj"] = torch.stack([tensors[(e, "down_proj")] for e in range(n)])
    return out, len(per_layer)


def check_layers(model, moe):
    """Each decoder layer is sparse exactly where Piper's every puts a mixture of experts."""
    for i, layer in enumerate(model.model.layers):
        sparse = hasattr(layer.mlp, "experts")
        if sparse != is_moe_layer(moe, i):
            raise CheckError(f"layer {i}: transformers built a {'sparse' if sparse else 'dense'} MLP where Piper "
                             f"has a {'mixture of experts' if not sparse else 'dense MLP'}")


def load_model(ckpt, job, from_pretrained=False):
    """Qwen3ForCausalLM (Qwen3MoeForCausalLM with [model.moe]) in fp32 with the checkpoint's /params loaded;
    raises on any name or shape mismatch. Returns the model, its config, the number of tensors and how the
    experts were loaded."""
    state = {name: torch.from_numpy(ckpt["params"][name][...]) for name in ckpt["params"]}
    tied = "lm_head.weight" not in state
    if tied != bool(job["model"].get("tie_embeddings", False)):
        raise CheckError(f"lm_head.weight is {'absent' if tied else 'present'} but the job says "
                         f"tie_embeddings = {job['model'].get('tie_embeddings', False)}")
    config = qwen3_config(job["model"], tied)
    moe = moe_keys(job["model"])
    cls = Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM
    impl = {"attn_implementation": "eager", "dtype": torch.float32}
    if moe:
        impl["experts_implementation"] = "eager"  # the per-expert loop, not grouped_mm
    how = None
    if from_pretrained:
        model, how = load_via_pretrained(cls, config, state, impl)
    else:
        model = cls._from_config(config, **impl)
        expected = model.state_dict()
        state_in, n_fused = fuse_experts(state, expected) if moe else (state, 0)
        if moe:
            how = (f"per-expert tensors stacked into mlp.experts.gate_up_proj / down_proj for {n_fused} layers, "
                   f"load_state_dict" if n_fused else "per-expert names, load_state_dict")
        # Tied: lm_head.weight is the embedding, so it is the one key the checkpoint lacks; else load strictly.
        # (Strict loading raises on a missing or unexpected name; both modes raise on a shape mismatch.)
        try:
            result = model.load_state_dict(state_in, strict=not tied)
        except RuntimeError as e:
            raise CheckError(f"the checkpoint does not load into {cls.__name__}: {e}") from None
        missing = [k for k in result.missing_keys if not (tied and k == "lm_head.weight")]
        if missing or result.unexpected_keys:
            raise CheckError(f"state dict mismatch: missing {missing}, unexpected {result.unexpected_keys}")
    if tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise CheckError("tie_word_embeddings = True but lm_head.weight is not the embedding")
    check_layers(model, moe)
    model.eval()
    return model, config, len(state), how


def load_via_pretrained(cls, config, state, impl):
    """from_pretrained on a temporary folder holding config.json and model.safetensors under Piper's names."""
    import tempfile
    from safetensors.torch import save_file
    with tempfile.TemporaryDirectory(prefix="hf-qwen3-check-") as d:
        config.save_pretrained(d)
        save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
        model, info = cls.from_pretrained(d, output_loading_info=True, **impl)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise CheckError(f"from_pretrained does not load the checkpoint cleanly: {bad}")
    return model, ("from_pretrained on a temporary safetensors folder under Piper's names"
                   + (" (transformers fuses the experts)" if config.model_type == "qwen3_moe" else ""))


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


def piper_metrics(metrics_path, step):
    """The metrics line of that step, as a dict."""
    with open(metrics_path) as f:
        for line in f:
            if line.strip():
                m = json.loads(line)
                if m["step"] == step:
                    return m
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
    src.add_argument("--loss", type=float, help="Piper's loss for that step ([model.moe]: its xent, the loss "
                                                "less the balance loss)")
    src.add_argument("--metrics", help="a Piper --metrics file to read that step's loss from")
    ap.add_argument("--rtol", type=float, default=1e-5, help="largest relative difference accepted (1e-5)")
    ap.add_argument("--from-pretrained", action="store_true",
                    help="load with from_pretrained from a temporary safetensors folder under Piper's names "
                         "(transformers' own conversion) instead of load_state_dict")
    args = ap.parse_args()

    with h5py.File(args.checkpoint, "r") as ckpt:
        attrs = dict(ckpt.attrs)
        job, job_source = read_job(attrs, args.config)
        model, config, n_tensors, how = load_model(ckpt, job, args.from_pretrained)
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
    moe = moe_keys(job["model"])
    field = "xent" if moe else "loss"
    metrics = piper_metrics(args.metrics, step) if args.loss is None else None
    if metrics is not None and field not in metrics:
        raise CheckError(f"{args.metrics}: the line of step {step} has no \"{field}\" (a [model.moe] job's "
                         f"metrics have loss, xent and balance_loss)")
    ref = args.loss if args.loss is not None else metrics[field]
    rel = abs(hf - ref) / max(abs(ref), 1e-12)

    print(f"checkpoint   {args.checkpoint} (step {ckpt_step}, {n_tensors} tensors, "
          f"{'tied' if config.tie_word_embeddings else 'untied'} embeddings; job from {job_source})")
    print(f"versions     torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"model        {type(model).__name__}" + (
        f" ({moe['experts']} experts, top {moe['top_k']}, d_expert {moe['d_expert']}, every {moe['every']}: "
        f"layers {[i for i in range(config.num_hidden_layers) if is_moe_layer(moe, i)]}, norm_topk_prob "
        f"{str(moe['norm_topk_prob']).lower()})" if moe else ""))
    if how:
        print(f"loaded       {how}")
    print(f"batch        step {step} (0-based data step {step - 1}): {batch} x {seq_len} tokens of {data_path}")
    if step - 1 != ckpt_step:
        print(f"note         step {step} did not run with these weights (they are those before step "
              f"{ckpt_step + 1}); expect a mismatch")
    if moe and metrics is not None:
        balance = metrics.get("balance_loss", float("nan"))
        print(f"piper loss   {metrics['loss']:.9g} = xent + balance_loss {balance:.9g} (the balance loss is "
              f"not compared)")
    print(f"piper {field:6} {ref:.9g}")
    print(f"hf xent      {hf:.9g}" if moe else f"hf loss      {hf:.9g}")
    print(f"rel diff     {rel:.3e} ({'ok' if rel <= args.rtol else 'ABOVE'} rtol {args.rtol:g})")
    return 0 if rel <= args.rtol else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (CheckError, OSError, KeyError, tomllib.TOMLDecodeError) as e:
        print(f"hf-qwen3-check: error: {e}", file=sys.stderr)
        sys.exit(2)
