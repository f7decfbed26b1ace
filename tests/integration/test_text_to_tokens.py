"""tools/text-to-tokens.py: text and JSON lines to token files. With --bytes (always here): every document's UTF-8 bytes
followed by the end-of-document id 256, documents shuffled by the seed (the same seed, the same files; another,
another order), a validation share, and piper trains on the result with model.vocab = 257 (its first loss near
ln 257). With a tokenizer.json (where an interpreter has the `tokenizers` package; TOKENIZERS_PYTHON names one),
the ids are the tokenizer's own and its <|endoftext|> separates the documents. Bad input exits 2."""
import json
import math
import os
import subprocess
import sys

from common import DATA, ROOT, fail, losses, run, tempdir, tiny_gpt, write

TOOL = os.path.join(ROOT, "tools", "text-to-tokens.py")


def tokenize(*args, python=sys.executable, want=0):
    p = subprocess.run([python, TOOL, *args], capture_output=True, text=True, timeout=300)
    if p.returncode != want:
        fail(f"tokenize {' '.join(args)} exited {p.returncode}, expected {want}:\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout) if want == 0 else p


def ids(path):
    import array
    a = array.array("H")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return list(a)


def main():
    d = tempdir()
    docs = [f"doc {i}: " + "über " * (i % 4 + 1) for i in range(30)]
    src = os.path.join(d, "docs.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for t in docs:
            f.write(json.dumps({"text": t}) + "\n")
    out = tokenize(src, "--bytes", "--out", os.path.join(d, "a"), "--val-fraction", "0.2", "--seed", "7")
    train, val = out["files"]["train"], out["files"]["val"]
    got = [ids(train["path"]), ids(val["path"])]
    if out["vocab"] != 257 or out["eos"] != 256 or (train["documents"], val["documents"]) != (24, 6):
        fail(f"summary {out}")
    texts = []
    for seq in got:
        cur = []
        for t in seq:
            if t == 256:
                texts.append(bytes(cur).decode("utf-8"))
                cur = []
            else:
                cur.append(t)
        if cur:
            fail("a file does not end with the end-of-document id")
    if sorted(texts) != sorted(docs) or texts == docs:
        fail(f"the documents read back are not the inputs, shuffled: {texts[:3]}")
    again = tokenize(src, "--bytes", "--out", os.path.join(d, "b"), "--val-fraction", "0.2", "--seed", "7")
    other = tokenize(src, "--bytes", "--out", os.path.join(d, "c"), "--val-fraction", "0.2", "--seed", "8")
    if ids(again["files"]["train"]["path"]) != got[0] or ids(other["files"]["train"]["path"]) == got[0]:
        fail("the seed does not fix the order of the documents")
    print(f"ok  --bytes: {len(docs)} documents, each followed by id 256, shuffled by the seed; 24 train and 6 "
          f"validation ({train['tokens']} and {val['tokens']} tokens)")

    fort = tokenize(DATA, "--bytes", "--separator", "\\n%\\n", "--out", os.path.join(d, "fortunes"))
    cfg = write(d, "t.toml", tiny_gpt(steps=3).replace("vocab = 256", "vocab = 257").replace(
        f'path = "{DATA}"', f'path = "{fort["files"]["train"]["path"]}"'))
    m = os.path.join(d, "m.jsonl")
    run(1, cfg, "--metrics", m)
    first = losses(m)[0]
    if abs(first - math.log(257)) > 0.1:
        fail(f"piper on the tokenized fortunes starts at loss {first}, not near ln 257 = {math.log(257):.3f}")
    print(f"ok  the fortunes cut at '%' lines: {fort['documents']} documents; piper trains on them (loss {first:.3f})")

    for args, says in (([src, "--out", os.path.join(d, "x")], "required"),
                       ([os.path.join(d, "missing.txt"), "--bytes", "--out", os.path.join(d, "x")], "no such file"),
                       ([src, "--bytes", "--field", "body", "--out", os.path.join(d, "x")], "no string field"),
                       ([src, "--bytes", "--val-fraction", "1.5", "--out", os.path.join(d, "x")], "--val-fraction")):
        p = tokenize(*args, want=2)
        if says not in p.stderr:
            fail(f"tokenize {args}: {p.stderr!r} does not say {says!r}")
    print("ok  bad input (no tokenizer choice, a missing file, a missing field, a fraction past 1) exits 2")

    pythons = [os.environ.get("TOKENIZERS_PYTHON"), sys.executable, "/usr/bin/python3"]
    python = next((p for p in pythons if p and os.path.exists(p) and subprocess.run(
        [p, "-c", "import tokenizers"], capture_output=True).returncode == 0), None)
    if python is None:
        print("ok  --tokenizer: skipped, no interpreter here has the tokenizers package")
        return
    tok_json = os.path.join(d, "tokenizer.json")
    make = f"""
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.train_from_iterator({docs!r}, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"]))
tok.save({tok_json!r})
"""
    subprocess.run([python, "-c", make], check=True, capture_output=True, timeout=120)
    out = tokenize(src, "--tokenizer", tok_json, "--out", os.path.join(d, "bpe"), "--val-fraction", "0", python=python)
    seq = ids(out["files"]["train"]["path"])
    check = f"""
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file({tok_json!r})
print(json.dumps([tok.token_to_id("<|endoftext|>"), tok.encode({docs[0]!r}, add_special_tokens=False).ids]))
"""
    eos, first_ids = json.loads(subprocess.run([python, "-c", check], check=True, capture_output=True, text=True).stdout)
    if out["eos"] != eos or seq.count(eos) != len(docs) or seq[-1] != eos or first_ids[0] not in seq:
        fail(f"--tokenizer: eos {out['eos']} (the tokenizer's {eos}), {seq.count(eos)} separators for {len(docs)}")
    print(f"ok  --tokenizer tokenizer.json: the tokenizer's ids, its <|endoftext|> ({eos}) after each of the "
          f"{len(docs)} documents")


if __name__ == "__main__":
    main()
