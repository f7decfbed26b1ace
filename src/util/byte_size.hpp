// Memory sizes as people write them ("80GiB", "512 MiB", "5GB"): for --fit-memory and piper-ckpt's shard sizes.
// A unit is required: a bare number is refused, as "80" means 80 GiB to one reader and 80 bytes to another.
#pragma once
#include <cstdint>
#include <string>

namespace piper {

// Bytes of `text`: a positive number and a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, or K, M, G, T for the
// binary ones). Throws UserError naming `what` for anything else.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace piper
