// Read-only access to one checkpoint file for inspection (piper-ckpt): its root attributes as text, its
// tensors with shapes, and any tensor's values, without a model or a plan.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace piper {

struct CheckpointAttribute {
  std::string name;
  char kind = 's';    // 'i' integer, 'f' float, 's' string, '?' another type
  std::string value;  // as text: the number, or the string itself
};

struct CheckpointTensor {
  std::string path;            // from the root: "params/wte"
  std::vector<int64_t> shape;  // logical shape; a scalar has none
  int64_t numel = 0;
  std::string dtype;           // as stored: "float32", "float64", "int64", "float32 big-endian", "string", ...
  int64_t element_bytes = 0;   // bytes of one element as stored
  int64_t stored_bytes = 0;    // bytes on disk
};

class CheckpointReader {
 public:
  // Throws UserError "PATH: ..." when the file is missing, not a regular file, not a readable HDF5 file, or
  // not a piper checkpoint (no attribute format = "piper-checkpoint", or a format version this piper
  // does not read).
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t format_version() const { return format_version_; }
  // Root attributes in name (byte) order.
  std::vector<CheckpointAttribute> attributes() const;
  // One attribute's text, or `fallback` when it is absent.
  std::string attribute(const std::string& name, const std::string& fallback = "") const;
  // Every dataset, by path in byte order.
  std::vector<CheckpointTensor> tensors() const;
  bool has_tensor(const std::string& path) const;
  // The whole tensor as float32, row-major. Throws UserError naming the file and the tensor when it is
  // missing, not float32, or cannot be read (damaged: Fletcher32 mismatch in version 2; in version 3 no
  // recorded block hashes, or a block that does not match its hash).
  std::vector<float> read(const std::string& path) const;

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
  int64_t format_version_ = 0;
};

}  // namespace piper
