// The CUDA backend class itself (cuda_backend.h only exposes the factory). Engine code that wants the
// capture/replay of a decode step, and the tests and benchmarks that drive single ops, include this header.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/pick.h"
#include "cuda/scratch_arena.h"
#include "ops/backend.h"

namespace fern {

// Per-sequence state on the GPU: one device allocation holding the BF16 KV caches, the F32 conv and recurrent
// states and the device copy of the position (read by the attention kernels, so a captured step needs no host
// input).
struct CudaState : SequenceState {
  ~CudaState() override;
  void* mem = nullptr;
  size_t bytes = 0;
  int32_t* d_pos = nullptr;
  int nsplit = 1;  // attention split-K pieces, fixed per state so that a captured step keeps its grid
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  // The largest of 8192 / 4096 / 2048 tokens whose scratch fits a quarter of the free device memory (cuda_backend.cpp).
  int64_t prefill_chunk_hint() const override;
  Device device() const override { return Device::Cuda; }
  DType act_dtype() const override { return DType::F32; }

  void begin_forward() override;
  Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) override;
  void scratch_push() override;
  void scratch_pop() override;
  void copy(Tensor dst, Tensor src) override;
  void synchronize() override;

  std::shared_ptr<const ModelWeights> upload(std::shared_ptr<const ModelWeights> host) override;
  std::unique_ptr<SequenceState> new_state(const ModelConfig& cfg, int64_t capacity) override;
  void reset_state(SequenceState& s) override;
  void copy_state(SequenceState& dst, const SequenceState& src) override;
  size_t state_bytes(const ModelConfig& cfg, int64_t capacity) const override;

  void embed(Tensor out, Tensor ids, const LinearWeight& table) override;
  void rmsnorm(Tensor out, Tensor x, Tensor w, float eps) override;
  void add_rmsnorm(Tensor resid, Tensor delta, Tensor out, Tensor w, float eps) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void linear(Tensor out, Tensor x, const LinearWeight& w) override;
  void linear_multi(std::span<const Tensor> outs, Tensor x, std::span<const LinearWeight* const> ws) override;
  void gdn_core(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w, const ModelConfig& cfg,
                SequenceState& state, int layer) override;
  void gdn_core_linear(Tensor out, Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                       const ModelConfig& cfg, SequenceState& state, int layer) override;
  void attn_core(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                 SequenceState& state, int layer) override;
  void moe(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg) override;
  void moe_residual(Tensor resid, Tensor delta, Tensor xn, Tensor norm_w, float eps, Tensor out, const MoeWeights& w,
                    const ModelConfig& cfg) override;
  void expect_moe_residual(Tensor resid, Tensor delta, Tensor norm_w, const MoeWeights& w,
                           const ModelConfig& cfg) override;
  void rmsnorm_linear_multi(std::span<const Tensor> outs, Tensor x, Tensor norm_w, float eps, Tensor xn,
                            std::span<const LinearWeight* const> ws) override;
  void argmax(Tensor ids, Tensor logits) override;
  void advance(SequenceState& state, int64_t n) override;

  // ---- one decode step as a CUDA graph ----
  // Records `step` (engine-level calls: begin_forward, forward, argmax into the input slot...) on the backend's
  // stream without running it. The host-side position is left as it was; every replay() runs the step once and
  // advances state.pos by what the step advanced. Scratch must already have been sized by one eager run of the
  // same step (the arena may not grow during capture).
  bool can_record_steps() const override { return true; }
  void capture_step(SequenceState& state, const std::function<void()>& step) override;
  void replay(SequenceState& state) override;
  bool holds_step_for(const SequenceState& state) const override {
    return graph_exec_ != nullptr && graph_serial_ == state.serial;
  }
  bool has_graph() const { return graph_exec_ != nullptr; }
  void drop_graph() override;

  // ---- tokens picked on the device (backend_pick.cpp, pick.h) ----
  bool can_pick(const PickParams& p, size_t bias_entries, int64_t vocab) const override;
  void set_pick(const PickParams& p, std::span<const std::pair<int32_t, float>> bias, std::span<const int32_t> prompt,
                std::span<const int32_t> fed) override;
  void clear_pick() override;
  void pick(Tensor ids, Tensor logits) override;
  int32_t picked() override;

  // ---- parallel branches ----
  // Consecutive linear() calls that read the same input and write disjoint outputs (the q/k/v projections, the
  // four GDN input projections) are independent: the first runs on the main stream, the others on a side stream
  // forked after the input's producer; any other op (or a linear with another input) joins the side stream back
  // first. Inside a capture this makes parallel graph branches. Off by default (it measured slower); FERN_CUDA_BRANCHES=1
  // turns it on.
  // Code that captures or synchronises the main stream itself must call join_side() first.
  void join_side();
  bool branches() const { return branches_; }

  // ---- for tests, benchmarks and loaders ----
  cudaStream_t stream() const { return stream_; }
  bool pdl() const { return pdl_; }
  int sm_count() const { return sms_; }
  // MoE routers run inside the mixers' output projections so far (FERN_CUDA_MOE_FOLD; for tests).
  int64_t moe_folds() const { return moe_folds_; }
  // Bytes of device memory the scratch arena holds (it only grows: the peak of all forward calls so far).
  size_t scratch_reserved() const { return arena_->reserved(); }
  // The most scratch any forward call has held at once (the sum of its live allocations, aligned): what the
  // contiguous arena holds, up to its growth step; the block form holds more (scratch_arena.h).
  size_t scratch_live_peak() const { return arena_->live_peak(); }
  // The sizes of the allocations live at that peak, in allocation order (to see what the scratch holds).
  const std::vector<size_t>& scratch_peak_sizes() const { return arena_->peak_sizes(); }
  // Persistent device memory owned by the backend (freed with it).
  Tensor alloc(DType dtype, const std::vector<int64_t>& shape) override;
  Tensor to_device(const Tensor& host);
  LinearWeight to_device(const LinearWeight& host);
  // Called with (bytes done, bytes total) during upload().
  std::function<void(size_t, size_t)> upload_progress;

 private:
  cuda::Ctx ctx(int counter_offset = 0, int counter_count = 0) const;
  struct Span {
    const char* p;
    size_t n;
  };
  void* arena_alloc(size_t bytes);
  // The temporaries of one multi-row block op (the MoE's per-pair buffers, the GDN pre-pass, attention partials) are
  // released (a return to an arena mark) when the op has been enqueued, so that a prefill chunk's scratch is one
  // layer's worth, not forty. Safe because every later kernel on the stream runs after the op's kernels (stream
  // order; with PDL each kernel waits for its predecessor before touching memory). Defined here: the block ops'
  // files (cuda_backend.cpp, backend_moe_decode.cpp) call it.
  template <class F>
  void with_released_scratch(F&& op) {
    const cuda::ScratchArena::Mark m = arena_->mark();
    op();
    arena_->release(m);
  }
  // Runs op with c.gemm_ws set to a scratch workspace for the fp16 input of the prefill GEMM of q (cuda_backend.cpp).
  template <class F>
  void with_gemm_ws(cuda::Ctx& c, const cuda::QW& q, int T, F&& op);
  // Several rows of rmsnorm_linear_multi with the norm inside the GEMM's input conversion (cuda_backend.cpp);
  // false: not taken, nothing launched.
  bool norm_rows_(std::span<const Tensor> outs, Tensor x, Tensor norm_w, float eps,
                  std::span<const LinearWeight* const> ws, const std::vector<cuda::QW>& q);
  // y [T, q.out] = x q^T on this context's stream by cuda::linear, with the prefill GEMM's workspace (with_gemm_ws).
  void linear_rows(cuda::Ctx c, const cuda::QW& q, const float* x, float* y, int T);
  // The one-token (decode, T == 1) and multi-row (prefill) paths of the blocks, each in its own file
  // (backend_{gdn,attn,moe}_{decode,prefill}.cpp); the public ops check shapes and dispatch on T.
  void gdn_decode_(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w, const ModelConfig& cfg,
                   SequenceState& state, int layer);
  void gdn_prefill_(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w, const ModelConfig& cfg,
                    SequenceState& state, int layer, bool norm = true);
  // gdn_core's checks and dispatch; norm false leaves y with the raw delta-rule outputs (a caller that applies the
  // gated norm itself: gdn_prefill_linear_).
  void gdn_core_(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w, const ModelConfig& cfg,
                 SequenceState& state, int layer, bool norm);
  bool gdn_prefill_linear_(Tensor out, Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                           const ModelConfig& cfg, SequenceState& state, int layer);
  void attn_decode_(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                    SequenceState& state, int layer);
  void attn_prefill_(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                     SequenceState& state, int layer);
  void moe_decode_(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg);
  // norm (or nullptr; moe_residual): the block on the residual stream. Its input, resid += delta and x =
  // rmsnorm(resid) * w (written to x), computed by moe_prefill_ itself (where it can, straight into the GEMM's input
  // rows too: cuda::rmsnorm_xbf_q4), and resid += out in the combine's pass. Returns whether that last add was done
  // (the row-by-row path has no combine and leaves it to the caller).
  struct MoeInNorm {
    float* resid;
    const float* delta;
    const float* w;
    float eps;
  };
  bool moe_prefill_(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg, const MoeInNorm* norm = nullptr);
  void moe_checks_(const MoeWeights& w, const ModelConfig& cfg) const;
  // The one-launch MoE of one token (backend_moe_decode.cpp); with `norm` it also computes its input. False: not
  // taken (formats, shapes, FERN_CUDA_MOE_FUSED=0), nothing launched.
  bool moe_fused_(Tensor out, const float* x, const MoeWeights& w, const ModelConfig& cfg, const cuda::MoeNorm* norm);
  // The router in the mixer's output projection (backend_moe_decode.cpp, FERN_CUDA_MOE_FOLD): the moe_residual that
  // expect_moe_residual announced (ahead_), taken by the projection that writes `out` when it and the MoE can take
  // the fold (then *f is filled, and folded_ tells moe_residual that resid already holds resid + delta).
  // attn: the attention's o_proj (FERN_CUDA_MOE_FOLD=gdn leaves it out).
  bool take_fold_(Tensor out, const cuda::QW& proj, cuda::RouteFold* f, bool attn);
  struct MoeAhead {
    const void* resid = nullptr;
    const void* delta = nullptr;
    const void* norm_w = nullptr;
    const MoeWeights* w = nullptr;
    const ModelConfig* cfg = nullptr;
  };
  MoeAhead ahead_, folded_;
  long long* fold_pre_ = nullptr;  // the fold's fixed-point pre-logits (kFoldPreMax strided), zero between uses
  int64_t moe_folds_ = 0;
  int folded_stride_ = cuda::kFoldStride;
  std::unordered_map<const void*, const void*> fold_packed_;  // router codes -> its route_fold_pack copy

  int device_ = 0;
  int sms_ = 0;
  bool pdl_ = false;  // programmatic dependent launch (sm_90+; FERN_CUDA_PDL=0/1 overrides the default)
  cudaStream_t stream_ = nullptr;
  int* counters_ = nullptr;
  std::unique_ptr<cuda::ScratchArena> arena_;     // made once the device is current (its form probes the device)
  std::vector<cuda::ScratchArena::Mark> scopes_;  // open scratch scopes (scratch_push)
  std::vector<void*> owned_;
  cudaGraphExec_t graph_exec_ = nullptr;
  uint64_t graph_serial_ = 0;  // SequenceState::serial of the state the graph was captured on
  int64_t graph_advance_ = 0;
  const float* last_gdn_state_ = nullptr;  // recurrent state written by the last gdn_core call (gdn_core says why)
  bool branches_ = true;
  // Device picks (FERN_CUDA_PICK=0, read at each request, leaves every pick to the host): the buffers come with the
  // first set_pick(), the result of each pick lands in pinned memory.
  cuda::PickBuffers pick_bufs_;
  cuda::PickResult* pick_host_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  bool side_busy_ = false;           // side stream has work not yet joined
  const void* group_x_ = nullptr;    // input of the current group of independent linears
  std::vector<Span> group_out_;      // outputs written by that group so far
};

}  // namespace fern
