// Whole positioned reads and writes of a file descriptor: retried after EINTR and short transfers, the
// failure returned as an errno (or kEndOfFile), with its text for messages.
#pragma once
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace piper {

constexpr int kEndOfFile = -1;  // a read found the file shorter than asked

// Writes all `n` bytes at `offset`; 0 or the errno of the failure.
inline int pwrite_all(int fd, const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w, n -= size_t(w), offset += uint64_t(w);
  }
  return 0;
}

// Reads all `n` bytes at `offset`; 0, the errno of the failure, or kEndOfFile.
inline int pread_all(int fd, void* data, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return kEndOfFile;
    p += r, n -= size_t(r), offset += uint64_t(r);
  }
  return 0;
}

// What a failure of pwrite_all or pread_all means, for people.
inline const char* file_error_text(int err) { return err == kEndOfFile ? "the file ends early" : std::strerror(err); }

}  // namespace piper
