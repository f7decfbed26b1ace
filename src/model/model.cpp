// Model construction through the family registry, parameter bookkeeping and strategy-independent init.
#include "model/model.hpp"

#include "model/build.hpp"
#include "model/family.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace piper {

Model build_model(const ModelSpec& spec) {
  const Family* f = find_family(spec.kind);
  if (!f) throw UserError(cat("model.kind: unknown model '", spec.kind, "'"));
  Model m = f->build(spec);
  m.kind = f->kind;
  m.reads_tokens = f->reads_tokens;
  return m;
}

namespace {
thread_local const size_t* t_param_budget = nullptr;
}  // namespace

ParamBudget::ParamBudget(size_t most) : most_(most), outer_(t_param_budget) { t_param_budget = &most_; }
ParamBudget::~ParamBudget() { t_param_budget = outer_; }
const size_t* ParamBudget::current() { return t_param_budget; }

int Model::add_param(std::string name, std::vector<int64_t> shape, InitKind init, float std, bool decay) {
  if (const size_t* most = ParamBudget::current(); most && params.size() >= *most)
    throw UserError(cat("the model has more than ", *most, " parameters (", name, " would be one more)"));
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (auto d : p.shape) p.numel *= d;
  p.init = init;
  p.init_std = std;
  p.decay = decay;
  params.push_back(std::move(p));
  return int(params.size()) - 1;
}

int Model::add_matmul_weight(std::string name, std::vector<int64_t> shape, float std) {
  const int i = add_param(std::move(name), std::move(shape), InitKind::Normal, std, true);
  params[size_t(i)].bf16_operand = true;
  return i;
}

int64_t Model::n_params() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel;
  return n;
}

float init_value(const ParamSpec& p, uint64_t seed, int64_t index) {
  switch (p.init) {
    case InitKind::Zeros: return 0.f;
    case InitKind::Ones: return 1.f;
    case InitKind::Normal: return p.init_std * random_normal(stream_key(seed, p.name), uint64_t(index));
  }
  return 0.f;
}

void init_param_range(const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count, float* out) {
  if (p.init == InitKind::Normal) {
    uint64_t key = stream_key(seed, p.name);
    for (int64_t i = 0; i < count; ++i) out[i] = p.init_std * random_normal(key, uint64_t(begin + i));
  } else {
    float v = p.init == InitKind::Ones ? 1.f : 0.f;
    for (int64_t i = 0; i < count; ++i) out[i] = v;
  }
}

}  // namespace piper
