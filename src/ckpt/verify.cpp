// Checkpoint verification (see verify.hpp): reads every attribute and every dataset of one file and
// reports the first thing that is wrong as a UserError naming the file.
#include "ckpt/verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "ckpt/checksum.hpp"
#include "ckpt/hdf5_util.hpp"

namespace piper {

namespace fs = std::filesystem;

namespace {

struct Link {
  std::string path;
  bool hard;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* out) {
  static_cast<std::vector<Link>*>(out)->push_back({name, info->type == H5L_TYPE_HARD});
  return 0;
}

std::string elements_text(uint64_t a, uint64_t b) { return cat("elements ", a, " to ", b); }

// Reads a dataset in blocks of whole rows (about 1 Mi elements) as stored, hashing its bytes: it must be
// float32, stored whole, and hold finite values only. Version 3 with `read_data` false checks the shape,
// the storage and the recorded block checksums without reading the tensor (its writers checked it).
DatasetDigest read_dataset(hid_t file, const std::string& path, int64_t version, bool read_data) {
  h5::Handle ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds.id < 0) throw UserError(cat("tensor '", path, "' cannot be opened"));
  h5::Handle type(H5Dget_type(ds), H5Tclose), space(H5Dget_space(ds), H5Sclose);
  int nd = space.id < 0 ? -1 : H5Sget_simple_extent_ndims(space);
  if (type.id < 0 || nd < 0) throw UserError(cat("tensor '", path, "' has an unreadable type or shape"));
  if (H5Tdetect_class(type, H5T_VLEN) > 0 || H5Tis_variable_str(type) > 0)
    throw UserError(cat("dataset '", path, "' holds variable-length data; a checkpoint holds tensors only"));
  DatasetDigest d;
  d.path = path;
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  d.dims.assign(dims.begin(), dims.end());
  d.element_size = H5Tget_size(type);
  const bool f32 = H5Tequal(type, H5T_IEEE_F32LE) > 0;
  if (!f32) throw UserError(cat("tensor '", path, "' is not float32 little-endian; a checkpoint holds only those"));
  // piper writes every element: a shape that claims more than is stored (or than the whole file) would be read
  // as fill values, for as long as the shape says. Counted in 128 bits, so that no product of dimensions wraps.
  hsize_t file_bytes = 0;
  H5Fget_filesize(file, &file_bytes);
  const hsize_t stored = H5Dget_storage_size(ds);
  const unsigned __int128 cap = (unsigned __int128)1 << 100;
  unsigned __int128 elems = 1;
  for (hsize_t n : dims) elems = (n != 0 && elems > cap / n) ? cap : elems * n;
  if (elems * 4 > std::min(stored, file_bytes))
    throw UserError(cat("tensor '", path, "' has a shape of ", h5::dims_text(dims), " but only ", stored,
                        " bytes of it are stored (a damaged shape, or parts never written)"));
  const uint64_t numel = uint64_t(elems);
  std::vector<uint64_t> recorded;
  if (version >= 3) {
    recorded = recorded_block_hashes(ds, path, numel, d.block_elements);
    if (!read_data) {
      d.block_hashes = std::move(recorded);
      return d;
    }
  }
  const hsize_t rows = nd == 0 ? 1 : dims[0];
  hsize_t row_elems = 1;
  for (int i = 1; i < nd; ++i) row_elems *= dims[size_t(i)];
  const hsize_t block = std::max<hsize_t>(1, (hsize_t(1) << 20) / std::max<hsize_t>(1, row_elems));
  std::vector<unsigned char> buf;
  Fnv1a64 h;
  BlockHasher blocks(std::max<uint64_t>(1, d.block_elements) * 4);
  for (hsize_t r0 = 0; r0 < rows && row_elems > 0; r0 += block) {
    const hsize_t n = std::min(block, rows - r0) * row_elems;
    buf.resize(size_t(n * d.element_size));
    herr_t rc;
    if (nd == 0) {
      rc = H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    } else {
      std::vector<hsize_t> start(size_t(nd), 0), count = dims;
      start[0] = r0;
      count[0] = n / row_elems;
      // The memory space has the selection's own shape: HDF5 then copies whole rows, where a 1-D memory
      // space against an N-D selection makes it map every element on its own (ten times slower).
      h5::Handle mem(H5Screate_simple(nd, count.data(), nullptr), H5Sclose);
      rc = H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
      if (rc >= 0) rc = H5Dread(ds, type, mem, space, H5P_DEFAULT, buf.data());
    }
    if (rc < 0) {
      std::string why = h5::innermost_error();
      throw UserError(cat("tensor '", path, "' cannot be read: its data is damaged (checksum mismatch) or the file is ",
                          "truncated", why.empty() ? "" : cat(" [", why, "]")));
    }
    if (version >= 3) blocks.add(buf.data(), buf.size());
    else h.add(buf.data(), buf.size());
    for (hsize_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, buf.data() + i * 4, 4);
      if (!std::isfinite(v))
        throw UserError(
            cat("tensor '", path, "' holds a non-finite value (", v, " at element ", r0 * row_elems + i, ")"));
    }
  }
  if (version < 3) {
    d.bytes_hash = h.value();
    return d;
  }
  d.block_hashes = blocks.finish();
  for (size_t i = 0; i < d.block_hashes.size() && i < recorded.size(); ++i)
    if (d.block_hashes[i] != recorded[i])
      throw UserError(cat("tensor '", path, "' is damaged (checksum mismatch): its block ", i, " (",
                          elements_text(i * d.block_elements, std::min<uint64_t>(numel, (i + 1) * d.block_elements) - 1),
                          ") does not match its recorded hash"));
  return d;
}

CheckpointInfo check_contents(hid_t file, const std::string& name, bool read_data) {
  CheckpointInfo info;
  std::string format;
  if (!h5::read_attr_str(file, "format", format) || format != kCheckpointFormat)
    throw UserError(cat("not a piper checkpoint (no attribute format = \"", kCheckpointFormat, "\")"));
  if (!h5::read_attr_i64(file, "format_version", info.format_version))
    throw UserError("has no attribute 'format_version'");
  if (info.format_version < 1 || info.format_version > kCheckpointVersion)
    throw UserError(cat("checkpoint format version ", info.format_version, "; this piper reads versions 1 to ",
                        kCheckpointVersion));
  if (!h5::read_attr_i64(file, "step", info.step)) throw UserError("has no attribute 'step'");
  if (info.step < 0) throw UserError(cat("attribute 'step' is negative (", info.step, ")"));
  if (!h5::read_attr_str(file, "job_name", info.job_name)) info.job_name.clear();
  if (name.size() > 8 && name.rfind("step_", 0) == 0 && name.substr(name.size() - 3) == ".h5") {
    const std::string digits = name.substr(5, name.size() - 8);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits.size() > 18)
      throw UserError(cat("file name '", name, "' is not step_<number>.h5"));
    if (std::stoll(digits) != info.step)
      throw UserError(cat("its name says step ", std::stoll(digits), " but its attribute 'step' is ", info.step,
                          " (renamed, or damaged)"));
  }
  std::vector<Link> links;
  if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect_link, &links) < 0)
    throw UserError("its groups cannot be listed (damaged file)");
  std::vector<DatasetDigest> digests;
  for (const Link& l : links) {
    if (!l.hard) throw UserError(cat("'", l.path, "' is a link to elsewhere; a checkpoint holds its tensors itself"));
    h5::Handle obj(H5Oopen(file, l.path.c_str(), H5P_DEFAULT), H5Oclose);
    if (obj.id < 0) throw UserError(cat("object '", l.path, "' cannot be opened (damaged file)"));
    if (H5Iget_type(obj) == H5I_DATASET) digests.push_back(read_dataset(file, l.path, info.format_version, read_data));
  }
  auto is_param = [](const DatasetDigest& d) { return d.path.rfind("params/", 0) == 0; };
  if (!std::any_of(digests.begin(), digests.end(), is_param))
    throw UserError("holds no tensor under /params");
  if (info.format_version >= 2) {
    std::string recorded;
    if (!h5::read_attr_str(file, kChecksumAttribute, recorded))
      throw UserError(cat("has no attribute '", kChecksumAttribute, "' (format version ", info.format_version,
                          " has one)"));
    const std::string actual = checksum_text(checkpoint_checksum(file, digests));
    if (recorded != actual)
      throw UserError(cat("checksum mismatch: the file records ", recorded, " but its contents give ", actual,
                          " (the file was changed or damaged after it was written)"));
    info.checksummed = true;
  }
  return info;
}

}  // namespace

std::vector<uint64_t> recorded_block_hashes(hid_t ds, const std::string& path, uint64_t numel, uint64_t& block) {
  int64_t b = 0;
  std::vector<uint64_t> hashes;
  try {
    if (!h5::read_attr_i64(ds, kBlockElementsAttribute, b) || !h5::read_attr_u64s(ds, kBlockHashesAttribute, hashes))
      throw UserError(cat("has no attributes '", kBlockElementsAttribute, "' and '", kBlockHashesAttribute,
                          "' (format version 3 records them)"));
  } catch (const UserError& e) {
    throw UserError(cat("tensor '", path, "': ", e.what()));
  }
  if (b <= 0) throw UserError(cat("tensor '", path, "': attribute '", kBlockElementsAttribute, "' is ", b));
  block = uint64_t(b);
  if (hashes.size() != checksum_block_count(numel, block))
    throw UserError(cat("tensor '", path, "' records ", hashes.size(), " block checksums but its ", numel,
                        " elements make ", checksum_block_count(numel, block), " blocks of ", block));
  return hashes;
}

CheckpointInfo verify_checkpoint(const std::string& path, const std::string& name, bool read_data) {
  h5::quiet();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UserError(cat(path, ": no checkpoint file (it does not exist)"));
  if (!fs::is_regular_file(path, ec)) throw UserError(cat(path, ": not a regular file"));
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.id < 0) {
    std::string why = h5::innermost_error();
    throw UserError(cat(path, ": not a readable HDF5 file (not a checkpoint, or truncated)",
                        why.empty() ? "" : cat(" [", why, "]")));
  }
  try {
    return check_contents(file, name.empty() ? fs::path(path).filename().string() : name, read_data);
  } catch (const UserError& e) {
    throw UserError(cat(path, ": ", e.what()));
  }
}

}  // namespace piper
