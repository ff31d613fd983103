// The one internal model that both checkpoint layouts bind to (MODEL.md section 3). Conventions are fixed here,
// once, by the loader (like mlx-lm's sanitize): zero-centred norms already carry their +1, the conv weight is
// [channels, kernel], fused HF experts are split into gate/up, small vectors are fp32. A linear weight is either
// bf16 or an MLX affine group-quantized matrix; nothing is ever dequantized to a full copy.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace fern {

// Logical weight W [out, in] (y = x W^T), or a stack of `experts` such matrices [E, out, in].
//  - Dense: w is BF16 [.., out, in].
//  - Affine (MLX): w is U32 [.., out, in*bits/32], 32/bits values per word packed from the least significant
//    bits up; scales and biases are BF16 [.., out, in/group_size]; W[n,k] = scales[n,k/g]*q[n,k] + biases[n,k/g].
//    Scales may be negative.
struct LinearWeight {
  enum class Kind : uint8_t { None, Dense, Affine };
  Kind kind = Kind::None;
  int64_t experts = 0;  // 0 for a plain matrix
  // Elements of `w` from one expert to the next (0 = contiguous: out * in for dense, out * in * bits / 32 words
  // for affine). The HF layout's fused gate_up_proj [E, 2I, H] binds gate and up as two strided stacks.
  int64_t expert_stride = 0;
  int64_t out = 0, in = 0;
  int bits = 16;
  int group_size = 0;
  Tensor w, scales, biases;
  std::string name;  // checkpoint name, for messages

  bool empty() const { return kind == Kind::None; }
  bool quantized() const { return kind == Kind::Affine; }
  // Bytes read for one full pass over the weight (for bandwidth accounting).
  // (A dense weight has no scales/biases; they are skipped explicitly rather than relying on an empty Tensor.)
  size_t nbytes() const {
    return w.nbytes() + (scales.empty() ? 0 : scales.nbytes()) + (biases.empty() ? 0 : biases.nbytes());
  }
  // The matrix of expert e as a plain LinearWeight view.
  LinearWeight expert(int64_t e) const;
  // Shape of a tensor of this weight whose last dimension is `last` (in for dense values, words for affine codes,
  // groups for scales and biases): [experts, out, last] for a stack, [out, last] for a plain matrix.
  std::vector<int64_t> shape_of(int64_t last) const {
    return experts > 0 ? std::vector<int64_t>{experts, out, last} : std::vector<int64_t>{out, last};
  }
};

struct GdnWeights {                      // Gated DeltaNet mixer (MODEL.md 2.4)
  LinearWeight in_proj_qkv;              // [conv_dim=8192, H]  rows [q | k | v]
  LinearWeight in_proj_z;                // [value_dim=4096, H]
  LinearWeight in_proj_b;                // [Hv=32, H]
  LinearWeight in_proj_a;                // [Hv=32, H]
  LinearWeight out_proj;                 // [H, value_dim]
  Tensor conv_w;                         // F32 [conv_dim, kernel=4]; column 3 multiplies the current token
  Tensor A_log;                          // F32 [Hv]
  Tensor dt_bias;                        // F32 [Hv]
  Tensor norm_w;                         // F32 [Dv=128] gated RMSNorm weight (plain, no +1)
};

struct AttnWeights {                     // gated full attention (MODEL.md 2.3)
  LinearWeight q_proj;                   // [heads*head_dim*2, H], per head [query 256 | gate 256]
  LinearWeight k_proj, v_proj;           // [kv_heads*head_dim, H]
  LinearWeight o_proj;                   // [H, heads*head_dim]
  Tensor q_norm, k_norm;                 // F32 [head_dim], +1 applied
};

struct MoeWeights {                      // sparse MoE block (MODEL.md 2.5)
  LinearWeight router;                   // [E, H] (8-bit in MLX files)
  LinearWeight gate, up;                 // [E, I, H]
  LinearWeight down;                     // [E, H, I]
  LinearWeight shared_gate, shared_up;   // [Is, H]
  LinearWeight shared_down;              // [H, Is]
  LinearWeight shared_expert_gate;       // [1, H] (8-bit in MLX files)

  // The block with f applied to each matrix, in declaration order (uploads keep that order in device memory).
  template <class F>
  MoeWeights map(F&& f) const {
    MoeWeights r;
    r.router = f(router);
    r.gate = f(gate);
    r.up = f(up);
    r.down = f(down);
    r.shared_gate = f(shared_gate);
    r.shared_up = f(shared_up);
    r.shared_down = f(shared_down);
    r.shared_expert_gate = f(shared_expert_gate);
    return r;
  }
};

struct LayerWeights {
  LayerType type = LayerType::LinearAttention;
  Tensor input_norm;                     // F32 [H], +1 applied
  Tensor post_norm;                      // F32 [H], +1 applied
  GdnWeights gdn;                        // when type == LinearAttention
  AttnWeights attn;                      // when type == FullAttention
  MoeWeights moe;
};

// Keeps alive whatever memory the tensors point into (mmaps, converted host buffers, device allocations).
struct WeightStorage {
  virtual ~WeightStorage() = default;
};

struct ModelWeights {
  ModelConfig config;
  LinearWeight embed;                    // [vocab, H]
  LinearWeight lm_head;                  // [vocab, H]
  Tensor final_norm;                     // F32 [H], +1 applied
  std::vector<LayerWeights> layers;
  std::vector<std::shared_ptr<WeightStorage>> storage;
};

}  // namespace fern
