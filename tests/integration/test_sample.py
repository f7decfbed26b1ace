"""piper sample: a checkpoint of every language-model family (GPT-2, Qwen3, Qwen3-MoE) continues a prompt. Greedy is
repeatable and equals top-k 1; a seed repeats a draw and another seed changes it; a prompt longer than the context
slides; a stop id ends the continuation; --logits-out holds the first token's logits, whose argmax is the greedy
token; bf16 matmuls move the logits a little, not a lot. Bad input exits 2 naming the option or the file. Where an
interpreter has transformers and torch (TRANSFORMERS_PYTHON names one), the exported folder's first-token logits
equal piper's and transformers' greedy generate() gives piper's ids; where one has the tokenizers package
(TOKENIZERS_PYTHON), --tokenizer tokenizer.json encodes the prompt with the tokenizer's own ids."""
import array
import json
import os
import subprocess

from common import (PIPER, checkpoint, fail, piper_ckpt, python_with, tempdir, tiny_gpt, tiny_mlp, tiny_qwen3,
                    tiny_qwen3_moe)

HF_LOGITS = """
import json, sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation="eager").float().eval()
ids = torch.tensor([json.loads(sys.argv[2])])
with torch.no_grad():
    logits = m(ids).logits[0, -1].tolist()
    out = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=int(sys.argv[3]),
                     pad_token_id=0)
print(json.dumps({"logits": logits, "greedy": out[0, ids.shape[1]:].tolist()}))
"""


def sample(ckpt, *args, want=0):
    p = subprocess.run([PIPER, "sample", ckpt, "--threads", "1", *args], capture_output=True, encoding="utf-8",
                       errors="replace", timeout=300)  # a barely trained byte model prints any byte
    if p.returncode != want:
        fail(f"piper sample {ckpt} {' '.join(args)}: exit {p.returncode}, wanted {want}\n{p.stdout}\n{p.stderr}")
    return p


def continuation(ckpt, *args):
    """The new ids of a --ids run."""
    line = sample(ckpt, "--ids", *args).stdout.strip()
    return [int(w) for w in line.split("|")[1].split()]


def read_floats(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return list(a)


def main():
    d = tempdir()
    ckpts = {"gpt": checkpoint(d, "gpt", tiny_gpt(steps=2)),
             "qwen3": checkpoint(d, "qwen3", tiny_qwen3(steps=2, layers=2)),
             "qwen3-moe": checkpoint(d, "moe", tiny_qwen3_moe(layers=2))}
    prompt = "1,2,3,4,5"
    for name, ckpt in ckpts.items():
        greedy = continuation(ckpt, "--prompt-ids", prompt, "--greedy", "--max-new-tokens", "8")
        again = continuation(ckpt, "--prompt-ids", prompt, "--greedy", "--max-new-tokens", "8")
        top1 = continuation(ckpt, "--prompt-ids", prompt, "--top-k", "1", "--seed", "5", "--max-new-tokens", "8")
        if len(greedy) != 8 or again != greedy or top1 != greedy:
            fail(f"{name}: greedy {greedy}, again {again}, top-k 1 {top1}")
        hot = ["--prompt-ids", prompt, "--temperature", "4", "--max-new-tokens", "12"]
        a, b, c = (continuation(ckpt, *hot, "--seed", s) for s in ("1", "1", "2"))
        if a != b or a == c or len(set(a)) < 4:
            fail(f"{name}: temperature 4, seed 1 twice {a} / {b}, seed 2 {c}")
        nucleus = continuation(ckpt, "--prompt-ids", prompt, "--top-p", "0.000001", "--seed", "3",
                               "--max-new-tokens", "8")
        if nucleus != greedy:
            fail(f"{name}: a tiny top-p keeps only the most likely token: {nucleus} against greedy {greedy}")
        logits_path = os.path.join(d, f"{name}.logits")
        sample(ckpt, "--prompt-ids", prompt, "--greedy", "--max-new-tokens", "1", "--logits-out", logits_path)
        logits = read_floats(logits_path)
        if len(logits) != 256 or logits.index(max(logits)) != greedy[0]:
            fail(f"{name}: --logits-out holds {len(logits)} values, argmax {logits.index(max(logits))}, "
                 f"greedy {greedy[0]}")
        bf16_path = os.path.join(d, f"{name}.bf16.logits")
        sample(ckpt, "--prompt-ids", prompt, "--greedy", "--max-new-tokens", "1", "--precision", "bf16",
               "--logits-out", bf16_path)
        bf16 = read_floats(bf16_path)
        gap = max(abs(x - y) for x, y in zip(bf16, logits))
        scale = max(abs(x) for x in logits)
        if not 0 < gap < 0.05 * scale:
            fail(f"{name}: bf16 logits differ from fp32 by {gap} (largest logit {scale})")
        long_prompt = ",".join(str(i % 200 + 10) for i in range(40))  # past seq_len 16: the oldest are dropped
        slid = continuation(ckpt, "--prompt-ids", long_prompt, "--greedy", "--max-new-tokens", "20")
        tail = continuation(ckpt, "--prompt-ids", ",".join(long_prompt.split(",")[-16:]), "--greedy",
                            "--max-new-tokens", "1")
        if len(slid) != 20 or slid[0] != tail[0]:
            fail(f"{name}: a 40-token prompt gave {slid}; its last 16 tokens alone {tail}")
        stopped = sample(ckpt, "--ids", "--prompt-ids", prompt, "--greedy", "--stop-id", str(greedy[2]))
        if stopped.stdout.split("|")[1].split() != [str(i) for i in greedy[:2]] or "--stop-id" not in stopped.stderr:
            fail(f"{name}: --stop-id {greedy[2]}: {stopped.stdout} {stopped.stderr}")
        text = sample(ckpt, "--prompt", "Q: ", "--max-new-tokens", "5", "--seed", "9").stdout
        if not text.startswith("Q: "):
            fail(f"{name}: a text prompt printed {text!r}")
        print(f"ok  {name}: greedy {greedy} repeats and equals top-k 1 and a tiny top-p; seeds repeat and differ; "
              f"logits' argmax is greedy; bf16 logits within {gap:.2g} of fp32 (largest {scale:.2g}); "
              f"a 40-token prompt slides; --stop-id ends it")

    mlp = checkpoint(d, "mlp", tiny_mlp())
    for args, words in (((mlp, "--prompt", "x"), "not a language model"),
                        ((ckpts["gpt"], "--prompt-ids", "1,256"), "outside the model's vocabulary"),
                        ((ckpts["gpt"], "--prompt", "x", "--top-p", "0"), "--top-p 0"),
                        ((ckpts["gpt"], "--prompt", "x", "--temperature", "hot"), "--temperature hot"),
                        ((ckpts["gpt"], "--prompt", "x", "--frobnicate"), "unknown option '--frobnicate'"),
                        ((ckpts["gpt"],), "--prompt TEXT or --prompt-ids"),
                        ((os.path.join(d, "none.h5"), "--prompt", "x"), "none.h5"),
                        ((ckpts["gpt"], "--prompt", "x", "--tokenizer", os.path.join(d, "no.json")), "no.json")):
        p = sample(*args, want=2)
        if words not in p.stderr:
            fail(f"piper sample {' '.join(args[1:])}: {p.stderr!r} does not say {words!r}")
    print("ok  bad input (an MLP checkpoint, an id past the vocabulary, bad numbers, unknown options, missing "
          "files) exits 2 naming it")

    python = python_with("TRANSFORMERS_PYTHON", "transformers, torch")
    if python is None:
        print("ok  transformers: skipped, no interpreter here has transformers and torch")
    else:
        for name, ckpt in ckpts.items():
            folder = os.path.join(d, f"{name}-hf")
            piper_ckpt("export", ckpt, "--to", folder)
            r = subprocess.run([python, "-c", HF_LOGITS, folder, "[" + prompt + "]", "8"], capture_output=True,
                               text=True, timeout=300)
            if r.returncode != 0:
                fail(f"{name}: transformers failed: {r.stderr[-2000:]}")
            hf = json.loads(r.stdout.strip().splitlines()[-1])
            logits = read_floats(os.path.join(d, f"{name}.logits"))
            gap = max(abs(x - y) for x, y in zip(logits, hf["logits"]))
            greedy = continuation(ckpt, "--prompt-ids", prompt, "--greedy", "--max-new-tokens", "8")
            if gap > 1e-4 or greedy != hf["greedy"]:
                fail(f"{name}: first-token logits differ from transformers' by {gap}; greedy {greedy}, "
                     f"transformers {hf['greedy']}")
            print(f"ok  {name}: first-token logits within {gap:.2g} of transformers' on the exported folder; "
                  f"greedy generate() gives piper's ids")

    python = python_with("TOKENIZERS_PYTHON", "tokenizers")
    if python is None:
        print("ok  --tokenizer: skipped, no interpreter here has the tokenizers package")
        return
    tok_json = os.path.join(d, "tokenizer.json")
    docs = ["hello world, the quick brown fox", "a fortune: the world is quick", "hello again, brown world"] * 20
    make = f"""
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator({docs!r}, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save({tok_json!r})
import json
print(json.dumps([tok.get_vocab_size(), tok.encode("hello world", add_special_tokens=False).ids]))
"""
    r = subprocess.run([python, "-c", make], check=True, capture_output=True, text=True, timeout=120)
    vocab, want = json.loads(r.stdout.strip().splitlines()[-1])
    ckpt = checkpoint(d, "bpe", tiny_qwen3(name="bpe", steps=2, layers=2).replace("vocab = 256", f"vocab = {vocab}"))
    got = sample(ckpt, "--tokenizer", tok_json, "--python", python, "--prompt", "hello world", "--ids",
                 "--max-new-tokens", "4", "--greedy").stdout
    text = sample(ckpt, "--tokenizer", tok_json, "--python", python, "--prompt", "hello world",
                  "--max-new-tokens", "4", "--greedy").stdout
    if [int(w) for w in got.split("|")[0].split()] != want or not text.startswith("hello world"):
        fail(f"--tokenizer: prompt ids {got!r} (the tokenizer's {want}), text {text!r}")
    print(f"ok  --tokenizer tokenizer.json: the prompt is the tokenizer's ids {want}; the text decodes back")


if __name__ == "__main__":
    main()
