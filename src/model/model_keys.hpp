// The [model] keys of a family as one table: each key's name, where ModelDims keeps it, its range, its
// default and a line of documentation, plus the rules across keys. Job files, checkpoints and the plan check read it.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "config/job.hpp"

namespace piper {

class TomlReader;

// What a rule across keys found: the key to name in the error and the message.
struct KeyProblem {
  std::string key, message;
};
// Whether the job file gave `key` ("moe.top_k" for [model.moe]); the plan check counts every key as given.
using KeyGiven = std::function<bool(const std::string& key)>;

// A float key the family keeps in ModelDims::family_values[index] (each family numbers its own slots).
struct FamilySlot {
  int index;
};

struct ModelKey {
  using Field = std::variant<int ModelDims::*, double ModelDims::*, bool ModelDims::*, FamilySlot>;
  const char* name;  // "d_ff"; "moe.experts" for [model.moe], an optional table
  Field field;       // where ModelDims keeps the value
  double min = 0, max = 0;  // the range of an int or float key, inclusive (min exclusive where min_exclusive)
  bool min_exclusive = false;
  // The value when the job file does not give the key, from the keys before it in the table.
  double (*fallback)(const ModelDims& d) = nullptr;
  const char* doc = "";
  // A rule across keys, checked once this key is read (so a later key's default can rely on it).
  std::optional<KeyProblem> (*check)(const ModelDims& d, const KeyGiven& given) = nullptr;
};
// A key of an optional table (moe.experts) is read only when the table is there; the table's first key
// is then at least 1, and 0 in the dimensions of a model without it.
std::string key_table_of(const ModelKey& k);  // "moe", or "" for a key of [model] itself
// The default that is ModelDims' own: `fallback = current<&ModelDims::vocab>`.
template <auto Field>
double current(const ModelDims& d) {
  return double(d.*Field);
}

// An int key whose default is ModelDims' own: int_key<&ModelDims::vocab>("vocab", 2, INT32_MAX, "...").
template <int ModelDims::*Field>
ModelKey int_key(const char* name, double min, double max, const char* doc) {
  return {.name = name, .field = Field, .min = min, .max = max, .fallback = current<Field>, .doc = doc};
}

// The value of a family's own key: family_value(d, keys, kInitGain) — the value read or copied into the
// slot, else (dimensions made in code) the default of the key of `keys` that keeps it there.
double family_value(const ModelDims& d, const std::vector<ModelKey>& keys, int slot);

// Reads every key of `keys`, in order, into `spec` through `r` (the [model] table), with each key's range
// and rule; errors name the file, line and key.
void read_model_keys(TomlReader& r, const std::vector<ModelKey>& keys, ModelSpec& spec);
// The problem of dimensions a job file could not have given through `keys` (a value out of its range, a
// broken rule), or nothing. The keys of an optional table absent from `d` are left out.
std::optional<KeyProblem> check_model_keys(const std::vector<ModelKey>& keys, const ModelDims& d);
// Every key of `keys` that `from` has copied from it, the others at their defaults: the dimensions a job
// file giving `from`'s values would produce before the family derives anything.
ModelSpec spec_from_keys(const std::vector<ModelKey>& keys, const std::string& kind, const ModelDims& from);
// The key's value as a job file writes it ("4", "true", "1e-06").
std::string model_key_text(const ModelKey& k, const ModelDims& d);

}  // namespace piper
