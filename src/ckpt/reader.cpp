// Read-only checkpoint access for piper-ckpt (see reader.hpp): attributes as text, the dataset list, and
// whole tensors read as float32.
#include "ckpt/reader.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ckpt/checksum.hpp"
#include "ckpt/hdf5_util.hpp"
#include "ckpt/verify.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace piper {

namespace {

herr_t collect_dataset(hid_t root, const char* name, const H5L_info_t* info, void* out) {
  if (info->type != H5L_TYPE_HARD) return 0;
  H5O_info_t oi;
  if (H5Oget_info_by_name(root, name, &oi, H5P_DEFAULT) >= 0 && oi.type == H5O_TYPE_DATASET)
    static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

std::string float_text(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// The element type of a dataset as people name it: "float32", "int64", "uint8", "float64 big-endian", ...
std::string dtype_text(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bits = H5Tget_size(type) * 8;
  const std::string order = H5Tget_order(type) == H5T_ORDER_BE ? " big-endian" : "";
  switch (cls) {
    case H5T_FLOAT: return cat("float", bits, order);
    case H5T_INTEGER: return cat(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", bits, order);
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return cat("bitfield", bits);
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown type";
  }
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  h5::quiet();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw UserError(cat(path, ": no such file"));
  if (std::string why = not_regular_file(path); !why.empty()) throw UserError(cat(path, ": ", why));
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw UserError(cat(path, ": not a readable HDF5 file (not a checkpoint, or truncated)"));
  // An HDF5 file of another writer has none of the attributes the commands read: refused here, rather
  // than listed as a checkpoint whose every attribute is absent.
  std::string format;
  bool has_format = false, has_version = false;
  try {
    has_format = h5::read_attr_str(hid_t(file_), "format", format);
    has_version = h5::read_attr_i64(hid_t(file_), "format_version", format_version_);
  } catch (const UserError& e) {
    H5Fclose(hid_t(file_));
    throw UserError(cat(path, ": not a piper checkpoint: ", e.what()));
  }
  std::string why;
  if (!has_format) why = cat("no attribute format = \"", kCheckpointFormat, "\" (an HDF5 file of another writer)");
  else if (format != kCheckpointFormat) why = cat("its attribute format is \"", format, "\", not \"", kCheckpointFormat, "\"");
  else if (!has_version) why = "no attribute format_version";
  else if (format_version_ < 1 || format_version_ > kCheckpointVersion)
    why = cat("format version ", format_version_, "; this piper reads versions 1 to ", kCheckpointVersion);
  if (!why.empty()) {
    H5Fclose(hid_t(file_));
    throw UserError(cat(path, ": not a piper checkpoint: ", why));
  }
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Fclose(hid_t(file_));
}

std::vector<CheckpointAttribute> CheckpointReader::attributes() const {
  std::vector<CheckpointAttribute> out;
  std::vector<std::string> names;
  try {
    names = h5::attribute_names(hid_t(file_));
  } catch (const UserError& e) {
    throw UserError(cat(path_, ": ", e.what()));
  }
  for (const std::string& n : names) {
    CheckpointAttribute a;
    a.name = n;
    h5::Handle at(H5Aopen(hid_t(file_), n.c_str(), H5P_DEFAULT), H5Aclose);
    h5::Handle type(at.id < 0 ? -1 : H5Aget_type(at), H5Tclose);
    h5::Handle space(at.id < 0 ? -1 : H5Aget_space(at), H5Sclose);
    const H5T_class_t cls = type.id < 0 ? H5T_NO_CLASS : H5Tget_class(type);
    const bool scalar = space.id >= 0 && H5Sget_simple_extent_npoints(space) == 1;
    if (scalar && cls == H5T_INTEGER) {
      int64_t v = 0;
      a.kind = 'i';
      a.value = H5Aread(at, H5T_NATIVE_INT64, &v) < 0 ? "<unreadable>" : std::to_string(v);
    } else if (scalar && cls == H5T_FLOAT) {
      double v = 0;
      a.kind = 'f';
      a.value = H5Aread(at, H5T_NATIVE_DOUBLE, &v) < 0 ? "<unreadable>" : float_text(v);
    } else if (scalar && cls == H5T_STRING && H5Tis_variable_str(type) > 0) {
      a.kind = 's';
      try {
        h5::read_attr_str(hid_t(file_), n.c_str(), a.value);
      } catch (const UserError&) {
        a.value = "<unreadable>";
      }
    } else {
      a.kind = '?';
      a.value = "<not an integer, float or string scalar>";
    }
    out.push_back(a);
  }
  return out;
}

std::string CheckpointReader::attribute(const std::string& name, const std::string& fallback) const {
  for (const auto& a : attributes())
    if (a.name == name) return a.value;
  return fallback;
}

std::vector<CheckpointTensor> CheckpointReader::tensors() const {
  std::vector<std::string> paths;
  if (H5Lvisit(hid_t(file_), H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &paths) < 0)
    throw UserError(cat(path_, ": its groups cannot be listed (damaged file)"));
  std::sort(paths.begin(), paths.end());
  std::vector<CheckpointTensor> out;
  for (const std::string& p : paths) {
    CheckpointTensor t;
    t.path = p;
    h5::Handle ds(H5Dopen2(hid_t(file_), p.c_str(), H5P_DEFAULT), H5Dclose);
    h5::Handle space(ds.id < 0 ? -1 : H5Dget_space(ds), H5Sclose);
    h5::Handle type(ds.id < 0 ? -1 : H5Dget_type(ds), H5Tclose);
    const int nd = space.id < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    if (nd < 0 || type.id < 0) throw UserError(cat(path_, ": tensor '", p, "' has an unreadable shape or type (damaged file)"));
    t.dtype = dtype_text(type);
    t.element_bytes = int64_t(H5Tget_size(type));
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    t.numel = 1;
    for (hsize_t d : dims) t.shape.push_back(int64_t(d)), t.numel *= int64_t(d);
    t.stored_bytes = int64_t(H5Dget_storage_size(ds));
    out.push_back(t);
  }
  return out;
}

bool CheckpointReader::has_tensor(const std::string& path) const {
  for (const auto& t : tensors())
    if (t.path == path) return true;
  return false;
}

std::vector<float> CheckpointReader::read(const std::string& path) const {
  // Each step of the path must exist before H5Dopen2 may look at it (it fails, quietly, on a missing group).
  for (size_t at = path.find('/'); ; at = path.find('/', at + 1)) {
    const std::string prefix = path.substr(0, at);
    if (H5Lexists(hid_t(file_), prefix.c_str(), H5P_DEFAULT) <= 0)
      throw UserError(cat(path_, ": no tensor '", path, "' (piper-ckpt ls lists them)"));
    if (at == std::string::npos) break;
  }
  h5::Handle ds(H5Dopen2(hid_t(file_), path.c_str(), H5P_DEFAULT), H5Dclose);
  h5::Handle type(ds.id < 0 ? -1 : H5Dget_type(ds), H5Tclose);
  h5::Handle space(ds.id < 0 ? -1 : H5Dget_space(ds), H5Sclose);
  if (ds.id < 0 || type.id < 0 || space.id < 0)
    throw UserError(cat(path_, ": '", path, "' cannot be opened as a tensor (not a dataset, or a damaged file)"));
  if (H5Tequal(type, H5T_IEEE_F32LE) <= 0)
    throw UserError(cat(path_, ": tensor '", path, "' is not float32 (a checkpoint holds only float32)"));
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  const hsize_t stored = H5Dget_storage_size(ds);
  if (n < 0 || hsize_t(n) * 4 > stored + 4 * 1024)  // chunk checksums make storage a little larger, never smaller
    throw UserError(cat(path_, ": tensor '", path, "' claims ", n, " elements but stores ", stored, " bytes (damaged)"));
  std::vector<float> v(static_cast<size_t>(n));
  if (n > 0 && H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw UserError(cat(path_, ": tensor '", path, "' cannot be read: its data is damaged (checksum mismatch) or the ",
                        "file is truncated"));
  // Format version 3 records a hash of every block: a tensor without them, or that does not match them, is
  // not returned (as verify_checkpoint decides).
  if (format_version_ >= 3) {
    uint64_t block = 0;
    std::vector<uint64_t> recorded;
    try {
      recorded = recorded_block_hashes(ds, path, uint64_t(n), block);
    } catch (const UserError& e) {
      throw UserError(cat(path_, ": ", e.what()));
    }
    BlockHasher hasher(block * sizeof(float));
    hasher.add(v.data(), v.size() * sizeof(float));
    if (hasher.finish() != recorded)
      throw UserError(cat(path_, ": tensor '", path, "' is damaged (checksum mismatch): its values do not match their recorded block hashes"));
  }
  return v;
}

}  // namespace piper
