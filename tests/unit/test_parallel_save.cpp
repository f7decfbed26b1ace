// ParallelCheckpointWrite on one rank with slices cut where a checksum block crosses from one slice into the
// next: the file verifies byte for byte and reads back; a non-finite value or an unusable folder leaves no
// file behind and names what went wrong; file ranges written directly and buffered hold the right bytes.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <mpi.h>
#include <stdlib.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/block_read.hpp"
#include "ckpt/parallel_save.hpp"
#include "ckpt/reader.hpp"
#include "ckpt/verify.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"

using namespace piper;
namespace fs = std::filesystem;

namespace {

void start_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) REQUIRE(MPI_Init(nullptr, nullptr) == MPI_SUCCESS);
}

std::string temp_folder() {
  std::string t = (fs::temp_directory_path() / "piper-psave-test-XXXXXX").string();
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

ParamSpec spec(const std::string& name, std::vector<int64_t> shape) {
  ParamSpec p;
  p.name = name;
  p.shape = shape;
  p.numel = 1;
  for (int64_t d : shape) p.numel *= d;
  return p;
}

float value(int32_t group, int64_t param, int64_t i) { return float(group * 7 + param) + float(i % 4093) * 1e-3f; }

constexpr int64_t kMi = int64_t(1) << 20;

}  // namespace

TEST_CASE("a parallel checkpoint whose checksum block crosses two slices verifies and reads back, whole or block-checked", "[checkpoint]") {
  start_mpi();
  const std::string dir = temp_folder();
  // "a": 2.5 Mi elements in blocks of 1 Mi; its slices meet at 1.5 Mi, inside block 1.
  const std::vector<ParamSpec> params = {spec("a", {5, kMi / 2}), spec("b", {3, 5})};
  std::vector<SaveSlice> slices;
  for (int32_t g = 0; g < 3; ++g) {
    slices.push_back({g, 0, 0, 3 * kMi / 2});
    slices.push_back({g, 0, 3 * kMi / 2, kMi});
    slices.push_back({g, 1, 0, 15});
  }
  CheckpointHeader header;
  header.step = 4;
  const std::string path = dir + "/step_00000004.h5";
  ParallelCheckpointWrite w(path, header, params, slices, MPI_COMM_WORLD);
  REQUIRE(w.begin_code() == 0);
  CHECK(fs::exists(w.temporary_path()));
  w.write_local([&](size_t s, int64_t at, int64_t count, float* dst) {
    for (int64_t i = 0; i < count; ++i) dst[i] = value(slices[s].group, slices[s].param, slices[s].start + at + i);
  });
  REQUIRE(w.complete() == 0);
  CHECK_FALSE(fs::exists(w.temporary_path()));
  const CheckpointInfo info = verify_checkpoint(path);  // reads every byte and checks every block
  CHECK(info.format_version == kCheckpointVersion);
  CHECK(info.checksummed);
  CheckpointReader r(path);
  const char* groups[3] = {"params", "adam_m", "adam_v"};
  for (int32_t g = 0; g < 3; ++g)
    for (int64_t p = 0; p < 2; ++p) {
      const std::vector<float> got = r.read(cat(groups[g], "/", params[size_t(p)].name));
      REQUIRE(int64_t(got.size()) == params[size_t(p)].numel);
      int64_t wrong = 0;
      for (int64_t i = 0; i < int64_t(got.size()); ++i) wrong += got[size_t(i)] != value(g, p, i);
      CHECK(wrong == 0);
    }
  // Block-checked reads (a resume's): announced ranges in the order of the reads, and one never announced.
  struct Range {
    int32_t group;
    int64_t param, begin, count;
  };
  // Forward through one tensor, on to another group (a jump forward), back to the first (a jump back),
  // then a range read without being announced.
  const std::vector<Range> announced = {{0, 0, kMi + 3, kMi}, {2, 1, 2, 11}, {1, 0, 7, 2 * kMi}, {0, 0, 0, 9}};
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  {
    BlockCheckedReader reader(file, path);
    for (const Range& x : announced) reader.expect(groups[x.group], params[size_t(x.param)], x.begin, x.count);
    std::vector<Range> reads = announced;
    reads.push_back({2, 0, 3, 5 * kMi / 2 - 3});
    for (const Range& x : reads) {
      std::vector<float> got(size_t(x.count), -1.f);
      reader.read(groups[x.group], params[size_t(x.param)], x.begin, x.count, got.data());
      int64_t wrong = 0;
      for (int64_t i = 0; i < x.count; ++i) wrong += got[size_t(i)] != value(x.group, x.param, x.begin + i);
      CHECK(wrong == 0);
    }
  }
  H5Fclose(file);
  fs::remove_all(dir);
}

TEST_CASE("a parallel checkpoint stops at a non-finite value or an unusable folder and leaves no file", "[checkpoint]") {
  start_mpi();
  const std::string dir = temp_folder();
  const std::vector<ParamSpec> params = {spec("w", {4, 4})};
  std::vector<SaveSlice> slices = {{0, 0, 0, 16}, {1, 0, 0, 16}, {2, 0, 0, 16}};
  const std::string path = dir + "/step_00000002.h5";
  {
    ParallelCheckpointWrite w(path, CheckpointHeader{}, params, slices, MPI_COMM_WORLD);
    REQUIRE(w.begin_code() == 0);
    w.write_local([&](size_t s, int64_t at, int64_t count, float* dst) {
      for (int64_t i = 0; i < count; ++i) dst[i] = (s == 1 && at + i == 9) ? std::nanf("") : 1.f;
    });
    CHECK(w.complete() == kExitNonFinite);
    CHECK_THAT(w.failure(), Catch::Contains("tensor 'adam_m/w' holds a non-finite value (nan at element 9)"));
    CHECK_FALSE(fs::exists(w.temporary_path()));
  }
  CHECK_FALSE(fs::exists(path));
  // A folder below a regular file cannot be made: the creation fails, on rank 0, before anything is written.
  { std::FILE* f = std::fopen((dir + "/plain").c_str(), "w"); std::fclose(f); }
  ParallelCheckpointWrite w(dir + "/plain/sub/step_00000002.h5", CheckpointHeader{}, params, slices, MPI_COMM_WORLD);
  CHECK(w.begin_code() == kExitFailure);
  CHECK_THAT(w.failure(), Catch::Contains("plain/sub"));
  CHECK(w.complete() == kExitFailure);
  fs::remove_all(dir);
}

TEST_CASE("file ranges go to the disk directly in whole pages and buffered at their ends", "[checkpoint]") {
  const std::string dir = temp_folder();
  const std::string path = dir + "/range.bin";
  const int buffered = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(buffered >= 0);
  REQUIRE(::ftruncate(buffered, 6 * 4096) == 0);
  const int direct_fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
  void* mem = nullptr;
  REQUIRE(posix_memalign(&mem, 4096, 8 * 4096) == 0);
  auto* buf = static_cast<unsigned char*>(mem);
  for (size_t i = 0; i < 8 * 4096; ++i) buf[i] = static_cast<unsigned char>(i * 13 + 5);
  auto file_matches = [&](uint64_t offset, const unsigned char* data, size_t n) {
    std::vector<unsigned char> got(n);
    REQUIRE(::pread(buffered, got.data(), n, off_t(offset)) == ssize_t(n));
    return std::equal(got.begin(), got.end(), data);
  };
  // Bytes [100, 100 + 3 pages + 50): a partial page, two whole ones, a partial one.
  const size_t n = 3 * 4096 + 50;
  int direct = direct_fd;
  REQUIRE(write_file_range(buffered, direct, buf + 100, n, 100) == 0);
  CHECK(direct == direct_fd);  // aligned memory: the whole pages went directly (where O_DIRECT opened)
  CHECK(file_matches(100, buf + 100, n));
  // Memory that does not line up with the file's pages: a refused direct write is done buffered.
  if (direct_fd >= 0) {
    REQUIRE(write_file_range(buffered, direct, buf + 101, n, 4096 + 100) == 0);
    struct statfs fsinfo;
    REQUIRE(::statfs(dir.c_str(), &fsinfo) == 0);
    if (fsinfo.f_type == 0xEF53) CHECK(direct == -1);  // ext4 refuses direct I/O from memory off 512 bytes
    CHECK(file_matches(4096 + 100, buf + 101, n));
    int none = -1;  // no direct descriptor at all
    REQUIRE(write_file_range(buffered, none, buf + 7, 4096 * 2, 4096) == 0);
    CHECK(file_matches(4096, buf + 7, 4096 * 2));
  }
  std::free(mem);
  if (direct_fd >= 0) ::close(direct_fd);
  ::close(buffered);
  fs::remove_all(dir);
}
