// Reading user-named input files (see input_file.hpp): stat first, open without blocking, check the
// opened file again, then read at most the limit.
#include "util/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.hpp"

namespace piper {

namespace {

// What a file of mode `mode` is, when it is not a regular file.
std::string kind_text(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

std::string limit_text(uint64_t limit) {
  if (limit % (uint64_t(1) << 20) == 0) return cat(limit >> 20, " MiB (", limit, " bytes)");
  return cat(limit, " bytes");
}

}  // namespace

std::string not_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "does not exist";
    return cat("cannot be read (", std::strerror(errno), ")");
  }
  if (S_ISREG(st.st_mode)) return "";
  return cat("is ", kind_text(st.st_mode), ", not a regular file");
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t limit) {
  if (std::string why = not_regular_file(path); !why.empty()) throw UserError(cat(path, ": the ", what, " ", why));
  // O_NONBLOCK: should the path have become a FIFO since the stat, open returns at once instead of waiting
  // for a writer; the fstat below then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw UserError(cat(path, ": cannot open the ", what, " (", std::strerror(errno), ")"));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw UserError(cat(path, ": cannot read the ", what, " (", std::strerror(errno), ")"));
  if (!S_ISREG(st.st_mode)) throw UserError(cat(path, ": the ", what, " is ", kind_text(st.st_mode), ", not a regular file"));
  auto too_large = [&](uint64_t size) {
    return UserError(cat(path, ": the ", what, " is ", size == UINT64_MAX ? std::string("larger than the limit") :
                         cat(size, " bytes"), "; a ", what, " may hold at most ", limit_text(limit)));
  };
  if (uint64_t(st.st_size) > limit) throw too_large(uint64_t(st.st_size));
  std::string text(size_t(st.st_size), '\0');
  size_t used = 0;
  for (;;) {
    if (used == text.size()) {
      if (text.size() > limit) throw too_large(UINT64_MAX);  // it grew past the limit while read
      text.resize(std::min<size_t>(size_t(limit) + 1, std::max<size_t>(4096, text.size() * 2)));
    }
    const ssize_t r = ::read(fd, text.data() + used, text.size() - used);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw UserError(cat(path, ": cannot read the ", what, " (", std::strerror(errno), ")"));
    if (r == 0) break;
    used += size_t(r);
  }
  text.resize(used);
  if (used > limit) throw too_large(UINT64_MAX);
  return text;
}

}  // namespace piper
