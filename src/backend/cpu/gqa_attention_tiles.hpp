// Causal grouped-query attention (GPT-2's and Qwen3's) with every product on AMX tiles (amx_tiles.hpp), in the query
// blocks of cpu_gqa_attention.cpp: bf16 q, k, v as the activations hold them, fp32 softmax statistics, the same
// roundings.
#pragma once
#include <cstdint>

#include "backend/kernels.hpp"

namespace piper {

// Whether attention in bf16 matmul precision runs on tiles: AMX tiles here and not turned off
// (PIPER_BF16_ATTENTION=gemm; =tiles asks for them, an error where there are none). Chosen once.
bool bf16_attention_on_tiles();

// Whether these operands run on tiles: bf16 q, k and v, T and the head width D whole multiples of 32, query blocks
// of a multiple of 32, and bf16_attention_on_tiles().
bool gqa_fits_tiles(ConstAct q, ConstAct k, ConstAct v, int T, int D, int block);

// One (sequence, query head): y (T,D) with row stride ys, lse (T); q (T,D) at row stride qs, k and v (T,D) at row
// stride ks; S a (block,T) fp32 scratch.
void gqa_head_forward_tiles(float* y, int ys, float* lse, const uint16_t* q, int qs, const uint16_t* k,
                            const uint16_t* v, int ks, float* S, int block, int T, int D, float scale);

// The operands of one (sequence, key/value head) and its G query heads, at the first of them (row strides qs for
// q and dq, ks for k, v, dk and dv, ys for y and dy; lse (G,T)).
struct GqaGroup {
  float *dq, *dk, *dv;
  const float* dy;
  const uint16_t *q, *k, *v;
  ConstAct y;
  const float* lse;
  int G, qs, ks, ys;
};
// Its backward: dq of the G heads, dk and dv (T,D), with P recomputed from q, k and lse; P and dS (block,T) fp32
// scratch.
void gqa_group_backward_tiles(const GqaGroup& g, float* P, float* dS, int block, int T, int D, float scale);

}  // namespace piper
