#!/usr/bin/env python3
"""Encodes and decodes with a Hugging Face tokenizer.json (the `tokenizers` package), for `piper sample`.

usage: tools/tokenizer-codec.py encode TOKENIZER.json   < text       prints the ids, space-separated
       tools/tokenizer-codec.py decode TOKENIZER.json   < ids        prints the text
       tools/tokenizer-codec.py info TOKENIZER.json                  prints {"vocab": N, "eos": ID or -1}
exit 2 with a message on stderr when the file or the package is missing."""
import json
import sys

EOS_NAMES = ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>", "[SEP]")  # as tools/text-to-tokens.py


def fail(msg):
    print(f"tokenizer-codec: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("encode", "decode", "info"):
        fail(__doc__.split("\n\n")[1])
    try:
        from tokenizers import Tokenizer
    except ImportError:
        fail("the tokenizers package is missing (pip install tokenizers)")
    try:
        tok = Tokenizer.from_file(sys.argv[2])
    except Exception as e:  # the package raises its own exception types
        fail(f"{sys.argv[2]}: not a readable tokenizer.json ({e})")
    command = sys.argv[1]
    if command == "encode":
        text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
        print(" ".join(str(i) for i in tok.encode(text, add_special_tokens=False).ids))
    elif command == "decode":
        ids = [int(w) for w in sys.stdin.read().split()]
        sys.stdout.buffer.write(tok.decode(ids, skip_special_tokens=False).encode("utf-8"))
    else:
        eos = next((tok.token_to_id(n) for n in EOS_NAMES if tok.token_to_id(n) is not None), -1)
        print(json.dumps({"vocab": tok.get_vocab_size(), "eos": eos}))


if __name__ == "__main__":
    main()
