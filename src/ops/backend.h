// Backend: the op table that the one forward pass (model/forward.cpp) runs on. The CPU backend (src/cpu) is the
// numerical reference; the CUDA backend (src/cuda) implements the same ops with fused kernels. Ops are at the
// granularity of MODEL.md's steps or of a natural fusion (gdn_core, attn_core, moe): a backend may split an op
// into several kernels, but never changes its contract.
//
// Conventions for every op:
//  - Tensors live on the backend's device (Tensor::device) and are contiguous row-major.
//  - Activations have dtype act_dtype() (F32 on the CPU); weights are as in model/weights.h.
//  - T is the number of rows (tokens) of the call: 1 in decode, a chunk of the prompt in prefill.
//  - Ops are enqueued in order; on an asynchronous backend nothing waits for the host unless stated.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/token_pick.h"

namespace fern {

// The per-sequence state carried between forward calls (MODEL.md 2.3 step 5 and 2.4).
struct SequenceState {
  virtual ~SequenceState() = default;
  // Unique per state made in this process: a recorded decode step names the state it belongs to by this number, not
  // by its address (a freed state's address may be reused by the next one).
  const uint64_t serial = next_serial();
  int64_t pos = 0;       // tokens already in the state (position of the next token)
  int64_t capacity = 0;  // KV rows allocated per attention layer
  // Indexed by layer; a tensor is empty where the layer is of the other type.
  std::vector<Tensor> k_cache, v_cache;   // [capacity, kv_heads, head_dim]
  std::vector<Tensor> conv_state;         // [kernel-1, conv_dim], oldest input first (pre-conv values)
  std::vector<Tensor> recurrent_state;    // F32 [Hv, Dk, Dv]: S[h][i=key dim][j=value dim]

 private:
  static uint64_t next_serial() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual DType act_dtype() const = 0;
  // Tokens per forward call of a chunked prefill when the user names none: larger chunks reuse each weight tile
  // over more rows (and fill the GPU), smaller ones bound scratch memory and the time between cancellation checks.
  virtual int64_t prefill_chunk_hint() const { return 512; }

  // ---- memory ----
  // Scratch for one forward call, from an arena that begin_forward() resets (so a replayed decode step sees the
  // same addresses). Contents are undefined.
  virtual void begin_forward() = 0;
  virtual Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) = 0;
  // Scratch scopes: what scratch() handed out after scratch_push() is free again at the matching scratch_pop() (in
  // reverse order when nested). The work already enqueued that uses it stays ordered before later work that reuses
  // the memory. The forward pass frees a layer's mixer activations before its MoE, so a chunk's scratch holds the
  // larger of the two, not both.
  virtual void scratch_push() = 0;
  virtual void scratch_pop() = 0;
  // Copies bytes between any two tensors of the same size (host <-> device included). Synchronous for reads to
  // the host.
  virtual void copy(Tensor dst, Tensor src) = 0;
  virtual void synchronize() {}
  // Memory on the backend's device that lives as long as the backend, at an address that never changes (a recorded
  // step's token slot and logits). Contents are undefined.
  virtual Tensor alloc(DType dtype, const std::vector<int64_t>& shape) = 0;

  // ---- recorded decode steps ----
  // A backend that can record the work of one decode step and run it again without the host issuing it (CUDA
  // graphs) says so in can_record_steps(). capture_step(state, step) records what `step` enqueues (begin_forward,
  // forward, ...) without running it and leaves state.pos as it was; replay(state) runs the record once and
  // advances state.pos as the step did. A record reads and writes fixed addresses (its scratch, the state, alloc()
  // buffers), so it belongs to one state: holds_step_for(state) says whether the record held is that state's. One
  // record at a time; capturing another drops it. Scratch must already be sized by an eager run of the same step.
  virtual bool can_record_steps() const { return false; }
  virtual void capture_step(SequenceState& state, const std::function<void()>& step) {
    (void)state, (void)step;
    fail("the {} backend does not record decode steps", name());
  }
  virtual void replay(SequenceState& state) {
    (void)state;
    fail("the {} backend does not record decode steps", name());
  }
  virtual bool holds_step_for(const SequenceState& state) const {
    (void)state;
    return false;
  }
  virtual void drop_graph() {}

  // ---- tokens picked by the backend (ops/token_pick.h) ----
  // pick(ids, logits) picks from logits [1, V] the token that Sampler::sample_at picks for the parameters of
  // set_pick() and the uniform pick_uniform(seed, draw), the draw counting up from params.draw by one per pick, and
  // writes it into ids[0]; picked() waits for the step and returns it, or -1 where the host must pick from the
  // logits (they hold NaN, or the top-p nucleus reaches past the candidates the backend keeps). The penalties count
  // as the Sampler's accept() does: set_pick() gets the tokens fed so far (`fed`, with repeats) and the prompt,
  // and each pick first counts the token in ids[0], the one its step was fed. Until set_pick() and after
  // clear_pick(), pick() does nothing, so that one recorded step serves the steps whose logits go to the host too.
  // can_pick(): whether set_pick() takes these parameters.
  virtual bool can_pick(const PickParams& p, size_t bias_entries, int64_t vocab) const {
    (void)p, (void)bias_entries, (void)vocab;
    return false;
  }
  virtual void set_pick(const PickParams& p, std::span<const std::pair<int32_t, float>> bias,
                        std::span<const int32_t> prompt, std::span<const int32_t> fed) {
    (void)p, (void)bias, (void)prompt, (void)fed;
    fail("the {} backend does not pick tokens", name());
  }
  virtual void clear_pick() {}
  virtual void pick(Tensor ids, Tensor logits) { (void)ids, (void)logits; }
  virtual int32_t picked() { fail("the {} backend does not pick tokens", name()); }

  // ---- weights and state ----
  // A copy of the weights resident on this backend (the CPU backend returns the same views).
  virtual std::shared_ptr<const ModelWeights> upload(std::shared_ptr<const ModelWeights> host) = 0;
  virtual std::unique_ptr<SequenceState> new_state(const ModelConfig& cfg, int64_t capacity) = 0;
  // Zeroes the state and sets pos = 0.
  virtual void reset_state(SequenceState& s) = 0;
  // dst becomes a copy of src (KV rows [0, src.pos), conv and recurrent state, pos). Capacities may differ
  // (dst.capacity >= src.pos).
  virtual void copy_state(SequenceState& dst, const SequenceState& src) = 0;
  // Bytes of device memory a state of this capacity holds (for snapshot budgets).
  virtual size_t state_bytes(const ModelConfig& cfg, int64_t capacity) const = 0;

  // ---- ops ----
  // out[t] = dequant(table)[ids[t]].   ids I32 [T], out [T, H].
  virtual void embed(Tensor out, Tensor ids, const LinearWeight& table) = 0;
  // Plain RMSNorm over the last dimension: out = x * rsqrt(mean(x^2) + eps) * w (w already holds any +1).
  // x, out [R, D]; w F32 [D].
  virtual void rmsnorm(Tensor out, Tensor x, Tensor w, float eps) = 0;
  // resid += delta; out = rmsnorm(resid, w, eps). All [T, H].
  virtual void add_rmsnorm(Tensor resid, Tensor delta, Tensor out, Tensor w, float eps) = 0;
  // out = a + b, same shapes.
  virtual void add(Tensor out, Tensor a, Tensor b) = 0;
  // out = x W^T.  x [T, in], out [T, out]; W dense or affine (4 or 8 bit).
  virtual void linear(Tensor out, Tensor x, const LinearWeight& w) = 0;
  // outs[i] = x W_i^T for several weights that share the input (the GDN input projections, attention q/k/v).
  // outs.size() == ws.size(). A backend may run them as one launch; by default, one linear() after another.
  virtual void linear_multi(std::span<const Tensor> outs, Tensor x, std::span<const LinearWeight* const> ws) {
    FERN_CHECK(outs.size() == ws.size(), "linear_multi: {} outputs for {} weights", outs.size(), ws.size());
    for (size_t i = 0; i < ws.size(); ++i) linear(outs[i], x, *ws[i]);
  }
  // A layer's input norm and its mixer projections: xn = rmsnorm(x, norm_w, eps), then linear_multi(outs, xn, ws).
  // A backend may compute the norm inside the projection kernel; by default, one op after the other. xn is scratch
  // for the normed rows: a backend that never materialises them may leave it unwritten (the CUDA prefill does).
  virtual void rmsnorm_linear_multi(std::span<const Tensor> outs, Tensor x, Tensor norm_w, float eps, Tensor xn,
                                    std::span<const LinearWeight* const> ws) {
    rmsnorm(xn, x, norm_w, eps);
    linear_multi(outs, xn, ws);
  }
  // Gated DeltaNet core, MODEL.md 2.4 steps 3-9 without the projections: causal conv + SiLU over `mixed`
  // (carrying conv_state), split into q/k/v, gates beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias),
  // l2-normalised q (scaled by Dk^-1/2) and k, the delta rule on recurrent_state (fp32), then the gated RMSNorm
  // with z. mixed [T, conv_dim], z [T, value_dim], a and b [T, Hv]  ->  y [T, value_dim].
  // Uses positions [state.pos, state.pos + T); does not advance state.pos.
  virtual void gdn_core(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                        const ModelConfig& cfg, SequenceState& state, int layer) = 0;
  // The GDN core and the mixer's output projection, MODEL.md 2.4 steps 3-9 and out_proj: gdn_core(y, ...), then
  // out = y W_out^T (w.out_proj). y [T, value_dim] is scratch whose contents afterwards are unspecified: a backend
  // may leave the raw delta-rule output there and apply the gated RMSNorm inside the projection kernel (the CUDA
  // decode path does); by default, one op after the other.
  virtual void gdn_core_linear(Tensor out, Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                               const ModelConfig& cfg, SequenceState& state, int layer) {
    gdn_core(y, mixed, z, b, a, w, cfg, state, layer);
    linear(out, y, w.out_proj);
  }
  // Gated attention core, MODEL.md 2.3 steps 3-7: q/k RMSNorm, partial RoPE at positions state.pos + t, append
  // k and v to the KV cache, causal GQA attention over [0, state.pos + t], o *= sigmoid(gate).
  // qg [T, heads*head_dim*2] (per head [query | gate]), k and v [T, kv_heads*head_dim] -> o [T, heads*head_dim].
  // Does not advance state.pos.
  virtual void attn_core(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                         SequenceState& state, int layer) = 0;
  // Sparse MoE block, MODEL.md 2.5: router softmax -> top-k -> renormalise, the selected experts' SwiGLU, the
  // weighted sum, plus the sigmoid-gated shared expert.  x [T, H] -> out [T, H].
  virtual void moe(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg) = 0;
  // The post-mixer half of a layer (MODEL.md 2.0): resid += delta; xn = rmsnorm(resid, norm_w, eps);
  // out = moe(xn); resid += out. out may be delta. A backend may fuse these (the CUDA decode path runs them as one
  // kernel); by default add_rmsnorm, moe, add.
  virtual void moe_residual(Tensor resid, Tensor delta, Tensor xn, Tensor norm_w, float eps, Tensor out,
                            const MoeWeights& w, const ModelConfig& cfg) {
    add_rmsnorm(resid, delta, xn, norm_w, eps);
    moe(out, xn, w, cfg);
    add(resid, resid, out);
  }
  // Announces the layer's moe_residual(resid, delta, ., norm_w, ., ., w, cfg) before its mixer runs, so that the
  // mixer's output projection (the next op that writes delta) may start it: the CUDA decode path adds delta to resid
  // and computes the router's logits there (FERN_CUDA_MOE_FOLD). The results are those of the ops without it, up to
  // rounding; by default nothing happens.
  virtual void expect_moe_residual(Tensor resid, Tensor delta, Tensor norm_w, const MoeWeights& w,
                                   const ModelConfig& cfg) {
    (void)resid, (void)delta, (void)norm_w, (void)w, (void)cfg;
  }
  // ids[t] = argmax_j logits[t, j] (lowest index on ties). logits [T, V] -> ids I32 [T].
  virtual void argmax(Tensor ids, Tensor logits) = 0;
  // state.pos += n (a backend that keeps a device copy of the position updates it too).
  virtual void advance(SequenceState& state, int64_t n) { state.pos += n; }
};

}  // namespace fern
