# torch_gpt.py: the quickstart model and training step (configs/quickstart.toml) in PyTorch eager on CPU,
# as a reference point for piper's speed. Same shapes, parameters, optimizer and loss; prints
# one machine-readable line: RESULT torch threads=T tokens_per_s=... ms=... params=...
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


def flops_per_token(vocab, seq_len, d_model, n_layers, d_ff):
    """3 x forward matmul + causal-attention FLOPs per token, the same count piper reports."""
    T, C, Fd, V = seq_len, d_model, d_ff, vocab
    block = 2.0 * T * (4.0 * C * C + 2.0 * C * Fd) + 2.0 * 2.0 * C * (T * (T + 1) / 2.0)
    head = 2.0 * T * C * V
    return 3.0 * (n_layers * block + head) / T


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
    ap = argparse.ArgumentParser(description=__doc__ or "quickstart GPT in PyTorch eager on CPU")
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
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--lr-warmup", type=int, default=30)
    ap.add_argument("--decay-steps", type=int, default=300)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--sdpa", action="store_true", help="use F.scaled_dot_product_attention when torch has it")
    ap.add_argument("--foreach", action="store_true", help="AdamW with foreach=True (multi-tensor) kernels")
    ap.add_argument("--verbose", action="store_true", help="print every step")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")

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

    with open(args.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    if data.numel() <= args.seq_len + 1:
        sys.exit(f"torch_gpt: {args.data} is shorter than one window")

    model = GPT(args.vocab, args.seq_len, args.d_model, args.n_layers, args.n_heads, args.d_ff, sdpa)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # wte counted once: the head shares it
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # biases and LayerNorm gains
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if args.foreach:
        opt_kwargs["foreach"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kwargs)
    fpt = flops_per_token(args.vocab, args.seq_len, args.d_model, args.n_layers, args.d_ff)
    tokens = args.batch * args.seq_len
    print(f"torch {torch.__version__}: {n_params} parameters, {fpt * tokens / 1e9:.3f} GFLOP per step "
          f"({fpt:.0f} FLOP per token), {threads} thread{'s' if threads != 1 else ''}, "
          f"attention {'sdpa' if sdpa else 'explicit'}, AdamW {'foreach' if args.foreach else 'default'}")

    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(args.seq_len + 1)
    times, loss = [], float("nan")
    for step in range(args.steps):
        t0 = time.perf_counter()
        starts = torch.randint(0, data.numel() - args.seq_len - 1, (args.batch,), generator=gen)
        win = data[starts[:, None] + offsets].long()
        x, y = win[:, :-1].contiguous(), win[:, 1:].contiguous()
        lr = learning_rate(step, args.lr, args.min_lr, args.lr_warmup, args.decay_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        loss_t = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss_t.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        loss = loss_t.item()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
        if args.verbose:
            print(f"step {step + 1:6d} | loss {loss:.6f} | lr {lr:.3e} | {tokens / dt:10.0f} tok/s | "
                  f"{dt * 1e3:8.2f} ms | grad_norm {float(grad_norm):.4f}")

    ms = statistics.median(times) * 1e3
    tps = tokens / (ms / 1e3)
    print(f"RESULT torch threads={threads} tokens_per_s={tps:.1f} ms={ms:.3f} flops_per_s={tps * fpt:.6g} "
          f"params={n_params} flops_per_token={fpt:.0f} final_loss={loss:.4f} timed_steps={len(times)} "
          f"attention={'sdpa' if sdpa else 'explicit'} torch={torch.__version__}")


if __name__ == "__main__":
    main()
