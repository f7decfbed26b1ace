// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the bytes. piper-ckpt writes F32 or BF16 and reads F32/F16/BF16/F64.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace piper {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, numel(shape) values
};

// Writes `tensors` as F32, or as BF16 (each value rounded to nearest, ties to even), with `metadata`
// ("__metadata__", strings only) to `path`, through a temporary file in the same folder renamed into place.
// Throws SystemError naming the file when it cannot be written.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, bool bf16 = false);

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;              // in header order, converted to float32
  std::map<std::string, std::string> metadata;   // "__metadata__"
};

// Reads a whole file. Throws UserError "PATH: what is wrong" for anything that is not a well-formed
// safetensors file: a header that is not JSON, byte ranges outside the data or overlapping, a size that
// does not match dtype × shape, a dtype other than F32, F16, BF16, F64.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace piper
