// oneDNN's matmul primitive (see onednn_matmul.hpp): the C API's functions looked up in libdnnl.so.2 with the types
// of its headers, a per-thread table of primitives by shape, and one execute per product.
#include "backend/cpu/onednn_matmul.hpp"

#include <dlfcn.h>
#include <omp.h>

#include <vector>

#include "util/error.hpp"
#include "util/precision.hpp"

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#define PIPER_ONEDNN_HEADERS 1
#else
#define PIPER_ONEDNN_HEADERS 0
#endif

namespace piper {

#if PIPER_ONEDNN_HEADERS

namespace {

// The C API's functions this file calls, each looked up by name in libdnnl.so.2 with the type its header gives it.
#define PIPER_DNNL_FUNCTIONS(X)                                                                                      \
  X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_stream_wait) X(dnnl_memory_desc_init_by_strides)               \
  X(dnnl_matmul_desc_init) X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy)                             \
  X(dnnl_primitive_attr_set_post_ops) X(dnnl_post_ops_create) X(dnnl_post_ops_destroy) X(dnnl_post_ops_append_sum)  \
  X(dnnl_primitive_desc_create) X(dnnl_primitive_desc_destroy) X(dnnl_primitive_create) X(dnnl_primitive_execute)   \
  X(dnnl_memory_create) X(dnnl_memory_set_data_handle)

struct OneDnnApi {
#define PIPER_DNNL_MEMBER(name) decltype(&::name) name = nullptr;
  PIPER_DNNL_FUNCTIONS(PIPER_DNNL_MEMBER)
#undef PIPER_DNNL_MEMBER
  dnnl_engine_t engine = nullptr;
  std::string missing;  // what is not there ("" when all is)
};

const OneDnnApi& api() {
  static const OneDnnApi a = [] {
    OneDnnApi r;
    void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      r.missing = "libdnnl.so.2 does not load";
      return r;
    }
    auto look = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && r.missing.empty()) r.missing = cat("libdnnl.so.2 has no ", name);
    };
#define PIPER_DNNL_LOOK(name) look(r.name, #name);
    PIPER_DNNL_FUNCTIONS(PIPER_DNNL_LOOK)
#undef PIPER_DNNL_LOOK
    if (r.missing.empty() && r.dnnl_engine_create(&r.engine, dnnl_cpu, 0) != dnnl_success)
      r.missing = "oneDNN made no CPU engine";
    return r;
  }();
  return a;
}

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) throw SystemError(cat("oneDNN matmul: ", what, " failed with status ", int(status)));
}

// A product's shape, as primitives are made for it.
struct MatmulKey {
  bool trans_a, trans_b, accumulate, bias;
  int M, N, K, lda, ldb, ldc, threads;
  bool bf16_out = false;  // C stored as bf16 (else fp32)
  bool operator==(const MatmulKey& o) const {
    return trans_a == o.trans_a && trans_b == o.trans_b && accumulate == o.accumulate && bias == o.bias &&
           bf16_out == o.bf16_out && M == o.M && N == o.N && K == o.K && lda == o.lda && ldb == o.ldb && ldc == o.ldc && threads == o.threads;
  }
};

// A primitive made for one shape, with memory objects whose buffers each call sets.
struct Matmul {
  MatmulKey key;
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr, bias = nullptr;
};

struct ThreadMatmuls {
  dnnl_stream_t stream = nullptr;
  std::vector<Matmul> made;  // a handful of shapes a run: searched in order
};
thread_local ThreadMatmuls t_matmuls;

// A (rows, cols) row-major matrix with leading dimension ld, taken as the (rows', cols') operand op(X) is: the
// transpose through its strides.
dnnl_memory_desc_t matrix_desc(int rows, int cols, int ld, bool transposed, dnnl_data_type_t type) {
  const OneDnnApi& d = api();
  dnnl_memory_desc_t md;
  const dnnl_dims_t dims = {transposed ? cols : rows, transposed ? rows : cols};
  const dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
  check(d.dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides), "a memory descriptor");
  return md;
}

Matmul make_matmul(const MatmulKey& k) {
  const OneDnnApi& d = api();
  Matmul m;
  m.key = k;
  // op(A) (M,K) from A stored (M,K) or (K,M); op(B) (K,N) from B stored (K,N) or (N,K); C (M,N)
  const dnnl_memory_desc_t a = matrix_desc(k.trans_a ? k.K : k.M, k.trans_a ? k.M : k.K, k.lda, k.trans_a, dnnl_bf16);
  const dnnl_memory_desc_t b = matrix_desc(k.trans_b ? k.N : k.K, k.trans_b ? k.K : k.N, k.ldb, k.trans_b, dnnl_bf16);
  const dnnl_memory_desc_t c = matrix_desc(k.M, k.N, k.ldc, false, k.bf16_out ? dnnl_bf16 : dnnl_f32);
  const dnnl_memory_desc_t bias = matrix_desc(1, k.N, k.N, false, dnnl_f32);  // (1,N), broadcast over the rows
  dnnl_matmul_desc_t desc;
  check(d.dnnl_matmul_desc_init(&desc, &a, &b, k.bias ? &bias : nullptr, &c), "its descriptor");
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t ops = nullptr;
  check(d.dnnl_primitive_attr_create(&attr), "its attributes");
  if (k.accumulate) {  // C += the product
    check(d.dnnl_post_ops_create(&ops), "its post-ops");
    check(d.dnnl_post_ops_append_sum(ops, 1.f), "a sum post-op");
    check(d.dnnl_primitive_attr_set_post_ops(attr, ops), "its post-ops");
  }
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t made = d.dnnl_primitive_desc_create(&pd, &desc, attr, d.engine, nullptr);
  if (ops) d.dnnl_post_ops_destroy(ops);
  d.dnnl_primitive_attr_destroy(attr);
  check(made, cat("a primitive for ", k.M, "x", k.N, "x", k.K).c_str());
  const dnnl_status_t created = d.dnnl_primitive_create(&m.primitive, pd);
  d.dnnl_primitive_desc_destroy(pd);
  check(created, "the primitive");
  check(d.dnnl_memory_create(&m.a, &a, d.engine, DNNL_MEMORY_NONE), "a memory object");
  check(d.dnnl_memory_create(&m.b, &b, d.engine, DNNL_MEMORY_NONE), "a memory object");
  check(d.dnnl_memory_create(&m.c, &c, d.engine, DNNL_MEMORY_NONE), "a memory object");
  if (k.bias) check(d.dnnl_memory_create(&m.bias, &bias, d.engine, DNNL_MEMORY_NONE), "a memory object");
  return m;
}

const Matmul& matmul_for(const MatmulKey& k) {
  for (const Matmul& m : t_matmuls.made)
    if (m.key == k) return m;
  omp_set_num_threads(k.threads);  // oneDNN sizes the primitive's work for the threads it sees now
  t_matmuls.made.push_back(make_matmul(k));
  return t_matmuls.made.back();
}

}  // namespace

bool onednn_matmul_available(std::string* why_not) {
  const std::string& missing = api().missing;
  if (why_not) *why_not = missing;
  return missing.empty();
}

namespace {

// One product through the primitive made for `key`, C's buffer as the key says (fp32 or bf16).
void execute(const MatmulKey& key, const uint16_t* A, const uint16_t* B, void* C, const float* bias) {
  const OneDnnApi& d = api();
  PIPER_CHECK(d.missing.empty(), cat("oneDNN matmul asked for but ", d.missing));
  const Matmul& m = matmul_for(key);
  if (!t_matmuls.stream) check(d.dnnl_stream_create(&t_matmuls.stream, d.engine, dnnl_stream_default_flags), "a stream");
  check(d.dnnl_memory_set_data_handle(m.a, const_cast<uint16_t*>(A)), "setting A");
  check(d.dnnl_memory_set_data_handle(m.b, const_cast<uint16_t*>(B)), "setting B");
  check(d.dnnl_memory_set_data_handle(m.c, C), "setting C");
  if (bias) check(d.dnnl_memory_set_data_handle(m.bias, const_cast<float*>(bias)), "setting the bias");
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_DST, m.c},
                                  {DNNL_ARG_BIAS, m.bias}};
  omp_set_num_threads(key.threads);
  check(d.dnnl_primitive_execute(m.primitive, t_matmuls.stream, bias ? 4 : 3, args), "executing");
  check(d.dnnl_stream_wait(t_matmuls.stream), "waiting for its stream");
}

}  // namespace

void onednn_matmul(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                   int ldb, float beta, float* C, int ldc, int threads, const float* bias) {
  if (M <= 0 || N <= 0) return;
  PIPER_CHECK(beta == 0.f || beta == 1.f, "oneDNN matmul: beta must be 0 or 1");
  if (K <= 0) {  // an empty sum: C = bias + beta · C
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) {
        float& out = C[int64_t(r) * ldc + c];
        out = (bias ? bias[c] : 0.f) + (beta == 0.f ? 0.f : out);
      }
    return;
  }
  execute({trans_a, trans_b, beta != 0.f, bias != nullptr, M, N, K, lda, ldb, ldc, threads}, A, B, C, bias);
}

void onednn_matmul_to_bf16(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
                           const uint16_t* B, int ldb, uint16_t* C, int ldc, int threads, const float* bias) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: C = the bias
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) C[int64_t(r) * ldc + c] = bf16_bits(bias ? bias[c] : 0.f);
    return;
  }
  execute({trans_a, trans_b, false, bias != nullptr, M, N, K, lda, ldb, ldc, threads, true}, A, B, C, bias);
}
#else  // built without oneDNN's headers: the gemm API alone (bf16_gemm.cpp)

bool onednn_matmul_available(std::string* why_not) {
  if (why_not) *why_not = "built without oneDNN's headers (Debian's libdnnl-dev)";
  return false;
}

void onednn_matmul(bool, bool, int, int, int, const uint16_t*, int, const uint16_t*, int, float, float*, int, int,
                   const float*) {
  throw SystemError("oneDNN matmul: built without oneDNN's headers (Debian's libdnnl-dev)");
}
void onednn_matmul_to_bf16(bool, bool, int, int, int, const uint16_t*, int, const uint16_t*, int, uint16_t*, int, int,
                           const float*) {
  throw SystemError("oneDNN matmul: built without oneDNN's headers (Debian's libdnnl-dev)");
}

#endif

}  // namespace piper
