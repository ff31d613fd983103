// The CUDA backend: memory (scratch arena, persistent allocations), sequence state, the op table mapped onto the
// kernels of kernels.h, and the capture/replay of one decode step. Weight upload is in upload.cpp.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>

#include "core/env.h"
#include "core/error.h"
#include "cuda/backend_internal.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_f16.h"
#include "cuda/gemm_wg.h"
#include "cuda/qweight.h"

namespace fern {
using namespace cuda_backend_detail;
namespace {

constexpr size_t kAlign = 256;
// Programmatic dependent launch on sm_90+ unless FERN_CUDA_PDL=0 (see docs/notes/cuda-decode-v1.md).
constexpr bool kPdlDefault = true;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

CudaState::~CudaState() {
  if (mem) cudaFree(mem);
}

CudaBackend::CudaBackend(int device) : device_(device) {
  FERN_CUDA_CHECK(cudaSetDevice(device));
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
  // FERN_CUDA_SCRATCH=blocks: the chain of cudaMalloc blocks instead of one mapped range (scratch_arena.h).
  const bool blocks = env_choice("FERN_CUDA_SCRATCH", {"contiguous", "blocks"}, 0) == 1;
  arena_ = std::make_unique<cuda::ScratchArena>(
      device, blocks ? cuda::ScratchArena::Form::Blocks : cuda::ScratchArena::Form::Contiguous);
  int major = 0;
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  pdl_ = major >= 9 && env_choice("FERN_CUDA_PDL", {"0", "1"}, kPdlDefault ? 1 : 0) == 1;
  FERN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FERN_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  FERN_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
  FERN_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
  // Off by default: measured on the H200, 3039 vs 3021 us per 4K decode step with and without (the branches
  // compete for the SMs that the first projection already fills, and a join costs the PDL overlap).
  branches_ = env_choice("FERN_CUDA_BRANCHES", {"0", "1"}, 0) == 1;
  FERN_CUDA_CHECK(cudaMalloc(&counters_, sizeof(int) * kCounters));
  FERN_CUDA_CHECK(cudaMemset(counters_, 0, sizeof(int) * kCounters));
  FERN_CUDA_CHECK(cudaMalloc(&fold_pre_, kFoldPreBytes));
  FERN_CUDA_CHECK(cudaMemset(fold_pre_, 0, kFoldPreBytes));
  (void)cuda::gemm_wg_supported();  // probe the wgmma path now, not inside a prefill
}

CudaBackend::~CudaBackend() {
  drop_graph();
  if (side_) cudaStreamSynchronize(side_);
  if (stream_) cudaStreamSynchronize(stream_);
  if (fork_ev_) cudaEventDestroy(fork_ev_);
  if (join_ev_) cudaEventDestroy(join_ev_);
  if (side_) cudaStreamDestroy(side_);
  for (void* p : owned_) cudaFree(p);
  if (pick_host_) cudaFreeHost(pick_host_);
  cudaFree(counters_);
  cudaFree(fold_pre_);
  if (stream_) cudaStreamDestroy(stream_);
}

cuda::Ctx CudaBackend::ctx(int counter_offset, int counter_count) const {
  cuda::Ctx c;
  c.stream = stream_;
  c.sms = sms_;
  c.counters = counters_ + counter_offset;
  c.n_counters = counter_count;
  c.pdl = pdl_;
  return c;
}

void CudaBackend::join_side() {
  if (side_busy_) {
    FERN_CUDA_CHECK(cudaEventRecord(join_ev_, side_));
    FERN_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_ev_, 0));
    side_busy_ = false;
  }
  group_x_ = nullptr;
  group_out_.clear();
}

// ---- memory ----
void CudaBackend::begin_forward() {
  arena_->reset();
  scopes_.clear();
  ahead_ = {};
  if (folded_.resid != nullptr) {  // a forward call stopped between a folded projection and its MoE: clear its sums
    FERN_CUDA_CHECK(cudaMemsetAsync(fold_pre_, 0, kFoldPreBytes, stream_));
    folded_ = {};
  }
}

void CudaBackend::scratch_push() { scopes_.push_back(arena_->mark()); }

void CudaBackend::scratch_pop() {
  FERN_CHECK(!scopes_.empty(), "scratch_pop without scratch_push");
  join_side();  // work on the side stream may still read the scope's memory; the main stream orders the rest
  arena_->release(scopes_.back());
  scopes_.pop_back();
}

void* CudaBackend::arena_alloc(size_t bytes) { return arena_->alloc(bytes); }

Tensor CudaBackend::scratch(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t(nullptr, dtype, shape, Device::Cuda);
  t.data = arena_alloc(t.nbytes());
  return t;
}

Tensor CudaBackend::alloc(DType dtype, const std::vector<int64_t>& shape) {
  Tensor t(nullptr, dtype, shape, Device::Cuda);
  void* p = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(t.nbytes(), 1)));
  owned_.push_back(p);
  t.data = p;
  return t;
}

Tensor CudaBackend::to_device(const Tensor& host) {
  Tensor t = alloc(host.dtype, std::vector<int64_t>(host.shape.begin(), host.shape.begin() + host.ndim));
  copy(t, host);
  return t;
}

LinearWeight CudaBackend::to_device(const LinearWeight& host) {
  LinearWeight d = host;
  FERN_CHECK(host.expert_stride == 0, "to_device: strided expert stacks are compacted by upload() only");
  d.w = to_device(host.w);
  if (host.quantized()) {
    d.scales = to_device(host.scales);
    d.biases = to_device(host.biases);
  }
  return d;
}

void CudaBackend::copy(Tensor dst, Tensor src) {
  join_side();
  FERN_CHECK(dst.nbytes() == src.nbytes(), "copy: {} bytes into {} bytes", src.nbytes(), dst.nbytes());
  if (dst.nbytes() == 0) return;
  FERN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDefault, stream_));
  if (dst.device == Device::Host) FERN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() {
  join_side();
  FERN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- state ----
// Larger prefill chunks give each expert more rows per weight tile and the GEMMs more tiles: on the H200 (docs/PERF.md,
// ninth session, full-size model) 8192-token chunks against 2048 gave +12% / +16% / +10% tok/s at 4K / 32K / 128K;
// 16384 against 8192 gave +2.2% / +1.7% at 32K / 128K (twenty-first session). The contiguous scratch arena holds
// 2.69 GB for 16384-token chunks at 128K (1.35 GB for 8192), ~0.17 MB per token of chunk; the block form holds up to
// ~1.8x more (scratch_arena.h), so its figure is 0.4 MB, as measured before. The hint takes the largest chunk whose
// scratch needs at most a quarter of the memory free now (after the weights are uploaded), so a smaller GPU keeps room
// for the KV cache and session snapshots.
int64_t CudaBackend::prefill_chunk_hint() const {
  const double per_token = arena_->form() == cuda::ScratchArena::Form::Contiguous ? 0.17e6 : 0.4e6;
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 2048;
  for (int64_t chunk : {16384, 8192, 4096})
    if (double(chunk) * per_token <= 0.25 * double(free_bytes)) return chunk;
  return 2048;
}

size_t CudaBackend::state_bytes(const ModelConfig& cfg, int64_t capacity) const {
  size_t n = kAlign;  // position
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    if (cfg.is_attention_layer(l)) {
      n += 2 * align_up(size_t(capacity) * cfg.num_key_value_heads * cfg.head_dim * 2);
    } else {
      n += align_up(size_t(cfg.linear_conv_kernel_dim - 1) * cfg.gdn_conv_dim() * 4);
      n += align_up(size_t(cfg.linear_num_value_heads) * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4);
    }
  }
  return n;
}

std::unique_ptr<SequenceState> CudaBackend::new_state(const ModelConfig& cfg, int64_t capacity) {
  FERN_CHECK(capacity >= 1 && capacity <= (int64_t(1) << 30), "state capacity {}", capacity);
  auto st = std::make_unique<CudaState>();
  st->capacity = capacity;
  st->bytes = state_bytes(cfg, capacity);
  const cudaError_t e = cudaMalloc(&st->mem, st->bytes);
  if (e != cudaSuccess) fail("out of GPU memory allocating a sequence state of {} bytes ({} tokens)", st->bytes, capacity);
  char* p = static_cast<char*>(st->mem);
  st->d_pos = reinterpret_cast<int32_t*>(p);
  p += kAlign;
  const int L = cfg.num_hidden_layers;
  st->k_cache.resize(L);
  st->v_cache.resize(L);
  st->conv_state.resize(L);
  st->recurrent_state.resize(L);
  for (int l = 0; l < L; ++l) {
    if (cfg.is_attention_layer(l)) {
      const std::vector<int64_t> shp{capacity, cfg.num_key_value_heads, cfg.head_dim};
      st->k_cache[l] = Tensor(p, DType::BF16, shp, Device::Cuda);
      p += align_up(st->k_cache[l].nbytes());
      st->v_cache[l] = Tensor(p, DType::BF16, shp, Device::Cuda);
      p += align_up(st->v_cache[l].nbytes());
    } else {
      st->conv_state[l] = Tensor(p, DType::F32, {cfg.linear_conv_kernel_dim - 1, cfg.gdn_conv_dim()}, Device::Cuda);
      p += align_up(st->conv_state[l].nbytes());
      st->recurrent_state[l] = Tensor(
          p, DType::F32, {cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim}, Device::Cuda);
      p += align_up(st->recurrent_state[l].nbytes());
    }
  }
  st->nsplit = cuda::attn_splits(capacity);
  reset_state(*st);
  return st;
}

void CudaBackend::reset_state(SequenceState& s) {
  join_side();
  CudaState& st = cuda_state(s);
  FERN_CUDA_CHECK(cudaMemsetAsync(st.mem, 0, st.bytes, stream_));
  st.pos = 0;
}

void CudaBackend::copy_state(SequenceState& d, const SequenceState& s) {
  join_side();
  CudaState& dst = cuda_state(d);
  const CudaState& src = cuda_state(const_cast<SequenceState&>(s));
  FERN_CHECK(dst.capacity >= src.pos, "copy_state: capacity {} < {} tokens", dst.capacity, src.pos);
  FERN_CHECK(dst.k_cache.size() == src.k_cache.size(), "copy_state: states of different models");
  for (size_t l = 0; l < src.k_cache.size(); ++l) {
    if (!src.k_cache[l].empty()) {
      const size_t row = size_t(src.k_cache[l].inner()) * 2;
      FERN_CUDA_CHECK(cudaMemcpyAsync(dst.k_cache[l].data, src.k_cache[l].data, row * src.pos, cudaMemcpyDeviceToDevice, stream_));
      FERN_CUDA_CHECK(cudaMemcpyAsync(dst.v_cache[l].data, src.v_cache[l].data, row * src.pos, cudaMemcpyDeviceToDevice, stream_));
    } else if (!src.conv_state[l].empty()) {
      FERN_CUDA_CHECK(cudaMemcpyAsync(dst.conv_state[l].data, src.conv_state[l].data, src.conv_state[l].nbytes(),
                                      cudaMemcpyDeviceToDevice, stream_));
      FERN_CUDA_CHECK(cudaMemcpyAsync(dst.recurrent_state[l].data, src.recurrent_state[l].data,
                                      src.recurrent_state[l].nbytes(), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  FERN_CUDA_CHECK(cudaMemcpyAsync(dst.d_pos, src.d_pos, sizeof(int32_t), cudaMemcpyDeviceToDevice, stream_));
  dst.pos = src.pos;
}

void CudaBackend::advance(SequenceState& s, int64_t n) {
  join_side();
  CudaState& st = cuda_state(s);
  st.pos += n;
  cuda::advance_pos(ctx(), st.d_pos, static_cast<int>(n));
}

// ---- ops ----
void CudaBackend::embed(Tensor out, Tensor ids, const LinearWeight& table) {
  join_side();
  const int T = static_cast<int>(ids.dim(0));
  FERN_CHECK(ids.dtype == DType::I32, "embed: ids must be I32");
  FERN_CHECK(out.numel() == T * table.in, "embed: out {} for {} ids of width {}", out.shape_str(), T, table.in);
  cuda::embed(ctx(), cuda::make_qw(table), ids.ptr<int32_t>(), f32(out, "embed out"), T);
}

void CudaBackend::rmsnorm(Tensor out, Tensor x, Tensor w, float eps) {
  join_side();
  const int64_t D = x.dim(-1);
  FERN_CHECK(w.numel() == D && out.numel() == x.numel(), "rmsnorm: x {} w {} out {}", x.shape_str(), w.shape_str(),
             out.shape_str());
  cuda::rmsnorm(ctx(), f32(out, "rmsnorm out"), f32(x, "rmsnorm x"), f32(w, "rmsnorm w"),
                static_cast<int>(x.numel() / D), static_cast<int>(D), eps);
}

void CudaBackend::add_rmsnorm(Tensor resid, Tensor delta, Tensor out, Tensor w, float eps) {
  join_side();
  const int64_t D = resid.dim(-1);
  FERN_CHECK(w.numel() == D && delta.numel() == resid.numel() && out.numel() == resid.numel(),
             "add_rmsnorm: resid {} delta {} out {} w {}", resid.shape_str(), delta.shape_str(), out.shape_str(),
             w.shape_str());
  cuda::add_rmsnorm(ctx(), f32(resid, "add_rmsnorm resid"), f32(delta, "add_rmsnorm delta"),
                    f32(out, "add_rmsnorm out"), f32(w, "add_rmsnorm w"), static_cast<int>(resid.numel() / D),
                    static_cast<int>(D), eps);
}

void CudaBackend::add(Tensor out, Tensor a, Tensor b) {
  join_side();
  FERN_CHECK(a.numel() == b.numel() && out.numel() == a.numel(), "add: shapes {} {} {}", out.shape_str(),
             a.shape_str(), b.shape_str());
  cuda::add(ctx(), f32(out, "add out"), f32(a, "add a"), f32(b, "add b"), a.numel());
}

void CudaBackend::linear(Tensor out, Tensor x, const LinearWeight& w) {
  FERN_CHECK(x.dim(-1) == w.in && out.dim(-1) == w.out && x.numel() / w.in == out.numel() / w.out,
             "linear {}: x {} out {} for [{}, {}]", w.name, x.shape_str(), out.shape_str(), w.out, w.in);
  const Span o{static_cast<const char*>(out.data), out.nbytes()};
  const Span in{static_cast<const char*>(x.data), x.nbytes()};
  auto overlap = [](const Span& a, const Span& b) { return a.p < b.p + b.n && b.p < a.p + a.n; };
  bool independent = branches_ && group_x_ != nullptr && x.data == group_x_ && !overlap(o, in);
  for (const Span& g : group_out_) independent = independent && !overlap(o, g);
  cuda::Ctx c = ctx();
  if (independent) {
    // A further projection of the same input: on the side stream, after the input's producer (fork_ev_).
    if (!side_busy_) {
      FERN_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_ev_, 0));
      side_busy_ = true;
    }
    c.stream = side_;
  } else {
    join_side();
    if (branches_) {
      FERN_CUDA_CHECK(cudaEventRecord(fork_ev_, stream_));  // the input is ready once what precedes has run
      group_x_ = x.data;
    }
  }
  group_out_.push_back(o);
  const cuda::QW q = cuda::make_qw(w);
  const int T = static_cast<int>(x.numel() / w.in);
  cuda::RouteFold fold;
  if (!independent && take_fold_(out, q, &fold, /*attn=*/true)) {  // the attention's o_proj, before its MoE
    cuda::linear_fold(c, q, f32(x, "linear x"), f32(out, "linear out"), fold);
    return;
  }
  linear_rows(c, q, f32(x, "linear x"), f32(out, "linear out"), T);
}

void CudaBackend::linear_rows(cuda::Ctx c, const cuda::QW& q, const float* x, float* y, int T) {
  with_gemm_ws(c, q, T, [&] { cuda::linear(c, q, x, y, T); });
}

// The tile loop of multi-row linears on the tensor cores (cuda::gemm_mode, FERN_GEMM): with wg, fp16 or fp16x2 their
// input is converted once per op (to bf16 hi/lo rows, gemm_wg.h, or fp16 rows, gemm_f16.h) in a scratch workspace;
// split passes none, so linear_gemm keeps the bf16 hi/lo loop. docs/notes/cuda-prefill-v3-gemm.md and
// cuda-prefill-v4-wg.md compare them. The workspace is released after the launches unless parallel branches are on
// (a side-stream linear may then run concurrently with this one and must not get the same memory).
template <class F>
void CudaBackend::with_gemm_ws(cuda::Ctx& c, const cuda::QW& q, int T, F&& op) {
  const cuda::GemmMode mode = cuda::gemm_mode();
  if (mode == cuda::GemmMode::Split || T < cuda::kGemmMinRows || !cuda::gemm_f16_format_ok(q) ||
      !cuda::linear_gemm_wins(q, T) || (mode == cuda::GemmMode::Wg && !cuda::linear_gemm_wg_ok(q))) {
    op();
    return;
  }
  const cuda::ScratchArena::Mark m = arena_->mark();
  c.gemm_precise = mode == cuda::GemmMode::Fp16x2;
  c.gemm_wg = mode == cuda::GemmMode::Wg;
  const size_t bytes = c.gemm_wg ? cuda::xbf_bytes(T, q.in) : cuda::x16_bytes(T, q.in, c.gemm_precise);
  c.gemm_ws = scratch(DType::F32, {int64_t((bytes + 3) / 4)}).data;
  c.gemm_ws_bytes = bytes;
  op();
  if (!branches_) arena_->release(m);
}

namespace {
// The matrix of a multi-matrix op whose GEMM workspace the op takes: the first that takes the tensor-core kernel at T
// rows, else the last (they share the input width).
size_t gemm_matrix(const std::vector<cuda::QW>& q, int T) {
  size_t wi = 0;
  while (wi + 1 < q.size() && !cuda::linear_gemm_wins(q[wi], T)) ++wi;
  return wi;
}
}  // namespace

// One launch over the concatenated rows when the weights share a format and width (the GDN input projections,
// q/k/v); otherwise one linear() after another.
void CudaBackend::linear_multi(std::span<const Tensor> outs, Tensor x, std::span<const LinearWeight* const> ws) {
  FERN_CHECK(outs.size() == ws.size(), "linear_multi: {} outputs for {} weights", outs.size(), ws.size());
  std::vector<cuda::QW> q;
  for (const LinearWeight* w : ws) q.push_back(cuda::make_qw(*w));
  if (ws.empty() || !cuda::linear_multi_ok(q.data(), static_cast<int>(q.size()))) {
    Backend::linear_multi(outs, x, ws);
    return;
  }
  // linear_multi_ok: the matrices share their width.
  FERN_CHECK(x.dim(-1) == ws[0]->in, "linear_multi {}: x {} for [{}, {}]", ws[0]->name, x.shape_str(), ws[0]->out,
             ws[0]->in);
  const int64_t T = x.numel() / ws[0]->in;
  const std::vector<float*> ys = out_rows(outs, ws, T, "linear_multi");
  join_side();
  cuda::Ctx c = ctx();
  with_gemm_ws(c, q[gemm_matrix(q, static_cast<int>(T))], static_cast<int>(T), [&] {
    cuda::linear_multi(c, q.data(), f32(x, "linear_multi x"), ys.data(), static_cast<int>(q.size()),
                       static_cast<int>(T));
  });
}

// Several rows of rmsnorm_linear_multi (prefill): the norm computed straight into the exact-code GEMM's input rows
// (FERN_CUDA_NORM_ROWS=fused, the default; separate: rmsnorm, then linear_multi, as before; read at every call). The
// same bits either way; the fp32 normed rows are not written (xn is left as it was). Measured on the H200:
// docs/notes/cuda-prefill-v31-norm-rows.md. False: not taken, nothing launched.
bool CudaBackend::norm_rows_(std::span<const Tensor> outs, Tensor x, Tensor norm_w, float eps,
                             std::span<const LinearWeight* const> ws, const std::vector<cuda::QW>& q) {
  const int64_t D = x.dim(-1), T = x.numel() / D;
  if (T < 2 || x.dtype != DType::F32 || norm_w.numel() != D || ws.empty() || ws[0]->in != D ||
      env_choice("FERN_CUDA_NORM_ROWS", {"fused", "separate"}, 0) != 0 ||
      !cuda::linear_multi_ok(q.data(), static_cast<int>(q.size())))
    return false;
  const std::vector<float*> ys = out_rows(outs, ws, T, "rmsnorm_linear_multi");
  join_side();
  cuda::Ctx c = ctx();
  bool done = false;
  with_gemm_ws(c, q[gemm_matrix(q, static_cast<int>(T))], static_cast<int>(T), [&] {
    done = cuda::linear_gemm_multi_norm(c, q.data(), f32(x, "rmsnorm_linear_multi x"),
                                        f32(norm_w, "rmsnorm_linear_multi norm"), eps, ys.data(),
                                        static_cast<int>(q.size()), static_cast<int>(T));
  });
  return done;
}

// Several rows of gdn_core_linear: the gated norm computed straight into out_proj's exact-code rows
// (FERN_CUDA_GATED_NORM_ROWS=fused, the default; separate: gdn_core, then linear, as before; read at every call), as
// norm_rows_ does for the input norms. The same bits either way; y keeps the raw delta-rule outputs (its contents
// afterwards are unspecified, ops/backend.h). False: not taken, nothing launched.
bool CudaBackend::gdn_prefill_linear_(Tensor out, Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a,
                                      const GdnWeights& w, const ModelConfig& cfg, SequenceState& state, int layer) {
  const cuda::GdnShape sh = gdn_shape(cfg);
  const int64_t T = mixed.dim(0), V = cfg.gdn_value_dim();
  if (T < 2 || env_choice("FERN_CUDA_GATED_NORM_ROWS", {"fused", "separate"}, 0) != 0 ||
      !cuda::gated_norm_xbf_q4_ok(sh.Hv, sh.Dv) || w.out_proj.in != V || w.norm_w.numel() != sh.Dv ||
      z.dtype != DType::F32 || y.dtype != DType::F32 || out.dtype != DType::F32)
    return false;
  FERN_CHECK(out.dim(-1) == w.out_proj.out && out.numel() == T * w.out_proj.out && z.numel() == T * V,
             "gdn_core_linear: out {} z {} for {} rows and out_proj [{}, {}]", out.shape_str(), z.shape_str(), T,
             w.out_proj.out, w.out_proj.in);
  gdn_core_(y, mixed, z, b, a, w, cfg, state, layer, /*norm=*/false);  // its checks, and the side stream joined
  const cuda::QW wo = cuda::make_qw(w.out_proj);
  cuda::Ctx c = ctx();
  bool done = false;
  with_gemm_ws(c, wo, static_cast<int>(T), [&] {
    done = cuda::linear_gemm_gated_norm(c, wo, f32(y, "gdn y"), f32(z, "gdn z"), f32(w.norm_w, "norm_w"), sh.eps,
                                        sh.Hv, sh.Dv, f32(out, "gdn out"), static_cast<int>(T));
  });
  if (!done) {  // out_proj not on the exact-code loop: the norm in place, then linear() as gdn_core_linear would
    cuda::gdn_gated_norm(ctx(0), sh, static_cast<int>(T), f32(z, "gdn z"), f32(w.norm_w, "norm_w"), f32(y, "gdn y"));
    linear(out, y, w.out_proj);
  }
  return true;
}

void CudaBackend::gdn_core(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                           const ModelConfig& cfg, SequenceState& state, int layer) {
  gdn_core_(y, mixed, z, b, a, w, cfg, state, layer, /*norm=*/true);
}

void CudaBackend::gdn_core_(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                            const ModelConfig& cfg, SequenceState& state, int layer, bool norm) {
  join_side();
  const cuda::GdnShape sh = gdn_shape(cfg);
  FERN_CHECK(mixed.dim(-1) == sh.conv_dim && z.dim(-1) == cfg.gdn_value_dim() && b.dim(-1) == sh.Hv &&
                 a.dim(-1) == sh.Hv && y.dim(-1) == cfg.gdn_value_dim(),
             "gdn_core: shapes mixed {} z {} b {} a {} y {}", mixed.shape_str(), z.shape_str(), b.shape_str(),
             a.shape_str(), y.shape_str());
  FERN_CHECK(sh.Hk + sh.Hv <= kArgmaxCounterBase, "gdn_core: too many heads");
  if (mixed.dim(0) == 1) {
    FERN_CHECK(norm, "gdn_core: the one-token path always applies the gated norm");
    gdn_decode_(y, mixed, z, b, a, w, cfg, state, layer);
  } else {
    with_released_scratch([&] { gdn_prefill_(y, mixed, z, b, a, w, cfg, state, layer, norm); });
  }
}

void CudaBackend::attn_core(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                            SequenceState& state, int layer) {
  join_side();
  const CudaState& st = cuda_state(state);
  const int64_t T = qg.dim(0);
  FERN_CHECK(st.pos + T <= st.capacity, "attention: {} + {} tokens over capacity {}", st.pos, T, st.capacity);
  FERN_CHECK(qg.dim(-1) == int64_t(2) * cfg.num_attention_heads * cfg.head_dim &&
                 k.dim(-1) == int64_t(cfg.num_key_value_heads) * cfg.head_dim &&
                 o.dim(-1) == int64_t(cfg.num_attention_heads) * cfg.head_dim,
             "attn_core: shapes qg {} k {} o {}", qg.shape_str(), k.shape_str(), o.shape_str());
  if (T == 1)
    attn_decode_(o, qg, k, v, w, cfg, state, layer);
  else
    with_released_scratch([&] { attn_prefill_(o, qg, k, v, w, cfg, state, layer); });
}

void CudaBackend::moe_checks_(const MoeWeights& w, const ModelConfig& cfg) const {
  const int64_t E = w.router.out;
  FERN_CHECK(w.gate.experts == E && w.up.experts == E && w.down.experts == E, "moe: {} experts in the router, {} in {}",
             E, w.gate.experts, w.gate.name);
  const int k = cfg.num_experts_per_tok;
  FERN_CHECK(k >= 1 && k <= E && k <= 64, "moe: top-{} of {} experts", k, E);
}

void CudaBackend::moe(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg) {
  join_side();
  moe_checks_(w, cfg);
  if (x.dim(0) == 1)
    moe_decode_(out, x, w, cfg);
  else
    with_released_scratch([&] { moe_prefill_(out, x, w, cfg); });
}

void CudaBackend::argmax(Tensor ids, Tensor logits) {
  join_side();
  const int T = static_cast<int>(logits.dim(0));
  const int64_t V = logits.dim(1);
  FERN_CHECK(ids.dtype == DType::I32 && ids.numel() == T, "argmax: ids {} for {} rows", ids.shape_str(), T);
  const int chunk = kMoeCounterBase - kArgmaxCounterBase;
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int n = std::min(chunk, T - t0);
    void* part = arena_alloc(cuda::argmax_scratch_bytes(n));
    cuda::argmax(ctx(kArgmaxCounterBase), ids.ptr<int32_t>() + t0, f32(logits, "argmax logits") + int64_t(t0) * V, n,
                 V, part);
  }
}

// ---- graph ----
void CudaBackend::capture_step(SequenceState& state, const std::function<void()>& step) {
  drop_graph();
  join_side();
  const int64_t pos0 = state.pos;
  cudaGraph_t graph = nullptr;
  FERN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  arena_->set_growth_allowed(false);  // its addresses are baked into the graph
  try {
    step();
  } catch (...) {
    arena_->set_growth_allowed(true);
    if (side_busy_) {  // best effort: join so that the capture can end
      cudaEventRecord(join_ev_, side_);
      cudaStreamWaitEvent(stream_, join_ev_, 0);
      side_busy_ = false;
    }
    group_x_ = nullptr;
    group_out_.clear();
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    state.pos = pos0;
    throw;
  }
  join_side();  // a capture must end with every forked stream joined back
  arena_->set_growth_allowed(true);
  FERN_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  graph_advance_ = state.pos - pos0;
  state.pos = pos0;  // nothing ran yet
  const cudaError_t e = cudaGraphInstantiate(&graph_exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) graph_exec_ = nullptr;
  FERN_CUDA_CHECK(e);
  graph_serial_ = state.serial;
}

void CudaBackend::replay(SequenceState& state) {
  join_side();
  FERN_CHECK(graph_exec_ != nullptr, "replay without a captured step");
  FERN_CHECK(graph_serial_ == state.serial, "replay on a different sequence state than the captured one");
  FERN_CHECK(state.pos + graph_advance_ <= state.capacity, "replay: state full ({} of {})", state.pos, state.capacity);
  FERN_CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
  state.pos += graph_advance_;
}

void CudaBackend::drop_graph() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
  graph_exec_ = nullptr;
  graph_serial_ = 0;
  graph_advance_ = 0;
}

// ---- factory ----
bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  if (!cuda_available()) fail("no CUDA device is available");
  return std::make_unique<CudaBackend>(device);
}

}  // namespace fern
