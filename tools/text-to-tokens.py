#!/usr/bin/env python3
"""Turns text into the token files piper trains on: documents from text files or JSON lines, tokenized by a local
tokenizer.json (the `tokenizers` package, an optional extra: pip install tokenizers) or as bytes, shuffled by a seed,
joined with an end-of-document token between them, and split into a training and a validation file.

usage: tools/text-to-tokens.py INPUT [INPUT ...] --out STEM [--tokenizer tokenizer.json | --bytes] [--field text]
                         [--separator SEP] [--eos TOKEN] [--val-fraction F] [--seed S] [--no-shuffle]
  INPUT           .jsonl / .json lines: one document per line, its --field (default "text"); any other file: text,
                  one document, or several cut at each --separator (for example '\\n%\\n' for fortune files)
  --tokenizer     a Hugging Face tokenizer.json; its end-of-text token is the separator (--eos names another)
  --bytes         UTF-8 bytes as ids 0..255 and 256 as end of document: train with model.vocab = 257
  --val-fraction  documents held out for validation (default 0.05; at least one when there are two or more)
writes STEM.train.u16.bin and STEM.val.u16.bin (.u32.bin when an id is 65536 or more), each under a temporary name
first, and prints one summary line of JSON: documents, tokens, the vocabulary and eos id, and the files."""
import argparse
import array
import json
import os
import random
import sys
import tempfile

EOS_NAMES = ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>", "[SEP]")


def fail(msg):
    print(f"text-to-tokens: {msg}", file=sys.stderr)
    sys.exit(2)


def documents(paths, field, separator):
    """The documents of every input, in order, as str."""
    docs = []
    for path in paths:
        if not os.path.isfile(path):
            fail(f"{path}: no such file")
        if path.endswith((".jsonl", ".json")):
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)
                    except json.JSONDecodeError as e:
                        fail(f"{path}:{n}: not a JSON line ({e.msg})")
                    if not isinstance(doc, dict) or not isinstance(doc.get(field), str):
                        fail(f"{path}:{n}: no string field {field!r}")
                    docs.append(doc[field])
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            parts = text.split(separator) if separator else [text]
            docs.extend(p for p in parts if p.strip())
    if not docs:
        fail("no documents in the inputs")
    return docs


class ByteTokens:
    vocab = 257
    eos = 256

    def encode(self, text):
        return list(text.encode("utf-8"))


class FileTokens:
    def __init__(self, path, eos_name):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            fail("--tokenizer needs the tokenizers package: pip install tokenizers (or use --bytes)")
        if not os.path.isfile(path):
            fail(f"{path}: no such tokenizer file")
        self.tok = Tokenizer.from_file(path)
        self.vocab = self.tok.get_vocab_size(with_added_tokens=True)
        names = [eos_name] if eos_name else list(EOS_NAMES)
        ids = [(n, self.tok.token_to_id(n)) for n in names]
        found = [(n, i) for n, i in ids if i is not None]
        if not found:
            fail(f"{path}: no end-of-document token among {names}; name one with --eos")
        self.eos_name, self.eos = found[0]

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


def write_ids(stem, part, ids, wide):
    """STEM.PART.u16.bin (or .u32.bin), through a temporary file renamed when complete."""
    path = f"{stem}.{part}.{'u32' if wide else 'u16'}.bin"
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    data = array.array("I" if wide else "H", ids)
    if sys.byteorder != "little":
        data.byteswap()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tokenize-")
    with os.fdopen(fd, "wb") as f:
        data.tofile(f)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it (mkstemp's is 0600)
    os.replace(tmp, path)
    return path


def main():
    ap = argparse.ArgumentParser(description="text or JSON lines to piper token files")
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--out", required=True)
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--tokenizer")
    how.add_argument("--bytes", action="store_true")
    ap.add_argument("--field", default="text")
    ap.add_argument("--separator", default="")
    ap.add_argument("--eos")
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-shuffle", action="store_true")
    a = ap.parse_args()
    if not 0 <= a.val_fraction < 1:
        fail(f"--val-fraction {a.val_fraction}: give a fraction in [0, 1)")
    separator = a.separator.encode().decode("unicode_escape")
    docs = documents(a.inputs, a.field, separator)
    tok = ByteTokens() if a.bytes else FileTokens(a.tokenizer, a.eos)
    order = list(range(len(docs)))
    if not a.no_shuffle:
        random.Random(a.seed).shuffle(order)
    n_val = min(len(docs) - 1, max(1 if len(docs) > 1 and a.val_fraction > 0 else 0,
                                   round(a.val_fraction * len(docs))))
    parts = {"val": order[:n_val], "train": order[n_val:]}
    wide = tok.vocab > 0x10000
    summary = {"documents": len(docs), "vocab": tok.vocab, "eos": tok.eos, "files": {}}
    for part in ("train", "val"):
        if not parts[part]:
            continue
        ids = []
        for i in parts[part]:
            ids.extend(tok.encode(docs[i]))
            ids.append(tok.eos)  # after every document: a window that crosses it sees where one ends
        summary["files"][part] = {"path": write_ids(a.out, part, ids, wide), "documents": len(parts[part]),
                                  "tokens": len(ids)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
