#!/usr/bin/env python3
"""Continues a prompt with a model folder that piper-ckpt export wrote (or any from_pretrained folder), through
Hugging Face transformers: greedy, or sampled with temperature, top-k and top-p; stops at the end-of-document id.

usage: tools/hf-generate.py FOLDER --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
                            [--greedy] [--seed S] [--tokenizer tokenizer.json] [--eos ID]
  Without --tokenizer the model reads bytes: the prompt's UTF-8 bytes are its ids, and an id of 256 or more (the
  end of a document for tools/text-to-tokens.py --bytes) ends the text. Needs transformers and torch
  (pip install transformers torch)."""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description="continue a prompt with an exported model folder")
    ap.add_argument("folder")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tokenizer", help="a tokenizer.json (the tokenizers package); default: bytes")
    ap.add_argument("--eos", type=int, help="the end-of-document id (default: 256 for bytes, else the tokenizer's)")
    a = ap.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        sys.exit("hf-generate: needs transformers and torch: pip install transformers torch")
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(a.folder)
    model.eval()
    if a.tokenizer:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(a.tokenizer)
        ids = tok.encode(a.prompt, add_special_tokens=False).ids
        eos = a.eos if a.eos is not None else next(
            (tok.token_to_id(n) for n in ("<|endoftext|>", "</s>", "<|im_end|>") if tok.token_to_id(n) is not None),
            None)
    else:
        ids = list(a.prompt.encode("utf-8"))
        eos = a.eos if a.eos is not None else (256 if model.config.vocab_size > 256 else None)
    if not ids:
        sys.exit("hf-generate: an empty prompt")
    seq_len = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", 1024)
    new = max(0, min(a.max_new_tokens, seq_len - len(ids)))
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=not a.greedy,
                             temperature=a.temperature if not a.greedy else None,
                             top_k=a.top_k if not a.greedy else None, top_p=a.top_p if not a.greedy else None,
                             eos_token_id=eos, pad_token_id=eos if eos is not None else 0)
    cont = out[0].tolist()[len(ids):]
    if eos is not None and eos in cont:
        cont = cont[:cont.index(eos)]
    if a.tokenizer:
        text = tok.decode(cont)
    else:
        text = bytes(t for t in cont if t < 256).decode("utf-8", errors="replace")
    print(a.prompt + text)


if __name__ == "__main__":
    main()
