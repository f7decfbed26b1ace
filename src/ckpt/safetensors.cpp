// safetensors reading and writing (see safetensors.hpp); the JSON header through nlohmann-json, in the file's
// order.
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

#include <nlohmann/json.hpp>

#include "util/error.hpp"
#include "util/precision.hpp"

namespace piper {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian bytes");

namespace {

using Json = nlohmann::ordered_json;  // keeps the header's order: tensors are listed as the file lists them

// A non-negative integer below 2^62, or -1.
int64_t json_count(const Json& v) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return -1;
  const uint64_t n = v.get<uint64_t>();
  return n < (uint64_t(1) << 62) ? int64_t(n) : -1;
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
  Json doc = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    doc["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    PIPER_CHECK(numel == int64_t(t.data.size()), "tensor ", t.name, " has ", t.data.size(), " values for ", numel);
    const uint64_t end = offset + uint64_t(numel) * width;
    doc[t.name] = Json{{"dtype", bf16 ? "BF16" : "F32"}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string header = doc.dump();
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
  Json doc;
  try {
    doc = Json::parse(header);
  } catch (const Json::exception& e) {  // a syntax error, or a number past what it holds
    throw UserError(cat(path, ": safetensors header is not one JSON object with nothing after it (", e.what(), ")"));
  }
  if (!doc.is_object()) throw UserError(cat(path, ": safetensors header is not a JSON object"));
  const uint64_t data_bytes = size - 8 - n;
  SafetensorsFile out;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  std::vector<std::pair<std::string, std::string>> dtypes;  // name, dtype
  std::vector<uint64_t> begins;
  try {  // a value of an unexpected type is refused by the checks below; any other error of the library here too
    for (const auto& item : doc.items()) {
      const std::string& name = item.key();  // (not a structured binding: clang 14 cannot capture one below)
      const Json& v = item.value();
      if (name == "__metadata__") {
        if (!v.is_object()) throw UserError(cat(path, ": __metadata__ is not an object"));
        for (const auto& [key, value] : v.items()) {
          if (!value.is_string()) throw UserError(cat(path, ": __metadata__ value '", key, "' is not a string"));
          out.metadata[key] = value.get<std::string>();
        }
        continue;
      }
      auto where = [&](const std::string& what) { return UserError(cat(path, ": tensor '", name, "': ", what)); };
      if (!v.is_object()) throw where("its entry is not an object");
      const Json* dtype = v.contains("dtype") ? &v["dtype"] : nullptr;
      const Json* shape = v.contains("shape") ? &v["shape"] : nullptr;
      const Json* offsets = v.contains("data_offsets") ? &v["data_offsets"] : nullptr;
      if (!dtype || !dtype->is_string()) throw where("no dtype string");
      if (!shape || !shape->is_array()) throw where("no shape array");
      if (!offsets || !offsets->is_array() || offsets->size() != 2) throw where("no data_offsets pair");
      NamedTensor t;
      t.name = name;
      uint64_t numel = 1;
      for (const Json& d : *shape) {
        int64_t k = json_count(d);
        if (k < 0) throw where("a dimension of its shape is not a non-negative integer");
        t.shape.push_back(k);
        numel = (k != 0 && numel > (uint64_t(1) << 40) / uint64_t(k)) ? (uint64_t(1) << 41) : numel * uint64_t(k);
      }
      const std::string dt = dtype->get<std::string>();
      const uint64_t width = dt == "F32" ? 4 : (dt == "F16" || dt == "BF16") ? 2 : dt == "F64" ? 8 : 0;
      if (width == 0) throw where(cat("dtype ", dt, " is not one piper-ckpt reads (F32, F16, BF16, F64)"));
      const int64_t b = json_count((*offsets)[0]), e = json_count((*offsets)[1]);
      if (b < 0 || e < b || uint64_t(e) > data_bytes)
        throw where(cat("data_offsets ", offsets->dump(), " are outside the ", data_bytes, " bytes of data"));
      if (uint64_t(e - b) != numel * width)
        throw where(cat("holds ", e - b, " bytes but dtype ", dt, " and its shape need ", numel * width));
      ranges.push_back({uint64_t(b), uint64_t(e), name});
      dtypes.emplace_back(name, dt);
      out.tensors.push_back(std::move(t));
    }
  } catch (const Json::exception& e) {
    throw UserError(cat(path, ": safetensors header: ", e.what()));
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
