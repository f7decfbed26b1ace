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
  int64_t stored_bytes = 0;    // bytes on disk
};

class CheckpointReader {
 public:
  // Throws UserError "PATH: ..." when the file is missing or not a readable HDF5 file.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  // Root attributes in name (byte) order.
  std::vector<CheckpointAttribute> attributes() const;
  // One attribute's text, or `fallback` when it is absent.
  std::string attribute(const std::string& name, const std::string& fallback = "") const;
  // Every dataset, by path in byte order.
  std::vector<CheckpointTensor> tensors() const;
  bool has_tensor(const std::string& path) const;
  // The whole tensor as float32, row-major. Throws UserError naming the file and the tensor when it is
  // missing, not float32, or cannot be read (damaged: Fletcher32 mismatch in version 2, a block that does
  // not match its recorded hash in version 3).
  std::vector<float> read(const std::string& path) const;

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
};

}  // namespace piper
