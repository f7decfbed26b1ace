// Text to token ids and back for `piper sample`: UTF-8 bytes as ids 0..255 (tools/text-to-tokens.py --bytes), or a
// Hugging Face tokenizer.json through tools/tokenizer-codec.py (the `tokenizers` package), run as a child process.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace piper {

class TokenCodec {
 public:
  virtual ~TokenCodec() = default;
  virtual std::vector<int32_t> encode(const std::string& text) = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) = 0;
  // The end-of-document id (-1: none): generation stops there.
  virtual int32_t end_of_document() const = 0;
  virtual std::string describe() const = 0;
};

// Bytes: a vocabulary above 256 has 256 as its end-of-document id; decoding leaves out ids that are not bytes.
std::unique_ptr<TokenCodec> byte_codec(int vocab);
// A tokenizer.json, through `python` running tools/tokenizer-codec.py (found next to the executable's folder:
// ../tools, or where PIPER_TOOLS points). UserError when the file, the script or the package is missing.
std::unique_ptr<TokenCodec> tokenizer_json_codec(const std::string& path, const std::string& python);

}  // namespace piper
