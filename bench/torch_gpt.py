# torch_gpt.py: the quickstart GPT (configs/quickstart.toml) or the Qwen3 of the same size (configs/qwen3-small.toml)
# and its training step in PyTorch on CPU, eager or under torch.compile, as a reference point for piper's speed.
# Same shapes, parameters, optimizer and loss; prints one machine-readable line: RESULT torch threads=T tokens_per_s=...
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-LN transformer block with biases: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, d_model, n_heads, d_ff, seq_len, n_layers, sdpa):
        super().__init__()
        self.n_heads = n_heads
        self.sdpa = sdpa
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.fc = nn.Linear(d_model, d_ff)
        self.gelu = nn.GELU(approximate="tanh")
        self.mlp_proj = nn.Linear(d_ff, d_model)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)  # True above the diagonal: future keys
        self.register_buffer("mask", mask, persistent=False)
        proj_std = 0.02 / math.sqrt(2.0 * n_layers)
        for lin, std in ((self.qkv, 0.02), (self.proj, proj_std), (self.fc, 0.02), (self.mlp_proj, proj_std)):
            nn.init.normal_(lin.weight, std=std)
            nn.init.zeros_(lin.bias)

    def attention(self, x):
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp_proj(self.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Byte-level GPT-2: token + learned position embeddings, blocks, final LN, LM head tied to wte."""

    def __init__(self, vocab, seq_len, d_model, n_layers, n_heads, d_ff, sdpa):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff, seq_len, n_layers, sdpa) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.register_buffer("pos", torch.arange(seq_len), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(self.pos[:T])
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head, no bias
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))  # mean over tokens


class RMSNorm(nn.Module):
    """x / rms(x) * weight; F.rms_norm where torch has it (2.4 and later), the same formula by hand before."""

    def __init__(self, width, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Qwen3Layer(nn.Module):
    """x + attn(norm(x)), then x + swiglu(norm(x)); grouped-query attention with q/k norms and RoPE, no biases."""

    def __init__(self, d_model, n_heads, n_kv_heads, head_dim, d_ff, eps, sdpa):
        super().__init__()
        self.h, self.kv, self.d, self.sdpa = n_heads, n_kv_heads, head_dim, sdpa
        self.input_layernorm = RMSNorm(d_model, eps)
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.post_attention_layernorm = RMSNorm(d_model, eps)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(lin.weight, std=0.02)

    def attention(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.h, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.sdpa == "gqa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
            if self.sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d))
                y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.h * self.d))

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Qwen3(nn.Module):
    """Byte-level Qwen3 (configs/qwen3-small.toml): token embedding, layers, final RMSNorm, LM head tied to it."""

    def __init__(self, vocab, seq_len, d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, rope_theta, eps, sdpa):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList(Qwen3Layer(d_model, n_heads, n_kv_heads, head_dim, d_ff, eps, sdpa)
                                    for _ in range(n_layers))
        self.norm = RMSNorm(d_model, eps)
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)  # (T, head_dim): each frequency on both halves
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        logits = self.norm(x) @ self.embed_tokens.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_token(vocab, seq_len, d_model, n_layers, d_ff):
    """3 x forward matmul + causal-attention FLOPs per token, the same count piper reports."""
    T, C, Fd, V = seq_len, d_model, d_ff, vocab
    block = 2.0 * T * (4.0 * C * C + 2.0 * C * Fd) + 2.0 * 2.0 * C * (T * (T + 1) / 2.0)
    head = 2.0 * T * C * V
    return 3.0 * (n_layers * block + head) / T


def qwen3_flops_per_token(vocab, seq_len, d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff):
    """The same count for Qwen3 (src/model/qwen3/qwen3.cpp): q, k, v, o and SwiGLU matmuls, causal attention."""
    T, C, Fd, V, QD, KD = seq_len, d_model, d_ff, vocab, n_heads * head_dim, n_kv_heads * head_dim
    layer = (2.0 * T * (2.0 * C * QD + 2.0 * C * KD) + 2.0 * 2.0 * QD * (T * (T + 1) / 2.0)
             + 2.0 * T * 3.0 * C * Fd)
    head = 2.0 * T * C * V
    return 3.0 * (n_layers * layer + head) / T


def make_adamw(groups, kind, **kw):
    """AdamW with the requested kernels; "auto" is fused where this torch has it on CPU, else foreach.
    Returns (optimizer, the kind used)."""
    if kind in ("fused", "auto"):
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (TypeError, RuntimeError, ValueError) as e:
            if kind == "fused":
                sys.exit(f"torch_gpt: torch {torch.__version__} has no fused AdamW on CPU: {e}")
        kind = "foreach"
    if kind == "foreach":
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"
    return torch.optim.AdamW(groups, **kw), "default"


def learning_rate(step, lr, min_lr, warmup, decay_steps):
    """Linear warm-up, then cosine decay to min_lr (the schedule piper uses)."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = decay_steps - warmup
    if span <= 0:
        return lr
    p = min(1.0, max(0.0, (step - warmup) / span))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))


def main():
    ap = argparse.ArgumentParser(description="the quickstart GPT or the small Qwen3 in PyTorch on CPU")
    ap.add_argument("--model", choices=("gpt", "qwen3"), default="gpt",
                    help="gpt: configs/quickstart.toml; qwen3: configs/qwen3-small.toml")
    ap.add_argument("--data", default="data/fortunes.txt", help="raw bytes to sample windows from")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: all cores)")
    ap.add_argument("--steps", type=int, default=40, help="total steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=10, help="first steps left out of the timing")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--n-kv-heads", type=int, default=4, help="qwen3 only")
    ap.add_argument("--head-dim", type=int, default=32, help="qwen3 only")
    ap.add_argument("--d-ff", type=int, default=None, help="default 1024 (gpt), 768 (qwen3)")
    ap.add_argument("--rope-theta", type=float, default=10000.0, help="qwen3 only")
    ap.add_argument("--norm-eps", type=float, default=1e-6, help="qwen3 only")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--lr-warmup", type=int, default=None, help="default 30 (gpt), 20 (qwen3)")
    ap.add_argument("--decay-steps", type=int, default=None, help="default 300 (gpt), 200 (qwen3)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--sdpa", action="store_true", help="use F.scaled_dot_product_attention (causal) when torch has it")
    ap.add_argument("--adamw", choices=("default", "foreach", "fused", "auto"), default="default",
                    help="AdamW kernels: torch's default, foreach (multi-tensor), fused, or auto (fused where this "
                         "torch has it on CPU, else foreach)")
    ap.add_argument("--foreach", action="store_true", help="the same as --adamw foreach")
    ap.add_argument("--compile", action="store_true", help="train torch.compile(model) (PyTorch 2.0 and later)")
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none",
                    help="bf16: the forward under torch.autocast('cpu', torch.bfloat16) (fp32 weights and optimizer)")
    ap.add_argument("--losses", default="", help="write every step's loss to this file, one per line")
    ap.add_argument("--verbose", action="store_true", help="print every step")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    qwen3 = args.model == "qwen3"
    if args.d_ff is None:
        args.d_ff = 768 if qwen3 else 1024
    if args.lr_warmup is None:
        args.lr_warmup = 20 if qwen3 else 30
    if args.decay_steps is None:
        args.decay_steps = 200 if qwen3 else 300
    if args.foreach:
        args.adamw = "foreach"
    if args.compile and not hasattr(torch, "compile"):
        sys.exit(f"torch_gpt: torch {torch.__version__} has no torch.compile")

    threads = args.threads if args.threads > 0 else len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(args.seed)

    sdpa = args.sdpa and hasattr(F, "scaled_dot_product_attention")
    if args.sdpa and not sdpa:
        print(f"torch_gpt: torch {torch.__version__} has no F.scaled_dot_product_attention; using explicit attention",
              file=sys.stderr)
    attention = "sdpa" if sdpa else "explicit"
    if sdpa and qwen3 and "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or ""):
        sdpa, attention = "gqa", "sdpa-gqa"  # key/value heads shared inside the kernel (PyTorch 2.5 and later)

    with open(args.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    if data.numel() <= args.seq_len + 1:
        sys.exit(f"torch_gpt: {args.data} is shorter than one window")

    if qwen3:
        model = Qwen3(args.vocab, args.seq_len, args.d_model, args.n_layers, args.n_heads, args.n_kv_heads,
                      args.head_dim, args.d_ff, args.rope_theta, args.norm_eps, sdpa)
        fpt = qwen3_flops_per_token(args.vocab, args.seq_len, args.d_model, args.n_layers, args.n_heads,
                                    args.n_kv_heads, args.head_dim, args.d_ff)
    else:
        model = GPT(args.vocab, args.seq_len, args.d_model, args.n_layers, args.n_heads, args.d_ff, sdpa)
        fpt = flops_per_token(args.vocab, args.seq_len, args.d_model, args.n_layers, args.d_ff)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # the embedding counted once: the head shares it
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # biases and norm gains
    opt, adamw = make_adamw([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], args.adamw,
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    step_model = torch.compile(model) if args.compile else model
    execution = "compile" if args.compile else "eager"
    tokens = args.batch * args.seq_len
    print(f"torch {torch.__version__}: {args.model}, {n_params} parameters, {fpt * tokens / 1e9:.3f} GFLOP per step "
          f"({fpt:.0f} FLOP per token), {threads} thread{'s' if threads != 1 else ''}, {execution}, "
          f"attention {attention}, AdamW {adamw}, autocast {args.autocast}")

    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(args.seq_len + 1)
    times, loss, first_ms = [], float("nan"), 0.0
    losses = open(args.losses, "w") if args.losses else None
    for step in range(args.steps):
        t0 = time.perf_counter()
        starts = torch.randint(0, data.numel() - args.seq_len - 1, (args.batch,), generator=gen)
        win = data[starts[:, None] + offsets].long()
        x, y = win[:, :-1].contiguous(), win[:, 1:].contiguous()
        lr = learning_rate(step, args.lr, args.min_lr, args.lr_warmup, args.decay_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            loss_t = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss_t.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        loss = loss_t.item()
        dt = time.perf_counter() - t0
        if losses is not None:
            losses.write(f"{loss!r}\n")
        if step == 0:
            first_ms = dt * 1e3  # under --compile, mostly compilation
        if step >= args.warmup:
            times.append(dt)
        if args.verbose:
            print(f"step {step + 1:6d} | loss {loss:.6f} | lr {lr:.3e} | {tokens / dt:10.0f} tok/s | "
                  f"{dt * 1e3:8.2f} ms | grad_norm {float(grad_norm):.4f}", flush=True)

    ms = statistics.median(times) * 1e3
    tps = tokens / (ms / 1e3)
    print(f"RESULT torch threads={threads} tokens_per_s={tps:.1f} ms={ms:.3f} flops_per_s={tps * fpt:.6g} "
          f"params={n_params} flops_per_token={fpt:.0f} final_loss={loss:.4f} timed_steps={len(times)} "
          f"model={args.model} execution={execution} attention={attention} adamw={adamw} autocast={args.autocast} "
          f"first_step_ms={first_ms:.0f} torch={torch.__version__}")


if __name__ == "__main__":
    main()
