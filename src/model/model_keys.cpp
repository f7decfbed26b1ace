// Reading, checking and printing a family's [model] keys from its table (see model_keys.hpp).
#include "model/model_keys.hpp"

#include <charconv>
#include <memory>
#include <type_traits>

#include "config/toml_reader.hpp"
#include "util/error.hpp"

namespace piper {

std::string key_table_of(const ModelKey& k) {
  const std::string name = k.name;
  const size_t dot = name.find('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

namespace {

std::string leaf_of(const ModelKey& k) {
  const std::string name = k.name;
  return name.substr(name.find('.') + 1);
}

void check_slot(int slot) { PIPER_CHECK(slot >= 0 && slot < kFamilySlots, "family slot ", slot, " of ", kFamilySlots); }

void set_slot(ModelDims& d, FamilySlot s, double v) {
  check_slot(s.index);
  d.family_values[s.index] = v;
  d.family_given = uint8_t(d.family_given | (1u << s.index));
}

bool slot_given(const ModelDims& d, int slot) { return (d.family_given >> slot) & 1u; }

// Reads one key through the reader of its table.
void read_key(TomlReader& r, const ModelKey& k, ModelSpec& spec) {
  const std::string leaf = leaf_of(k);
  const double fallback = k.fallback(spec);
  ModelDims& d = spec;
  if (auto* f = std::get_if<int ModelDims::*>(&k.field))
    d.*(*f) = int(r.get_int(leaf, int64_t(fallback), int64_t(k.min), int64_t(k.max)));
  else if (auto* g = std::get_if<double ModelDims::*>(&k.field))
    d.*(*g) = r.get_float(leaf, fallback, k.min, k.max, k.min_exclusive);
  else if (auto* s = std::get_if<FamilySlot>(&k.field))
    set_slot(d, *s, r.get_float(leaf, fallback, k.min, k.max, k.min_exclusive));
  else
    d.*std::get<bool ModelDims::*>(k.field) = r.get_bool(leaf, fallback != 0);
}

}  // namespace

void read_model_keys(TomlReader& r, const std::vector<ModelKey>& keys, ModelSpec& spec) {
  std::string open_table;                  // the optional table being read
  std::unique_ptr<TomlReader> sub;         // its reader, null when it is absent
  auto close_table = [&] {
    if (sub) sub->finish();
    sub.reset();
  };
  for (const ModelKey& k : keys) {
    const std::string table = key_table_of(k);
    if (table != open_table) {
      close_table();
      open_table = table;
      if (!table.empty()) r.sub_table(table, sub);
    }
    if (!table.empty() && !sub) continue;  // a model without that table
    TomlReader& in = table.empty() ? r : *sub;
    read_key(in, k, spec);
    if (!k.check) continue;
    const KeyGiven given = [&](const std::string& key) {
      const size_t dot = key.find('.');
      if (dot == std::string::npos) return r.has(key);
      return sub && key.substr(0, dot) == open_table && sub->has(key.substr(dot + 1));
    };
    if (std::optional<KeyProblem> p = k.check(spec, given)) {
      const size_t dot = p->key.find('.');
      if (dot != std::string::npos && sub) sub->error_msg(p->key.substr(dot + 1), p->message);
      r.error_msg(p->key, p->message);
    }
  }
  close_table();
}

namespace {

double value_of(const ModelKey& k, const ModelDims& d) {
  return std::visit(
      [&](auto field) -> double {
        if constexpr (std::is_same_v<decltype(field), FamilySlot>) {
          check_slot(field.index);
          return slot_given(d, field.index) ? d.family_values[field.index] : k.fallback(d);
        } else {
          return double(d.*field);
        }
      },
      k.field);
}

// Calls visit(k) for every key of `keys` that `d` has: all but those of an optional table whose first key is 0.
template <typename Visit>
void for_each_present_key(const std::vector<ModelKey>& keys, const ModelDims& d, Visit visit) {
  std::string absent;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string table = key_table_of(keys[i]);
    if (!table.empty() && table == absent) continue;
    if (!table.empty() && (i == 0 || key_table_of(keys[i - 1]) != table) && value_of(keys[i], d) == 0) {
      absent = table;
      continue;
    }
    visit(keys[i]);
  }
}

}  // namespace

std::optional<KeyProblem> check_model_keys(const std::vector<ModelKey>& keys, const ModelDims& d) {
  const KeyGiven every = [](const std::string&) { return true; };
  std::optional<KeyProblem> problem;
  for_each_present_key(keys, d, [&](const ModelKey& k) {
    if (problem) return;
    const double v = value_of(k, d);
    if (!std::holds_alternative<bool ModelDims::*>(k.field) &&
        (v > k.max || v < k.min || (k.min_exclusive && v == k.min)))
      problem = KeyProblem{k.name, cat(k.name, " = ", v, " is outside its range")};
    else if (k.check)
      problem = k.check(d, every);
  });
  return problem;
}

ModelSpec spec_from_keys(const std::vector<ModelKey>& keys, const std::string& kind, const ModelDims& from) {
  ModelSpec spec;
  spec.kind = kind;
  ModelDims& d = spec;
  for_each_present_key(keys, from, [&](const ModelKey& k) {
    std::visit(
        [&](auto field) {
          if constexpr (std::is_same_v<decltype(field), FamilySlot>) set_slot(d, field, value_of(k, from));
          else d.*field = from.*field;
        },
        k.field);
  });
  return spec;
}

double family_value(const ModelDims& d, const std::vector<ModelKey>& keys, int slot) {
  for (const ModelKey& k : keys)
    if (auto* s = std::get_if<FamilySlot>(&k.field); s && s->index == slot) return value_of(k, d);
  PIPER_CHECK(false, "no key of the family keeps family slot ", slot);
  return 0;
}

std::string model_key_text(const ModelKey& k, const ModelDims& d) {
  if (auto* f = std::get_if<int ModelDims::*>(&k.field)) return std::to_string(d.*(*f));
  if (auto* b = std::get_if<bool ModelDims::*>(&k.field)) return d.*(*b) ? "true" : "false";
  char buf[64];  // the shortest text that reads back as the same double (1e-06, 10000, 0.001)
  const auto res = std::to_chars(buf, buf + sizeof(buf), value_of(k, d));
  return std::string(buf, res.ptr);
}

}  // namespace piper
