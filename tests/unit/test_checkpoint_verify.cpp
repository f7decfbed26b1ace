// Checkpoint checksum and verification on small HDF5 files written here: FNV-1a's reference values, a
// checksum that ignores attribute order but covers every attribute (also one added later) and every byte
// of every dataset, version 3's block hashes, and verify_checkpoint's verdict on changed, non-finite,
// misnamed, version-1 and damaged version-3 files.
#include <catch2/catch.hpp>

#include <hdf5.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/checksum.hpp"
#include "ckpt/file_writer.hpp"
#include "ckpt/hdf5_util.hpp"
#include "ckpt/verify.hpp"

using namespace piper;
namespace fs = std::filesystem;

namespace {

uint64_t fnv(const std::string& s) {
  Fnv1a64 h;
  h.add(s.data(), s.size());
  return h.value();
}

std::string temp_folder() {
  std::string t = (fs::temp_directory_path() / "piper-ckpt-test-XXXXXX").string();
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

struct FileSpec {
  int64_t version = 2;
  int64_t step = 5;
  bool attributes_reversed = false;  // create the attributes in the other order
  std::vector<float> values = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
};

// A minimal checkpoint: the required attributes, params/w (2, 3) with Fletcher32, and (version 2) its
// checksum computed the way save_checkpoint does, from the values in memory.
void write_file(const std::string& path, const FileSpec& f) {
  h5::quiet();
  h5::Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  REQUIRE(file.id >= 0);
  auto attrs = [&] {
    h5::write_attr_str(file, "format", kCheckpointFormat);
    h5::write_attr_i64(file, "format_version", f.version);
    h5::write_attr_i64(file, "step", f.step);
    h5::write_attr_str(file, "job", "[job]\nname = \"x\"\n");
  };
  if (!f.attributes_reversed) attrs();
  h5::Handle group(H5Gcreate2(file, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  hsize_t dims[2] = {2, 3};
  h5::Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose), dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl, 2, dims);
  H5Pset_fletcher32(dcpl);
  h5::Handle ds(H5Dcreate2(group, "w", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  REQUIRE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, f.values.data()) >= 0);
  if (f.attributes_reversed) {
    h5::write_attr_str(file, "job", "[job]\nname = \"x\"\n");
    h5::write_attr_i64(file, "step", f.step);
    h5::write_attr_i64(file, "format_version", f.version);
    h5::write_attr_str(file, "format", kCheckpointFormat);
  }
  if (f.version >= 2) {
    Fnv1a64 h;
    h.add(f.values.data(), f.values.size() * sizeof(float));
    DatasetDigest d;  // version 2: one hash of all the bytes
    d.path = "params/w", d.dims = {2, 3}, d.element_size = 4, d.bytes_hash = h.value();
    h5::write_attr_str(file, kChecksumAttribute, checksum_text(checkpoint_checksum(file, {d})));
  }
}

std::string recorded_checksum(const std::string& path) {
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  std::string s;
  REQUIRE(h5::read_attr_str(file, kChecksumAttribute, s));
  return s;
}

// Opens the file for writing and lets `change` alter it.
template <typename F>
void change_file(const std::string& path, F change) {
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  REQUIRE(file.id >= 0);
  change(hid_t(file));
}

std::string verify_error(const std::string& path) {
  try {
    verify_checkpoint(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("FNV-1a 64 matches its reference values", "[checkpoint]") {
  CHECK(fnv("") == 0xcbf29ce484222325ull);
  CHECK(fnv("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv("foobar") == 0x85944171f73967e8ull);
  Fnv1a64 h;
  h.add_u64(1);
  CHECK(h.value() == fnv(std::string("\x01\0\0\0\0\0\0\0", 8)));
  CHECK(checksum_text(0xabcull) == "fnv1a64:0000000000000abc");
}

TEST_CASE("the checksum covers every attribute and every dataset byte, in name order", "[checkpoint]") {
  const std::string dir = temp_folder();
  const std::string a = dir + "/a.h5", b = dir + "/b.h5";
  write_file(a, {});
  FileSpec reversed;
  reversed.attributes_reversed = true;
  write_file(b, reversed);
  CHECK(recorded_checksum(a) == recorded_checksum(b));  // creation order does not matter
  CHECK(verify_error(a).empty());
  CHECK(verify_checkpoint(a).checksummed);
  CHECK(verify_checkpoint(a).step == 5);

  SECTION("a changed step attribute") {
    change_file(a, [](hid_t f) {
      h5::Handle attr(H5Aopen(f, "step", H5P_DEFAULT), H5Aclose);
      int64_t v = 6;
      REQUIRE(H5Awrite(attr, H5T_NATIVE_INT64, &v) >= 0);
    });
    CHECK_THAT(verify_error(a), Catch::Contains(a) && Catch::Contains("checksum mismatch"));
  }
  SECTION("an attribute added after the checksum was written") {
    change_file(a, [](hid_t f) { h5::write_attr_str(f, "note", "added later"); });
    CHECK_THAT(verify_error(a), Catch::Contains("checksum mismatch"));
  }
  SECTION("one changed value (Fletcher32 is recomputed by HDF5, the checksum is not)") {
    change_file(a, [](hid_t f) {
      h5::Handle ds(H5Dopen2(f, "params/w", H5P_DEFAULT), H5Dclose);
      std::vector<float> v = {1.f, 2.f, 3.f, 4.f, 5.f, 6.5f};
      REQUIRE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
    });
    CHECK_THAT(verify_error(a), Catch::Contains("checksum mismatch"));
  }
  SECTION("the checksum attribute itself changed") {
    change_file(a, [](hid_t f) {
      REQUIRE(H5Adelete(f, kChecksumAttribute) >= 0);
      h5::write_attr_str(f, kChecksumAttribute, checksum_text(1));
    });
    CHECK_THAT(verify_error(a), Catch::Contains("checksum mismatch"));
  }
  fs::remove_all(dir);
}

TEST_CASE("verify_checkpoint rejects non-finite values, a name with another step, other files", "[checkpoint]") {
  const std::string dir = temp_folder();
  FileSpec nan;
  nan.values[4] = std::nanf("");
  write_file(dir + "/nan.h5", nan);
  CHECK_THAT(verify_error(dir + "/nan.h5"), Catch::Contains("'params/w' holds a non-finite value (nan at element 4)"));

  write_file(dir + "/step_00000007.h5", {});
  CHECK_THAT(verify_error(dir + "/step_00000007.h5"),
             Catch::Contains("step_00000007.h5: its name says step 7 but its attribute 'step' is 5"));
  write_file(dir + "/step_00000005.h5", {});
  CHECK(verify_error(dir + "/step_00000005.h5").empty());
  // a temporary file is checked against the name it will get
  try {
    verify_checkpoint(dir + "/step_00000005.h5", "step_00000006.h5");
    FAIL("a file holding step 5 verified under the name step_00000006.h5");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("its name says step 6"));
  }

  FileSpec v1;
  v1.version = 1;
  write_file(dir + "/v1.h5", v1);
  CheckpointInfo info = verify_checkpoint(dir + "/v1.h5");
  CHECK(info.format_version == 1);
  CHECK_FALSE(info.checksummed);
  FileSpec v4;
  v4.version = 4;
  write_file(dir + "/v4.h5", v4);
  CHECK_THAT(verify_error(dir + "/v4.h5"), Catch::Contains("format version 4; this piper reads versions 1 to 3"));

  {
    std::FILE* f = std::fopen((dir + "/garbage.h5").c_str(), "wb");
    std::fputs("not an HDF5 file at all", f);
    std::fclose(f);
  }
  CHECK_THAT(verify_error(dir + "/garbage.h5"), Catch::Contains("garbage.h5: not a readable HDF5 file"));
  CHECK_THAT(verify_error(dir + "/missing.h5"), Catch::Contains("missing.h5: no checkpoint file"));
  fs::remove_all(dir);
}

TEST_CASE("a tensor that is not float32 or whose elements are not all stored is refused before it is read", "[checkpoint]") {
  const std::string dir = temp_folder();
  // params/never: a (1024, 1024) tensor never written, whose chunks are not stored (HDF5 would read fill values)
  write_file(dir + "/unwritten.h5", FileSpec{});
  change_file(dir + "/unwritten.h5", [](hid_t file) {
    hsize_t dims[2] = {1024, 1024}, chunk[2] = {256, 1024};
    h5::Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose), dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl, 2, chunk);
    h5::Handle ds(H5Dcreate2(file, "params/never", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    REQUIRE(ds.id >= 0);
  });
  CHECK_THAT(verify_error(dir + "/unwritten.h5"),
             Catch::Contains("tensor 'params/never' has a shape of (1024, 1024) but only 0 bytes of it are stored"));
  // an int64 dataset
  write_file(dir + "/ints.h5", FileSpec{});
  change_file(dir + "/ints.h5", [](hid_t file) {
    hsize_t n = 3;
    const int64_t v[3] = {1, 2, 3};
    h5::Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    h5::Handle ds(H5Dcreate2(file, "params/ints", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  });
  CHECK_THAT(verify_error(dir + "/ints.h5"), Catch::Contains("tensor 'params/ints' is not float32 little-endian"));
  fs::remove_all(dir);
}

TEST_CASE("block hashes match their reference values and do not depend on how the bytes are fed", "[checkpoint]") {
  std::vector<unsigned char> d(1000);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<unsigned char>((i * 7 + 3) & 255);
  // Python: xxhash.xxh64(d[:n]).intdigest()
  CHECK(block_hash(d.data(), d.size()) == 0x5f235fa033f1a3fbull);
  CHECK(block_hash(nullptr, 0) == 0xef46db3751d8e999ull);
  CHECK(block_hash(d.data(), 13) == 0xf78b031308f5bfc8ull);
  CHECK(block_hash(d.data(), 40) == 0xb620306b253d76b6ull);  // one stripe of 32 bytes and 8 more
  CHECK(block_hash("abc", 3) == 0x44bc2cf5ad770999ull);
  // Blocks of 104 bytes, fed in pieces of 1, 3, 5, ... bytes that do not line up with them.
  BlockHasher h(104);
  size_t at = 0;
  for (size_t step = 1; at < d.size(); step += 2) {
    const size_t n = std::min(step, d.size() - at);
    h.add(d.data() + at, n);
    at += n;
  }
  const std::vector<uint64_t> blocks = h.finish();
  REQUIRE(blocks.size() == 10);  // 9 whole blocks and 64 bytes
  for (size_t b = 0; b < blocks.size(); ++b)
    CHECK(blocks[b] == block_hash(d.data() + b * 104, std::min<size_t>(104, d.size() - b * 104)));
  CHECK(BlockHasher(104).finish() == std::vector<uint64_t>{block_hash(nullptr, 0)});
  CHECK(checksum_block_elements(10) == (1u << 20));
  CHECK(checksum_block_elements(uint64_t(4096) << 20) == (1u << 20));
  CHECK(checksum_block_elements((uint64_t(4096) << 20) + 1) == (2u << 20));
  CHECK(checksum_block_count(0, 1 << 20) == 1);
  CHECK(checksum_block_count((3u << 20) + 1, 1 << 20) == 4);
}

TEST_CASE("a version-3 file verifies, and a changed byte of a tensor is found in its block", "[checkpoint]") {
  const std::string dir = temp_folder();
  const std::string path = dir + "/step_00000005.h5";
  std::vector<float> big((std::size_t(1) << 20) + 300);  // two blocks: 2^20 elements and 300
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i % 1000) * 0.25f;
  {
    h5::Handle file(create_checkpoint_file(path), H5Fclose);
    CheckpointHeader header;
    header.step = 5;
    write_checkpoint_header(file, header);
    h5::Handle group(H5Gcreate2(file, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    std::vector<DatasetDigest> digests;
    digests.push_back(write_checkpoint_tensor(group, "params", "big", {int64_t(big.size())}, big.data()));
    const float small[6] = {1, 2, 3, 4, 5, 6};
    digests.push_back(write_checkpoint_tensor(group, "params", "w", {2, 3}, small));
    h5::write_attr_str(file, kChecksumAttribute, checksum_text(checkpoint_checksum(file, digests)));
  }
  CheckpointInfo info = verify_checkpoint(path);
  CHECK(info.format_version == 3);
  CHECK(info.checksummed);
  // The second block's first element, changed in place: its block is named, and a check that trusts the
  // recorded hashes (what a save does after its ranks hashed what they wrote) does not read it.
  haddr_t offset = 0;
  {
    h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    h5::Handle ds(H5Dopen2(file, "params/big", H5P_DEFAULT), H5Dclose);
    offset = H5Dget_offset(ds);
    REQUIRE(offset != HADDR_UNDEF);
  }
  {
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    REQUIRE(f != nullptr);
    std::fseek(f, long(offset + (hsize_t(1) << 20) * 4), SEEK_SET);
    const float changed = 123.5f;
    std::fwrite(&changed, 4, 1, f);
    std::fclose(f);
  }
  CHECK_THAT(verify_error(path), Catch::Contains("tensor 'params/big' is damaged (checksum mismatch): its block 1 "
                                                 "(elements 1048576 to 1048875) does not match its recorded hash"));
  CHECK(verify_checkpoint(path, "", /*read_data=*/false).checksummed);
  // A changed recorded hash breaks the file's checksum, also for the check that does not read tensors.
  change_file(path, [](hid_t file) {
    h5::Handle ds(H5Dopen2(file, "params/w", H5P_DEFAULT), H5Dclose);
    h5::write_attr_u64s(ds, kBlockHashesAttribute, {42});
  });
  try {
    verify_checkpoint(path, "", /*read_data=*/false);
    FAIL("a changed block hash went unnoticed");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("checksum mismatch"));
  }
  fs::remove_all(dir);
}
