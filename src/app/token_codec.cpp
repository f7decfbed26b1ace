// The byte codec, and the tokenizer.json codec: each call runs tools/tokenizer-codec.py with its input in a
// temporary file as stdin and reads its stdout through a pipe (no shell: paths are passed as they are).
#include "app/token_codec.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "util/error.hpp"

extern char** environ;

namespace piper {

namespace {

namespace fs = std::filesystem;

class ByteCodec : public TokenCodec {
 public:
  explicit ByteCodec(int vocab) : vocab_(vocab) {}
  std::vector<int32_t> encode(const std::string& text) override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(int32_t(c));
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) override {
    std::string s;
    for (int32_t id : ids)
      if (id >= 0 && id < 256) s.push_back(char(id));
    return s;
  }
  int32_t end_of_document() const override { return vocab_ > 256 ? 256 : -1; }
  std::string describe() const override { return "bytes"; }

 private:
  int vocab_;
};

// tools/tokenizer-codec.py: $PIPER_TOOLS, else the tools folder above or beside the executable's folder.
std::string codec_script() {
  std::vector<fs::path> places;
  if (const char* dir = std::getenv("PIPER_TOOLS"); dir && *dir) places.emplace_back(dir);
  char exe[PATH_MAX];
  if (const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1); n > 0) {
    const fs::path folder = fs::path(std::string(exe, size_t(n))).parent_path();
    places.push_back(folder.parent_path() / "tools");
    places.push_back(folder / "tools");
  }
  std::string tried;
  for (const fs::path& p : places) {
    std::error_code ec;
    if (fs::is_regular_file(p / "tokenizer-codec.py", ec)) return (p / "tokenizer-codec.py").string();
    tried += cat(tried.empty() ? "" : ", ", p.string());
  }
  throw UserError(cat("--tokenizer needs tools/tokenizer-codec.py, which is in none of ", tried,
                      " (set PIPER_TOOLS to the folder that holds it)"));
}

// Runs `argv` with `input` as stdin; returns its stdout. UserError with its stderr's gist when it fails.
std::string run_tool(const std::vector<std::string>& argv, const std::string& input) {
  char in_path[] = "/tmp/piper-codec-XXXXXX";
  const int in_fd = mkstemp(in_path);
  if (in_fd < 0) throw SystemError("cannot create a temporary file in /tmp for the tokenizer");
  unlink(in_path);  // stays open for the child
  for (size_t done = 0; done < input.size();) {
    const ssize_t n = write(in_fd, input.data() + done, input.size() - done);
    if (n <= 0) {
      close(in_fd);
      throw SystemError("cannot write the tokenizer's input to a temporary file");
    }
    done += size_t(n);
  }
  lseek(in_fd, 0, SEEK_SET);
  int out[2];
  if (pipe(out) != 0) {
    close(in_fd);
    throw SystemError("cannot create a pipe for the tokenizer");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_fd, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_fd);
  close(out[1]);
  if (spawned != 0) {
    close(out[0]);
    throw UserError(cat("--tokenizer: cannot run ", argv[0], " (", std::strerror(spawned),
                        "); --python names the Python with the tokenizers package"));
  }
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, size_t(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw UserError(cat("--tokenizer: ", argv[1], " ", argv[2], " ", argv[3], " failed (its message is above)"));
  return text;
}

class TokenizerJsonCodec : public TokenCodec {
 public:
  TokenizerJsonCodec(const std::string& path, const std::string& python) : path_(path), python_(python) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw UserError(cat("--tokenizer ", path, ": not a file"));
    script_ = codec_script();
    const std::string info = run_tool({python_, script_, "info", path_}, "");
    const size_t at = info.find("\"eos\":");
    PIPER_CHECK(at != std::string::npos, "tokenizer-codec.py info printed no eos: ", info);
    eos_ = int32_t(std::strtol(info.c_str() + at + 6, nullptr, 10));
  }
  std::vector<int32_t> encode(const std::string& text) override {
    std::istringstream words(run_tool({python_, script_, "encode", path_}, text));
    std::vector<int32_t> ids;
    for (long id; words >> id;) ids.push_back(int32_t(id));
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) override {
    std::string words;
    for (int32_t id : ids) words += cat(id, " ");
    return run_tool({python_, script_, "decode", path_}, words);
  }
  int32_t end_of_document() const override { return eos_; }
  std::string describe() const override { return path_; }

 private:
  std::string path_, python_, script_;
  int32_t eos_ = -1;
};

}  // namespace

std::unique_ptr<TokenCodec> byte_codec(int vocab) { return std::make_unique<ByteCodec>(vocab); }

std::unique_ptr<TokenCodec> tokenizer_json_codec(const std::string& path, const std::string& python) {
  return std::make_unique<TokenizerJsonCodec>(path, python);
}

}  // namespace piper
