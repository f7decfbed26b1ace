// What the files of the kernel case table share: each adds its family's rows (kernel_cases_*.cpp), and these
// helpers name shapes, make the saved tensors of a backward on the CPU, and build double references.
#pragma once

#include <catch2/catch.hpp>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_kernels.hpp"
#include "kernel_harness.hpp"

namespace piper::test {

void add_gpt2_cases(std::vector<KernelCase>& cases);         // linear, GELU, layernorm, attention, embedding, loss
void add_qwen3_cases(std::vector<KernelCase>& cases);        // RMSNorm, RoPE, SwiGLU, token embedding, GQA
void add_moe_cases(std::vector<KernelCase>& cases);          // grouped linear, gather, combine, rows_dot
void add_moe_routing_cases(std::vector<KernelCase>& cases);  // router, capacity and order, balance loss, backward
void add_tensor_parallel_cases(std::vector<KernelCase>& cases);  // vocabulary-parallel cross-entropy
void add_elementwise_cases(std::vector<KernelCase>& cases);  // add, fill, copy, sum of squares, AdamW
void add_bf16_cases(std::vector<KernelCase>& cases);         // a bf16 run's matmuls: linear calls, grouped
void add_bf16_activation_cases(std::vector<KernelCase>& cases);  // kernels that write or read bf16 activations
void add_bf16_moe_cases(std::vector<KernelCase>& cases);  // routed rows in bf16: row kernels, grouped products

// The call in bf16 matmul precision, the kernels left in fp32 after it (kernel_cases_bf16.cpp).
std::function<void(Kernels&, Buffers&)> in_bf16(std::function<void(Kernels&, Buffers&)> call);
// The fp32 tensor `in` (n values) as a bf16 activation, rounded into scratch (kernel_cases_bf16.cpp).
ConstAct as_bf16(Kernels& k, Buffers& b, const std::string& in, size_t n);
// The fp32 tensor `name` (n values) rounded to bf16 in place: to bf16 and back (kernel_cases_bf16.cpp).
void round_in_place(Kernels& k, Buffers& b, const std::string& name, size_t n);
std::vector<float> rounded(std::vector<float> v);  // each value rounded to bf16
// `call` writes a bf16 activation of n values (in scratch), which is then widened into the fp32 tensor `out`
// (kernel_cases_bf16_activations.cpp).
std::function<void(Kernels&, Buffers&)> into_bf16(const std::string& out, size_t n,
                                                  std::function<void(Kernels&, Buffers&, Act)> call);
// The twin of a call that writes `outs` (name, values) in bf16: the fp32 call, then each rounded in place.
Twin fp32_then_rounded(std::vector<std::pair<std::string, size_t>> outs,
                       std::function<void(Kernels&, Buffers&)> fp32_call);
// a(n,in) · b (out,in)ᵀ, or with b_transposed b (in,out), in double: (n,out)
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b, int n, int in, int out,
                            bool b_transposed);
// y(N,OC) = x(N,C) · w(OC,C)ᵀ + b(OC) of the tensors x, w, b, as given or (bf16) with x and w rounded, in double.
std::vector<double> linear_forward_ref(const Tensors& t, int N, int C, int OC, bool bf16);

// The double references of combine_rows and rows_dot (kernel_cases_moe.cpp) with the expert rows e given: from the
// tensors pos, w, combined (the prior) and x, into combined and dots with their ".scale" bounds.
void combine_rows_reference(Tensors& t, const std::vector<float>& e, int n, int K, int C, bool weighted, bool acc);
void rows_dot_reference(Tensors& t, const std::vector<float>& e, int n, int K, int C);

// "N=70 C=96"
std::string dims(std::initializer_list<std::pair<const char*, long>> d);

// The CPU kernels (one thread) that make a backward case's saved tensors (the forward's statistics), so that
// every backend differentiates at the same point.
CpuKernels& host();

HostTensor as_f32(const std::vector<double>& v);
std::vector<float> filled(size_t n, float v);  // the start of an output that must be written, not read
double dot(const std::vector<float>& a, const std::vector<double>& b);
std::vector<double> add_prior(std::vector<double> v, const std::vector<float>& prior, bool accumulate);
std::vector<int32_t> hot_tokens(std::mt19937& gen, size_t n, int V);  // tokens; every third one is token 7
// The property of an embedding gradient `tensor` (rows of `width`) when token `row` never occurs: that row is 0
// after a write and the prior after an accumulate, to the bit.
std::function<void(const Tensors&, const Tensors&)> untouched_row(std::string tensor, int row, int width,
                                                                  bool accumulate);

// The twin of an accumulating call: the same call overwriting scratch, then accumulate() into each output.
// `overwrite` gets the scratch pointers in the order of `outs` (name, floats).
Twin overwrite_then_add(std::vector<std::pair<std::string, size_t>> outs,
                        std::function<void(Kernels&, Buffers&, const std::vector<float*>&)> overwrite,
                        double rtol = 1e-5);

}  // namespace piper::test
