// `piper sample`: the checkpoint's model (its `model` attribute read as a job's [model]), its weights on the
// backend asked for, the prompt through the byte codec or a tokenizer.json, then one forward per new token.
#include "app/sample.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "app/token_codec.hpp"
#include "app/token_picker.hpp"
#include "backend/backend.hpp"
#include "ckpt/reader.hpp"
#include "ckpt/verify.hpp"
#include "config/load.hpp"
#include "model/build.hpp"
#include "model/family.hpp"
#include "runtime/forward_pass.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"
#include "util/rng.hpp"
#include "util/usable_cores.hpp"

namespace piper {

const char* sample_usage() {
  return "usage: piper sample CHECKPOINT.h5 [--prompt TEXT | --prompt-ids ID,ID,...] [options]\n"
         "  --tokenizer FILE       a Hugging Face tokenizer.json (through tools/tokenizer-codec.py and the tokenizers\n"
         "                         package); default: UTF-8 bytes as ids 0..255, 256 as end of document\n"
         "  --max-new-tokens N     tokens to generate (default 64); generation also stops at the end-of-document id\n"
         "  --greedy               the most likely token each time (the same as --temperature 0)\n"
         "  --temperature T        divide the logits by T before drawing (default 1)\n"
         "  --top-k K              draw among the K most likely tokens only (default 0: all)\n"
         "  --top-p P              then among the fewest most likely whose probability reaches P (default 1: all)\n"
         "  --seed S               the draws' seed (default 0): the same seed, the same continuation\n"
         "  --stop-id ID           another id that ends the continuation (repeatable); --no-stop: none ends it\n"
         "  --backend cpu|cuda     where the forward runs (default cpu); --threads N: CPU threads (default: cores)\n"
         "  --precision fp32|bf16  the matmuls' operands (default fp32; the weights are the checkpoint's fp32 master)\n"
         "  --ids                  print the ids (prompt, then continuation) instead of text\n"
         "  --logits-out FILE      write the first new token's logits (vocab float32, little-endian)\n"
         "  --python PATH          the Python that runs the tokenizer (default python3)\n"
         "The context is the model's seq_len: past it, the oldest tokens are dropped.\n"
         "exit codes: 0 done, 2 bad input (a message names the option or the file)\n";
}

namespace {

struct SampleOptions {
  std::string checkpoint, prompt, tokenizer, logits_out, backend = "cpu", python = "python3";
  std::vector<int32_t> prompt_ids, stop_ids;
  bool has_prompt = false, has_prompt_ids = false, print_ids = false, no_stop = false;
  int64_t max_new = 64;
  uint64_t seed = 0;
  int threads = 0;
  Precision precision = Precision::Fp32;
  SamplingRule rule;
};

double number(const std::string& option, const std::string& text, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !(v >= lo && v <= hi))
    throw UserError(cat(option, " ", text, ": expected a number from ", lo, " to ", hi));
  return v;
}

int64_t whole(const std::string& option, const std::string& text, double lo, double hi) {
  const double v = number(option, text, lo, hi);
  if (v != double(int64_t(v))) throw UserError(cat(option, " ", text, ": expected a whole number"));
  return int64_t(v);
}

SampleOptions parse(const std::vector<std::string>& args) {
  SampleOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw UserError(cat(a, ": expected a value after it"));
      return args[++i];
    };
    if (a == "--prompt") o.prompt = value(), o.has_prompt = true;
    else if (a == "--prompt-ids") {
      const std::string& list = value();
      o.has_prompt_ids = true;
      size_t at = 0;
      while (at <= list.size()) {
        const size_t end = std::min(list.find(',', at), list.size());
        o.prompt_ids.push_back(int32_t(whole("--prompt-ids", list.substr(at, end - at), 0, INT32_MAX)));
        at = end + 1;
      }
    } else if (a == "--tokenizer") o.tokenizer = value();
    else if (a == "--max-new-tokens") o.max_new = whole(a, value(), 0, 1e9);
    else if (a == "--greedy") o.rule.temperature = 0;
    else if (a == "--temperature") o.rule.temperature = number(a, value(), 0, 1e6);
    else if (a == "--top-k") o.rule.top_k = int(whole(a, value(), 0, INT32_MAX));
    else if (a == "--top-p") {
      o.rule.top_p = number(a, value(), 0, 1);
      if (o.rule.top_p <= 0) throw UserError("--top-p 0: expected a probability above 0 (1 keeps every token)");
    } else if (a == "--seed") o.seed = uint64_t(whole(a, value(), 0, 9.0e15));
    else if (a == "--stop-id") o.stop_ids.push_back(int32_t(whole(a, value(), 0, INT32_MAX)));
    else if (a == "--no-stop") o.no_stop = true;
    else if (a == "--backend") {
      o.backend = value();
      if (o.backend != "cpu" && o.backend != "cuda") throw UserError(cat("--backend ", o.backend, ": expected cpu or cuda"));
    } else if (a == "--threads") o.threads = int(whole(a, value(), 1, 4096));
    else if (a == "--precision") {
      const std::string& p = value();
      if (p != "fp32" && p != "bf16") throw UserError(cat("--precision ", p, ": expected fp32 or bf16"));
      o.precision = p == "bf16" ? Precision::Bf16 : Precision::Fp32;
    } else if (a == "--ids") o.print_ids = true;
    else if (a == "--logits-out") o.logits_out = value();
    else if (a == "--python") o.python = value();
    else if (!a.empty() && a[0] == '-') throw UserError(cat("sample: unknown option '", a, "' (piper sample --help)"));
    else if (o.checkpoint.empty()) o.checkpoint = a;
    else throw UserError(cat("sample: a second checkpoint '", a, "': one is sampled at a time"));
  }
  if (o.checkpoint.empty()) throw UserError("sample: which checkpoint? (piper sample CHECKPOINT.h5 --prompt TEXT)");
  if (o.has_prompt && o.has_prompt_ids) throw UserError("sample: --prompt or --prompt-ids, not both");
  if (!o.has_prompt && !o.has_prompt_ids) throw UserError("sample: --prompt TEXT or --prompt-ids ID,... is required");
  return o;
}

// The checkpoint's model: its `model` attribute ("kind=qwen3 vocab=... d_ff=...") read as a job's [model] table,
// with every check a job file gets.
ModelSpec checkpoint_model(const CheckpointReader& r) {
  const auto keys = parse_model_keys_text(r.attribute("model"));
  std::string kind;
  for (const auto& [k, v] : keys)
    if (k == "kind") kind = v;
  if (kind.empty())
    throw UserError(cat(r.path(), ": has no 'model' attribute naming its family (written by an older piper)"));
  const Family* family = find_family(kind);
  if (!family) throw UserError(cat(r.path(), ": model.kind '", kind, "' is not a family this piper knows"));
  if (!family->reads_tokens)
    throw UserError(cat(r.path(), ": model.kind = \"", kind, "\" is not a language model: there are no tokens to sample"));
  // An optional table ([model.moe]) whose first key is 0 was not in the job: its keys are left out again.
  std::map<std::string, std::string> first_of_table;
  for (const ModelKey& k : family->keys)
    if (const std::string t = key_table_of(k); !t.empty() && !first_of_table.count(t))
      for (const auto& [name, v] : keys)
        if (name == k.name) first_of_table[t] = v;
  std::string text = cat("[model]\nkind = \"", kind, "\"\n");
  for (const auto& [k, v] : keys) {
    const size_t dot = k.find('.');
    if (k == "kind" || (dot != std::string::npos && first_of_table[k.substr(0, dot)] == "0")) continue;
    text += cat(k, " = ", v, "\n");
  }
  return load_model_text(text, r.path() + " (its model attribute)");
}

void write_logits(const std::string& path, const std::vector<float>& logits) {
  const std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
    if (!f.flush()) throw SystemError(cat("--logits-out ", path, ": cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw SystemError(cat("--logits-out ", path, ": cannot rename ", tmp, ": ", ec.message()));
}

}  // namespace

int sample_command(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      std::printf("%s", sample_usage());
      return kExitOk;
    }
  const SampleOptions o = parse(args);
  CheckpointReader reader(o.checkpoint);
  verify_checkpoint(reader.path(), "", /*read_data=*/false);  // then each tensor read is checked by its hashes
  const ModelSpec spec = checkpoint_model(reader);
  Model model = build_model(spec);
  model.dims.bf16_matmul_inputs = o.precision == Precision::Bf16;

  std::unique_ptr<TokenCodec> codec =
      o.tokenizer.empty() ? byte_codec(spec.vocab) : tokenizer_json_codec(o.tokenizer, o.python);
  std::vector<int32_t> context = o.has_prompt ? codec->encode(o.prompt) : o.prompt_ids;
  if (context.empty()) throw UserError("sample: the prompt is empty (it needs at least one token)");
  for (int32_t id : context)
    if (id < 0 || id >= spec.vocab)
      throw UserError(cat("sample: prompt id ", id, " is outside the model's vocabulary 0 .. ", spec.vocab - 1,
                          o.tokenizer.empty() ? "" : cat(" (", o.tokenizer, " gave it)")));
  std::vector<int32_t> stops = o.stop_ids;
  if (!o.no_stop && codec->end_of_document() >= 0 && codec->end_of_document() < spec.vocab)
    stops.push_back(codec->end_of_document());
  if (o.no_stop) stops.clear();

  std::unique_ptr<Backend> backend = make_backend(o.backend, o.threads > 0 ? o.threads : usable_cores(), 0);
  backend->kernels().set_matmul_precision(o.precision);
  ForwardPass pass(model, *backend);
  for (size_t p = 0; p < model.params.size(); ++p) pass.set_param(p, reader.read("params/" + model.params[p].name));

  const std::vector<int32_t> prompt = context;
  std::vector<int32_t> generated;
  const uint64_t key = stream_key(o.seed, "sample");
  std::string ended = "--max-new-tokens";
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.max_new; ++i) {
    const size_t window = std::min(context.size(), size_t(pass.max_context()));
    const std::vector<int32_t> visible(context.end() - std::ptrdiff_t(window), context.end());
    const std::vector<float> logits = pass.next_logits(visible);
    if (i == 0 && !o.logits_out.empty()) write_logits(o.logits_out, logits);
    const double u = double(random_u64(key, uint64_t(i)) >> 11) * 0x1.0p-53;  // [0, 1)
    const int32_t id = pick_token(logits, o.rule, u);
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      ended = cat("id ", id, id == codec->end_of_document() ? " (end of document)" : " (--stop-id)");
      break;
    }
    generated.push_back(id);
    context.push_back(id);
  }
  if (o.max_new == 0 && !o.logits_out.empty()) write_logits(o.logits_out, pass.next_logits(context));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (o.print_ids) {
    std::string line;
    for (int32_t id : prompt) line += cat(line.empty() ? "" : " ", id);
    line += " |";
    for (int32_t id : generated) line += cat(" ", id);
    std::printf("%s\n", line.c_str());
  } else {
    std::vector<int32_t> all = prompt;  // decoded whole: a character may span the prompt's last token and the next
    all.insert(all.end(), generated.begin(), generated.end());
    std::printf("%s\n", codec->decode(all).c_str());
  }
  std::fflush(stdout);
  std::fprintf(stderr, "piper sample: %zu new tokens in %.2f s (%.1f tokens/s), %s %s, %s, stopped by %s\n",
               generated.size(), seconds, seconds > 0 ? double(generated.size()) / seconds : 0.0,
               backend->name().c_str(), precision_name(o.precision), codec->describe().c_str(), ended.c_str());
  return kExitOk;
}

}  // namespace piper
