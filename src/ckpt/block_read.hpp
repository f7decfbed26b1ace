// Reading element ranges of a format-version-3 checkpoint's tensors in one pass that also verifies them:
// the whole checksum blocks a range touches are read straight from the file, each checked against its
// recorded hash (the file's checksum, which rank 0 verified, covers those) and for non-finite values.
#pragma once
#include <hdf5.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/model.hpp"

namespace piper {

class BlockCheckedReader {
 public:
  // `file` is the open checkpoint, `path` its name for messages. Throws UserError when it cannot be opened.
  BlockCheckedReader(hid_t file, std::string path);
  ~BlockCheckedReader();
  BlockCheckedReader(const BlockCheckedReader&) = delete;
  BlockCheckedReader& operator=(const BlockCheckedReader&) = delete;

  // Elements [begin, begin + count) of group/p.name, flattened row-major, into `out`. Throws UserError
  // "PATH: tensor 'NAME' ..." when the tensor is missing, has another shape or layout, or a block it
  // touches does not match its recorded hash or holds a non-finite value.
  void read(const char* group, const ParamSpec& p, int64_t begin, int64_t count, float* out);
  // The same range handed over piece by piece as it is read and checked: deliver(data, at, n) receives the
  // range's elements [at, at + n) (at from the range's start), from a buffer reused for every block, so
  // that no copy of the whole range is made (the caller uploads each piece where it belongs).
  using Deliver = std::function<void(const float* data, int64_t at, int64_t n)>;
  void read(const char* group, const ParamSpec& p, int64_t begin, int64_t count, const Deliver& deliver);
  // Announces a range that read() will be asked for, in the order of the reads, before the first read: a
  // thread then brings exactly those parts of the file into the page cache, sequentially and a little
  // ahead of the reads, so that the disk works while this thread hashes and hands on. Throws as read().
  void expect(const char* group, const ParamSpec& p, int64_t begin, int64_t count);

 private:
  struct Stored {
    uint64_t offset = 0;               // bytes from the start of the file
    uint64_t block = 0;                // elements per checksum block
    std::vector<uint64_t> hashes;      // recorded hash of each block
  };
  const Stored& stored(const std::string& name, const ParamSpec& p);
  int read_at(void* dst, uint64_t bytes, uint64_t at);  // 0, or the errno of a failed read

  hid_t file_;
  std::string path_;
  int fd_ = -1;
  uint64_t next_at_ = 0;     // the file byte after the last one read
  std::vector<char> gap_;    // bytes read and dropped between two ranges, to keep the reads sequential
  // The read-ahead: file extents [from, to) announced by expect(), merged where they (nearly) touch, and
  // a thread reading them on its own descriptor while it is less than kAhead bytes ahead of the reads.
  struct Extent {
    uint64_t from, to;
  };
  void start_read_ahead();
  void read_ahead_loop();
  void stop_read_ahead();
  std::vector<Extent> extents_;
  int ahead_fd_ = -1;
  std::mutex ahead_mutex_;
  std::condition_variable ahead_wake_;
  uint64_t consumed_ = 0;  // bytes read by read(); guarded by ahead_mutex_, as is ahead_stop_
  bool ahead_stop_ = false;
  std::thread ahead_;
  std::map<std::string, Stored> tensors_;
  std::vector<float> block_;  // one block of a tensor, as read
};

// Checks that group/p.name exists with p's shape; returns the open dataset (the caller closes it).
// Throws UserError naming `path` and the tensor otherwise.
hid_t open_checkpoint_tensor(hid_t file, const std::string& path, const char* group, const ParamSpec& p);

}  // namespace piper
