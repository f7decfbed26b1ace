// Tests of the safetensors reader and writer (round trip, F16/BF16/F64 conversion, every malformed header
// refused with the file named) and of the GPT-2 name and Conv1D layout mapping to and from Hugging Face.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/hf_names.hpp"
#include "ckpt/safetensors.hpp"
#include "util/error.hpp"

using namespace piper;
namespace fs = std::filesystem;

namespace {

std::string temp_folder() {
  std::string t = (fs::temp_directory_path() / "piper-st-test-XXXXXX").string();
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

// A file of an 8-byte header length, `header` and `data`.
std::string raw_file(const std::string& dir, const std::string& name, const std::string& header,
                     const std::string& data, int64_t claimed = -1) {
  const std::string path = dir + "/" + name;
  std::ofstream f(path, std::ios::binary);
  uint64_t n = claimed >= 0 ? uint64_t(claimed) : header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << data;
  return path;
}

std::string bytes_of(const std::vector<uint16_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
}

}  // namespace

TEST_CASE("safetensors written by piper read back with names, shapes, values and metadata", "[safetensors]") {
  const std::string dir = temp_folder(), path = dir + "/m.safetensors";
  std::vector<NamedTensor> in = {{"a.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", {4}, {-1.5f, 0, 1e-30f, 3e30f}},
                                 {"empty", {0, 5}, {}}};
  write_safetensors(path, in, {{"format", "pt"}, {"note", "quote \" and \\ and\nnewline"}});
  SafetensorsFile out = read_safetensors(path);
  REQUIRE(out.tensors.size() == 3);
  for (size_t i = 0; i < in.size(); ++i) {
    CHECK(out.tensors[i].name == in[i].name);
    CHECK(out.tensors[i].shape == in[i].shape);
    CHECK(out.tensors[i].data == in[i].data);
  }
  CHECK(out.metadata.at("format") == "pt");
  CHECK(out.metadata.at("note") == "quote \" and \\ and\nnewline");
  CHECK_FALSE(fs::exists(dir + "/.m.safetensors.tmp"));
  fs::remove_all(dir);
}

TEST_CASE("safetensors F16, BF16 and F64 tensors are read as float32", "[safetensors]") {
  const std::string dir = temp_folder();
  // f16: 1, -2, 2^-24 (smallest subnormal), 65504 (largest); bf16: 1, -0.5
  const std::string f16 = bytes_of({0x3C00, 0xC000, 0x0001, 0x7BFF}), bf16 = bytes_of({0x3F80, 0xBF00});
  const double d[2] = {0.25, -3.0};
  const std::string f64(reinterpret_cast<const char*>(d), 16);
  const std::string header = R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                             R"("d":{"dtype":"F64","shape":[1,2],"data_offsets":[12,28]}})";
  SafetensorsFile f = read_safetensors(raw_file(dir, "x.safetensors", header, f16 + bf16 + f64));
  REQUIRE(f.tensors.size() == 3);
  CHECK(f.tensors[0].data == std::vector<float>{1.f, -2.f, 5.9604645e-08f, 65504.f});
  CHECK(f.tensors[1].data == std::vector<float>{1.f, -0.5f});
  CHECK(f.tensors[2].data == std::vector<float>{0.25f, -3.f});
  CHECK(f.tensors[2].shape == std::vector<int64_t>{1, 2});
  fs::remove_all(dir);
}

TEST_CASE("malformed safetensors files are refused with the file named", "[safetensors]") {
  const std::string dir = temp_folder();
  const std::string four(16, '\0');
  struct Case {
    const char* what;
    std::string header;
    std::string data;
    int64_t claimed;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"header longer than the file", "{}", "", 1000, "header length"},
      {"not JSON", "{\"a\": [1, 2", four, -1, "safetensors header"},
      {"text after the object", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x)", four, -1,
       "nothing after it"},
      {"offsets past the data", R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", four, -1, "outside"},
      {"size not dtype x shape", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", four, -1, "need"},
      {"overlapping tensors",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       four, -1, "overlap"},
      {"unknown dtype", R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", four, -1, "dtype I8"},
      {"negative dimension", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four, -1, "dimension"},
      {"no dtype", R"({"a":{"shape":[1],"data_offsets":[0,4]}})", four, -1, "no dtype"},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", "", -1, "__metadata__"}};
  int i = 0;
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string path = raw_file(dir, "bad" + std::to_string(i++) + ".safetensors", c.header, c.data, c.claimed);
    try {
      read_safetensors(path);
      FAIL("accepted");
    } catch (const UserError& e) {
      const std::string msg = e.what();
      CHECK(msg.find(path) != std::string::npos);
      CHECK(msg.find(c.says) != std::string::npos);
    }
  }
  CHECK_THROWS_AS(read_safetensors(dir + "/missing.safetensors"), UserError);
  fs::remove_all(dir);
}

TEST_CASE("GPT-2 parameters map to Hugging Face names and Conv1D layout and back", "[safetensors]") {
  NamedTensor qkv{"blocks.3.attn.qkv.weight", {6, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};  // (3C, C), C = 2
  NamedTensor hf = to_hf("gpt", qkv);
  CHECK(hf.name == "transformer.h.3.attn.c_attn.weight");
  CHECK(hf.shape == std::vector<int64_t>{2, 6});
  CHECK(hf.data == std::vector<float>{0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11});  // (C, 3C): transposed
  NamedTensor back = from_hf("gpt", hf, true);
  CHECK(back.name == qkv.name);
  CHECK(back.shape == qkv.shape);
  CHECK(back.data == qkv.data);
  CHECK(to_hf("gpt", {"wte", {1, 1}, {1}}).name == "transformer.wte.weight");
  CHECK(to_hf("gpt", {"blocks.0.ln2.bias", {1}, {1}}).name == "transformer.h.0.ln_2.bias");
  CHECK(from_hf("gpt", {"h.11.mlp.c_proj.bias", {1}, {1}}, true).name == "blocks.11.mlp.proj.bias");  // no prefix
  CHECK(from_hf("gpt", {"h.0.attn.bias", {1}, {1}}, true).name.empty());                           // mask buffer
  CHECK(from_hf("gpt", {"lm_head.weight", {1}, {1}}, true).name.empty());                          // tied head
  CHECK(from_hf("gpt", {"h.0.attn.c_attn.extra", {1}, {1}}, true).name == "h.0.attn.c_attn.extra");  // unknown: kept
  CHECK(to_hf("qwen3", {"model.norm.weight", {1}, {1}}).name == "model.norm.weight");
  CHECK(from_hf("qwen3", {"lm_head.weight", {1}, {1}}, false).name == "lm_head.weight");  // an untied head stays
  CHECK_THROWS_AS(to_hf("gpt", {"blocks.0.nope", {1}, {1}}), UserError);
}
