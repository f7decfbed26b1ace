// safetensors reading and writing (see safetensors.hpp), with the small JSON subset its header uses:
// objects, arrays, strings, integers.
#include "ckpt/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "util/error.hpp"
#include "util/precision.hpp"

namespace piper {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian bytes");

namespace {

// ---- JSON: just what a safetensors header holds ----
struct Json {
  enum Kind { Object, Array, String, Number, Literal } kind = Literal;
  std::string text;                                  // String: the value; Number/Literal: as written
  std::vector<std::string> keys;                     // Object: keys[i] names values[i]
  std::vector<Json> values;
  std::vector<Json> items;                           // Array
};

class JsonParser {
 public:
  JsonParser(const std::string& s, const std::string& file) : s_(s), file_(file) {}
  Json document() {
    Json v = value(0);
    skip();
    if (i_ != s_.size()) fail("text after the header's JSON object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw UserError(cat(file_, ": safetensors header, byte ", i_, ": ", what));
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  void expect(char c) {
    skip();
    if (i_ >= s_.size() || s_[i_] != c) fail(cat("expected '", c, "'"));
    ++i_;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          unsigned cp = 0;
          for (int k = 0; k < 4; ++k) {
            char h = s_[i_++];
            cp = cp * 16 + unsigned(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                    : (h >= 'a' && h <= 'f')                    ? h - 'a' + 10
                                    : (h >= 'A' && h <= 'F')                    ? h - 'A' + 10
                                                                                : (fail("bad \\u escape"), 0));
          }
          if (cp < 0x80) {
            out += char(cp);
          } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
          } else {
            out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: fail(cat("unknown escape \\", e));
      }
    }
  }
  Json value(int depth) {
    if (depth > 16) fail("nested too deeply");
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    char c = s_[i_];
    if (c == '{') {
      v.kind = Json::Object;
      ++i_;
      skip();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, v;
      while (true) {
        std::string key = string();
        expect(':');
        v.keys.push_back(key);
        v.values.push_back(value(depth + 1));
        skip();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      ++i_;
      skip();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, v;
      while (true) {
        v.items.push_back(value(depth + 1));
        skip();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::String;
      v.text = string();
      return v;
    }
    size_t b = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '+' ||
                              s_[i_] == '.'))
      ++i_;
    if (b == i_) fail(cat("unexpected character '", c, "'"));
    v.text = s_.substr(b, i_ - b);
    v.kind = (std::isdigit(static_cast<unsigned char>(v.text[0])) || v.text[0] == '-') ? Json::Number : Json::Literal;
    return v;
  }
  const std::string& s_;
  const std::string& file_;
  size_t i_ = 0;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
      out += b;
    } else out += c;
  }
  return out + "\"";
}

// A non-negative integer below 2^62, or -1.
int64_t json_count(const Json& v) {
  if (v.kind != Json::Number || v.text.empty() || v.text.size() > 18) return -1;
  int64_t n = 0;
  for (char c : v.text) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) return (sign ? -1.f : 1.f) * std::ldexp(float(man), -24);  // zero and subnormals
  uint32_t bits = exp == 31 ? sign | 0x7F800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  return std::bit_cast<float>(bits);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, bool bf16) {
  const uint64_t width = bf16 ? 2 : 4;
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      header += cat(it == metadata.begin() ? "" : ",", json_string(it->first), ":", json_string(it->second));
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    PIPER_CHECK(numel == int64_t(t.data.size()), "tensor ", t.name, " has ", t.data.size(), " values for ", numel);
    header += cat(first ? "" : ",", json_string(t.name), ":{\"dtype\":\"", bf16 ? "BF16" : "F32", "\",\"shape\":[");
    for (size_t i = 0; i < t.shape.size(); ++i) header += cat(i ? "," : "", t.shape[i]);
    header += cat("],\"data_offsets\":[", offset, ",", offset + uint64_t(numel) * width, "]}");
    offset += uint64_t(numel) * width;
    first = false;
  }
  header += "}";
  while (header.size() % 8) header += ' ';  // the data starts 8-byte aligned
  const fs::path final_path(path);
  const fs::path tmp = final_path.parent_path() / ("." + final_path.filename().string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(header.data(), std::streamsize(header.size()));
    std::vector<uint16_t> half;
    for (const NamedTensor& t : tensors) {
      if (t.data.empty()) continue;
      if (!bf16) {
        out.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size() * 4));
        continue;
      }
      half.resize(t.data.size());
      for (size_t i = 0; i < half.size(); ++i) half[i] = bf16_bits(t.data[i]);
      out.write(reinterpret_cast<const char*>(half.data()), std::streamsize(half.size() * 2));
    }
    out.flush();
    if (!out) {
      const int err = errno;
      std::error_code ec;
      fs::remove(tmp, ec);
      throw SystemError(cat(tmp.string(), ": cannot be written: ", std::strerror(err)));
    }
  }
  if (int fd = ::open(tmp.c_str(), O_RDONLY); fd >= 0) ::fsync(fd), ::close(fd);
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw SystemError(cat("cannot rename ", tmp.string(), " to ", path, ": ", ec.message()));
  }
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw UserError(cat(path, ": no such file"));
  const uint64_t size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  if (ec || size < 8 || !in.read(reinterpret_cast<char*>(&n), 8))
    throw UserError(cat(path, ": not a safetensors file (shorter than its 8-byte header length)"));
  if (n < 2 || n > size - 8 || n > (uint64_t(100) << 20))
    throw UserError(cat(path, ": not a safetensors file (header length ", n, " does not fit a file of ", size,
                        " bytes)"));
  std::string header(n, '\0');
  if (!in.read(header.data(), std::streamsize(n))) throw UserError(cat(path, ": header cannot be read"));
  while (!header.empty() && header.back() == ' ') header.pop_back();
  Json doc = JsonParser(header, path).document();
  if (doc.kind != Json::Object) throw UserError(cat(path, ": safetensors header is not a JSON object"));
  const uint64_t data_bytes = size - 8 - n;
  SafetensorsFile out;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  std::vector<std::pair<std::string, std::string>> dtypes;  // name, dtype
  std::vector<uint64_t> begins;
  for (size_t m = 0; m < doc.keys.size(); ++m) {
    const std::string& name = doc.keys[m];
    const Json& v = doc.values[m];
    if (name == "__metadata__") {
      if (v.kind != Json::Object) throw UserError(cat(path, ": __metadata__ is not an object"));
      for (size_t k = 0; k < v.keys.size(); ++k) {
        if (v.values[k].kind != Json::String)
          throw UserError(cat(path, ": __metadata__ value '", v.keys[k], "' is not a string"));
        out.metadata[v.keys[k]] = v.values[k].text;
      }
      continue;
    }
    auto where = [&](const std::string& what) { return UserError(cat(path, ": tensor '", name, "': ", what)); };
    if (v.kind != Json::Object) throw where("its entry is not an object");
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (size_t k = 0; k < v.keys.size(); ++k) {
      if (v.keys[k] == "dtype") dtype = &v.values[k];
      else if (v.keys[k] == "shape") shape = &v.values[k];
      else if (v.keys[k] == "data_offsets") offsets = &v.values[k];
    }
    if (!dtype || dtype->kind != Json::String) throw where("no dtype string");
    if (!shape || shape->kind != Json::Array) throw where("no shape array");
    if (!offsets || offsets->kind != Json::Array || offsets->items.size() != 2) throw where("no data_offsets pair");
    NamedTensor t;
    t.name = name;
    uint64_t numel = 1;
    for (const Json& d : shape->items) {
      int64_t k = json_count(d);
      if (k < 0) throw where("a dimension of its shape is not a non-negative integer");
      t.shape.push_back(k);
      numel = (k != 0 && numel > (uint64_t(1) << 40) / uint64_t(k)) ? (uint64_t(1) << 41) : numel * uint64_t(k);
    }
    const std::string& dt = dtype->text;
    const uint64_t width = dt == "F32" ? 4 : (dt == "F16" || dt == "BF16") ? 2 : dt == "F64" ? 8 : 0;
    if (width == 0) throw where(cat("dtype ", dt, " is not one piper-ckpt reads (F32, F16, BF16, F64)"));
    const int64_t b = json_count(offsets->items[0]), e = json_count(offsets->items[1]);
    if (b < 0 || e < b || uint64_t(e) > data_bytes)
      throw where(cat("data_offsets [", offsets->items[0].text, ", ", offsets->items[1].text, "] are outside the ",
                      data_bytes, " bytes of data"));
    if (uint64_t(e - b) != numel * width)
      throw where(cat("holds ", e - b, " bytes but dtype ", dt, " and its shape need ", numel * width));
    ranges.push_back({uint64_t(b), uint64_t(e), name});
    dtypes.emplace_back(name, dt);
    out.tensors.push_back(std::move(t));
  }
  std::vector<Range> sorted = ranges;
  std::sort(sorted.begin(), sorted.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].begin < sorted[i - 1].end)
      throw UserError(cat(path, ": tensors '", sorted[i - 1].name, "' and '", sorted[i].name, "' overlap"));
  std::vector<unsigned char> raw;
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    NamedTensor& t = out.tensors[i];
    const Range& r = ranges[i];
    raw.resize(size_t(r.end - r.begin));
    in.seekg(std::streamoff(8 + n + r.begin));
    if (!raw.empty() && !in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size())))
      throw UserError(cat(path, ": tensor '", t.name, "' cannot be read (truncated file)"));
    const std::string& dt = dtypes[i].second;
    const unsigned char* p = raw.data();
    if (dt == "F32") {
      t.data.resize(raw.size() / 4);
      if (!raw.empty()) std::memcpy(t.data.data(), p, raw.size());
    } else if (dt == "F64") {
      t.data.resize(raw.size() / 8);
      for (size_t k = 0; k < t.data.size(); ++k) t.data[k] = float(std::bit_cast<double>(load<uint64_t>(p + 8 * k)));
    } else {
      const bool bf16 = dt == "BF16";
      t.data.resize(raw.size() / 2);
      for (size_t k = 0; k < t.data.size(); ++k) {
        const uint16_t h = load<uint16_t>(p + 2 * k);
        t.data[k] = bf16 ? std::bit_cast<float>(uint32_t(h) << 16) : half_to_float(h);
      }
    }
  }
  return out;
}

}  // namespace piper
