// GPT-2's causal attention for one (sequence, head) with every product on AMX tiles (amx_tiles.hpp): bf16 q, k, v
// and probabilities as the activations hold them, operands packed into this thread's scratch, fp32 softmax.
#pragma once
#include <cstdint>

#include "backend/kernels.hpp"

namespace piper {

// Whether attention in bf16 matmul precision runs on tiles: AMX tiles here and not turned off
// (PIPER_BF16_ATTENTION=gemm; =tiles asks for them, an error where there are none). Chosen once.
bool bf16_attention_on_tiles();
// ... and whether these operands can: bf16 qkv and att, T and the head width whole multiples of 32.
bool attention_fits_tiles(ConstAct qkv, ConstAct att, int T, int hd);

// The causal softmax of row_scale · S(T,T) in place, row t over columns ≤ t, zeros right of the diagonal.
void causal_softmax_rows(float* S, int T, float row_scale);

// One head's forward: S (T,T) fp32 scratch; P (T,T) the probabilities, written as bf16; y (T,hd) with leading
// dimension ldy; q, k, v (T,hd) bf16 with leading dimension ld (3C).
void attention_head_forward_tiles(float* y, int ldy, uint16_t* P, float* S, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, int ld, int T, int hd, float scale);

// One head's backward from dY (T,hd) fp32 (leading dimension ldy) and the kept bf16 P: dq, dk, dv (T,hd) with
// leading dimension ld (3C), as q, k and v; dP (T,T) fp32 scratch.
void attention_head_backward_tiles(float* dq, float* dk, float* dv, const float* dY, int ldy, const uint16_t* q,
                                   const uint16_t* k, const uint16_t* v, int ld, const uint16_t* P, float* dP, int T,
                                   int hd, float scale);

}  // namespace piper
