// The model's hyperparameters as the job file gives them: one plain struct for every family (ModelDims),
// which the model families read and derive from and which travels in the plan as bytes.
#pragma once
#include <cstddef>
#include <cstdint>

#include "util/bytes.hpp"

namespace piper {

constexpr int kFamilySlots = 8;

// Hyperparameters of every family in one plain struct (it travels in the plan as bytes); each family
// reads the keys it knows and leaves the others at their defaults. The last two are derived by the family.
struct ModelDims {
  int vocab = 256, seq_len = 128, d_model = 256, n_layers = 4, n_heads = 8, d_ff = 1024;
  int n_kv_heads = 0, head_dim = 0;  // 0: n_heads, d_model / n_heads
  double rope_theta = 1e6, norm_eps = 1e-6;
  bool qk_norm = true, tie_embeddings = false;
  uint8_t family_given = 0;   // bit i: family_values[i] holds a value read or copied (else its key's default)
  uint8_t padding0_[1] = {};  // explicit, so that the plan (which copies these bytes) is the same every run
  int d_in = 32, d_hidden = 64, n_classes = 8;  // synthetic-feature models
  // mixture of experts ([model.moe]); experts = 0: none
  int moe_experts = 0, moe_top_k = 2, moe_d_expert = 0, moe_every = 1;
  bool moe_norm_topk_prob = true;
  // Set from job.precision, not the job's [model]: a bf16 run's segments hold the activations that only matmuls read
  // in bf16 (Act), at half the bytes in their buffers' sizes.
  bool bf16_matmul_inputs = false;
  uint8_t padding1_[6] = {};
  double moe_aux_loss_coef = 0.001, moe_capacity_factor = 0;  // capacity 0: dropless
  // Values a family keeps for itself, by the slot its key table gives them (ModelKey's FamilySlot): a
  // family's new hyperparameter needs no field here. Read them with family_value (model_keys.hpp).
  double family_values[kFamilySlots] = {};
  // derived by the family's build
  int rows_per_sample = 1;  // rows one sample contributes to the activation matrices (T for sequences)
  int act_width = 0;        // width of the activation handed between segments
  bool operator==(const ModelDims&) const = default;
};

// A ModelDims as plain bytes (a plan travels so): its bool members must each hold 0 or 1.
inline ModelDims get_model_dims(ByteReader& r) {
  return r.get<ModelDims>({offsetof(ModelDims, qk_norm), offsetof(ModelDims, tie_embeddings),
                           offsetof(ModelDims, moe_norm_topk_prob), offsetof(ModelDims, bf16_matmul_inputs)});
}

}  // namespace piper
