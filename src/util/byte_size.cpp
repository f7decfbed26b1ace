// Memory sizes with their unit (byte_size.hpp).
#include "util/byte_size.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "util/error.hpp"

namespace piper {

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t at = 0;
  while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
  const char* begin = text.c_str() + at;
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  auto bad = [&]() {
    return UserError(cat(what, ": '", text,
                         "' is not a memory size (a positive number and a unit: B, KiB, MiB, GiB, TiB, "
                         "KB, MB, GB, TB; e.g. 80GiB)"));
  };
  if (end == begin || !std::isfinite(value) || value <= 0) throw bad();
  std::string unit(end);
  if (unit.find_first_not_of(" \t") == std::string::npos)  // a bare number is more likely GiB meant than bytes
    throw UserError(cat(what, ": '", text, "' has no unit; say which (", text, "GiB, ", text, "GB, or ", text,
                        "B for bytes)"));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> units[] = {
      {"b", 1},          {"kib", 1024.0},   {"mib", 1048576.0}, {"gib", 1073741824.0},
      {"tib", 1099511627776.0}, {"kb", 1e3}, {"mb", 1e6},       {"gb", 1e9},        {"tb", 1e12},
      {"k", 1024.0},     {"m", 1048576.0},  {"g", 1073741824.0}, {"t", 1099511627776.0}};
  for (const auto& [name, scale] : units) {
    if (unit != name) continue;
    const double bytes = value * scale;
    if (bytes < 1 || bytes > 1.8e19) throw bad();
    return uint64_t(bytes);
  }
  throw bad();
}

}  // namespace piper
