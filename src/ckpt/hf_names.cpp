// piper <-> Hugging Face tensors (see hf_names.hpp): the family gives the names (Family::to_hf/from_hf);
// this file renames the tensor and transposes what Hugging Face stores the other way round.
#include "ckpt/hf_names.hpp"

#include <utility>
#include <vector>

#include "model/family.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// (rows, cols) → (cols, rows)
NamedTensor transposed(NamedTensor t) {
  PIPER_CHECK(t.shape.size() == 2, "transposing ", t.name, " of rank ", t.shape.size());
  const int64_t R = t.shape[0], C = t.shape[1];
  std::vector<float> out(t.data.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out[size_t(c * R + r)] = t.data[size_t(r * C + c)];
  t.data = std::move(out);
  t.shape = {C, R};
  return t;
}

const Family& family_of(const std::string& kind) {
  const Family* f = find_family(kind);
  PIPER_CHECK(f, "unknown model.kind '", kind, "'");
  return *f;
}

}  // namespace

NamedTensor to_hf(const std::string& kind, const NamedTensor& t) {
  const Family& f = family_of(kind);
  if (!f.to_hf) return t;
  const HfName hf = f.to_hf(t.name);
  if (hf.name.empty()) throw UserError(cat(kind, " parameter '", t.name, "' has no Hugging Face name"));
  NamedTensor out = t;
  out.name = hf.name;
  return hf.transposed ? transposed(std::move(out)) : out;
}

NamedTensor from_hf(const std::string& kind, const NamedTensor& t, bool tied_head) {
  if (tied_head && t.name == "lm_head.weight") return NamedTensor{};
  const Family& f = family_of(kind);
  if (!f.from_hf) return t;
  const HfName ours = f.from_hf(t.name);
  if (ours.name.empty()) return NamedTensor{};
  NamedTensor out = ours.transposed ? transposed(t) : t;
  out.name = ours.name;
  return out;
}

}  // namespace piper
