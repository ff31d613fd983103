// CpuBackend: the Backend op table on the host. Memory and state live here; the arithmetic lives in one file per
// op family (see cpu_ops.h). Tensors are checked at this boundary so that the kernels can trust their inputs.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "cpu/arena.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_ops.h"

namespace fern {
namespace {

// Zero-initialised host memory from calloc: a large KV capacity costs address space, not resident memory,
// until rows are written.
struct ZeroedBuffer {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> mem;
  size_t bytes = 0;
  explicit ZeroedBuffer(size_t n) : mem(std::calloc(n == 0 ? 1 : n, 1)), bytes(n) {
    if (!mem) fail("out of host memory allocating {} bytes of sequence state", n);
  }
};

struct CpuSequenceState : SequenceState {
  std::vector<ZeroedBuffer> buffers;
  Tensor make(DType t, std::initializer_list<int64_t> dims) {
    Tensor probe(nullptr, t, dims);
    buffers.emplace_back(probe.nbytes());
    probe.data = buffers.back().mem.get();
    return probe;
  }
};

int64_t kv_row(const ModelConfig& c) { return int64_t(c.num_key_value_heads) * c.head_dim; }
int64_t conv_rows(const ModelConfig& c) { return c.linear_conv_kernel_dim - 1; }
int64_t rec_elems(const ModelConfig& c) {
  return int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim;
}

void check_act(const Tensor& t, const char* what, std::initializer_list<int64_t> shape) {
  FERN_CHECK(!t.empty() && t.device == Device::Host && t.dtype == DType::F32, "{}: want an F32 host tensor", what);
  FERN_CHECK(t.ndim == static_cast<int>(shape.size()), "{}: rank {} (want {})", what, t.ndim, shape.size());
  int i = 0;
  for (int64_t d : shape) {
    FERN_CHECK(d < 0 || t.shape[i] == d, "{}: shape {} dim {} (want {})", what, t.shape_str(), i, d);
    ++i;
  }
}

void check_vec(const Tensor& t, const char* what, int64_t n) {
  FERN_CHECK(!t.empty() && t.dtype == DType::F32 && t.numel() == n, "{}: want F32 [{}], got {} {}", what, n,
             dtype_name(t.dtype), t.shape_str());
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& opt)
      : threads_(opt.threads > 0 ? opt.threads : omp_get_max_threads()), form_(opt.gdn_form) {}

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::Host; }
  DType act_dtype() const override { return DType::F32; }

  void begin_forward() override {
    arena_.reset();
    marks_.clear();
  }
  Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) override {
    Tensor t(nullptr, dtype, shape);
    t.data = arena_.alloc(t.nbytes());
    return t;
  }
  void scratch_push() override { marks_.push_back(arena_.mark()); }
  void scratch_pop() override {
    FERN_CHECK(!marks_.empty(), "scratch_pop without scratch_push");
    arena_.release(marks_.back());
    marks_.pop_back();
  }
  void copy(Tensor dst, Tensor src) override {
    FERN_CHECK(dst.nbytes() == src.nbytes(), "copy of {} bytes into {} bytes", src.nbytes(), dst.nbytes());
    FERN_CHECK(dst.device == Device::Host && src.device == Device::Host, "the CPU backend copies host memory only");
    if (dst.data != src.data && dst.nbytes() > 0) std::memmove(dst.data, src.data, dst.nbytes());
  }

  Tensor alloc(DType dtype, const std::vector<int64_t>& shape) override {
    Tensor t(nullptr, dtype, shape);
    owned_.push_back(std::make_unique<std::byte[]>(std::max<size_t>(t.nbytes(), 1)));
    t.data = owned_.back().get();
    return t;
  }

  std::shared_ptr<const ModelWeights> upload(std::shared_ptr<const ModelWeights> host) override { return host; }

  std::unique_ptr<SequenceState> new_state(const ModelConfig& cfg, int64_t capacity) override {
    if (capacity <= 0) fail("sequence state capacity {} must be positive", capacity);
    auto s = std::make_unique<CpuSequenceState>();
    const int L = cfg.num_hidden_layers;
    s->capacity = capacity;
    s->k_cache.resize(L);
    s->v_cache.resize(L);
    s->conv_state.resize(L);
    s->recurrent_state.resize(L);
    for (int l = 0; l < L; ++l) {
      if (cfg.is_attention_layer(l)) {
        s->k_cache[l] = s->make(DType::F32, {capacity, cfg.num_key_value_heads, cfg.head_dim});
        s->v_cache[l] = s->make(DType::F32, {capacity, cfg.num_key_value_heads, cfg.head_dim});
      } else {
        s->conv_state[l] = s->make(DType::F32, {conv_rows(cfg), cfg.gdn_conv_dim()});
        s->recurrent_state[l] = s->make(
            DType::F32, {cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim});
      }
    }
    return s;
  }

  void reset_state(SequenceState& s) override {
    for (size_t l = 0; l < s.k_cache.size(); ++l) {
      // KV rows at or above pos are never read (attention reads rows written in this sequence only), so only the
      // rows below pos are cleared: clearing a large capacity would commit all of its memory.
      if (!s.k_cache[l].empty()) {
        const size_t used = static_cast<size_t>(s.pos) * s.k_cache[l].inner() * sizeof(float);
        std::memset(s.k_cache[l].data, 0, used);
        std::memset(s.v_cache[l].data, 0, used);
      }
      if (!s.conv_state[l].empty()) std::memset(s.conv_state[l].data, 0, s.conv_state[l].nbytes());
      if (!s.recurrent_state[l].empty()) std::memset(s.recurrent_state[l].data, 0, s.recurrent_state[l].nbytes());
    }
    s.pos = 0;
  }

  void copy_state(SequenceState& dst, const SequenceState& src) override {
    FERN_CHECK(dst.k_cache.size() == src.k_cache.size(), "copy_state between models of {} and {} layers",
               dst.k_cache.size(), src.k_cache.size());
    if (dst.capacity < src.pos) fail("copy_state: capacity {} < {} tokens", dst.capacity, src.pos);
    for (size_t l = 0; l < src.k_cache.size(); ++l) {
      if (!src.k_cache[l].empty()) {
        FERN_CHECK(src.k_cache[l].inner() == dst.k_cache[l].inner(), "copy_state: layer {} KV rows differ", l);
        const size_t bytes = static_cast<size_t>(src.pos) * src.k_cache[l].inner() * sizeof(float);
        std::memcpy(dst.k_cache[l].data, src.k_cache[l].data, bytes);
        std::memcpy(dst.v_cache[l].data, src.v_cache[l].data, bytes);
      }
      if (!src.conv_state[l].empty()) copy(dst.conv_state[l], src.conv_state[l]);
      if (!src.recurrent_state[l].empty()) copy(dst.recurrent_state[l], src.recurrent_state[l]);
    }
    dst.pos = src.pos;
  }

  size_t state_bytes(const ModelConfig& cfg, int64_t capacity) const override {
    const size_t attn = cfg.num_attention_layers(), lin = cfg.num_linear_layers();
    return sizeof(float) * (attn * 2 * static_cast<size_t>(capacity * kv_row(cfg)) +
                            lin * static_cast<size_t>(conv_rows(cfg) * cfg.gdn_conv_dim() + rec_elems(cfg)));
  }

  // ---- ops ----
  void embed(Tensor out, Tensor ids, const LinearWeight& table) override {
    FERN_CHECK(ids.dtype == DType::I32 && ids.ndim == 1, "embed: ids must be I32 [T]");
    const int64_t T = ids.dim(0);
    check_act(out, "embed out", {T, table.in});
    cpu::embed(out.ptr<float>(), ids.ptr<int32_t>(), T, table, threads_);
  }

  void rmsnorm(Tensor out, Tensor x, Tensor w, float eps) override {
    check_act(x, "rmsnorm x", {-1, -1});
    check_act(out, "rmsnorm out", {x.dim(0), x.dim(1)});
    check_vec(w, "rmsnorm weight", x.dim(1));
    cpu::rmsnorm(out.ptr<float>(), x.ptr<float>(), w.ptr<float>(), x.dim(0), x.dim(1), eps, threads_);
  }

  void add_rmsnorm(Tensor resid, Tensor delta, Tensor out, Tensor w, float eps) override {
    check_act(resid, "add_rmsnorm resid", {-1, -1});
    check_act(delta, "add_rmsnorm delta", {resid.dim(0), resid.dim(1)});
    check_act(out, "add_rmsnorm out", {resid.dim(0), resid.dim(1)});
    check_vec(w, "add_rmsnorm weight", resid.dim(1));
    float* r = resid.ptr<float>();
    const float* d = delta.ptr<float>();
    const int64_t n = resid.numel();
    for (int64_t i = 0; i < n; ++i) r[i] += d[i];
    cpu::rmsnorm(out.ptr<float>(), r, w.ptr<float>(), resid.dim(0), resid.dim(1), eps, threads_);
  }

  void add(Tensor out, Tensor a, Tensor b) override {
    FERN_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "add: {} + {} -> {}", a.shape_str(),
               b.shape_str(), out.shape_str());
    FERN_CHECK(out.dtype == DType::F32 && a.dtype == DType::F32 && b.dtype == DType::F32, "add: F32 only");
    float* o = out.ptr<float>();
    const float *pa = a.ptr<float>(), *pb = b.ptr<float>();
    for (int64_t i = 0, n = out.numel(); i < n; ++i) o[i] = pa[i] + pb[i];
  }

  void linear(Tensor out, Tensor x, const LinearWeight& w) override {
    check_act(x, "linear x", {-1, w.in});
    check_act(out, "linear out", {x.dim(0), w.out});
    cpu::linear(out.ptr<float>(), x.ptr<float>(), x.dim(0), w, threads_);
  }

  void linear_multi(std::span<const Tensor> outs, Tensor x, std::span<const LinearWeight* const> ws) override {
    FERN_CHECK(outs.size() == ws.size(), "linear_multi: {} outputs for {} weights", outs.size(), ws.size());
    std::vector<cpu::LinearJob> jobs;
    for (size_t i = 0; i < ws.size(); ++i) {
      check_act(x, "linear x", {-1, ws[i]->in});
      check_act(outs[i], "linear out", {x.dim(0), ws[i]->out});
      jobs.push_back({outs[i].ptr<float>(), x.ptr<float>(), x.dim(0), ws[i]});
    }
    cpu::linear_many(jobs, threads_);
  }

  void gdn_core(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w, const ModelConfig& cfg,
                SequenceState& state, int layer) override {
    const int64_t T = mixed.dim(0), Hv = cfg.linear_num_value_heads;
    check_act(mixed, "gdn mixed", {T, cfg.gdn_conv_dim()});
    check_act(z, "gdn z", {T, cfg.gdn_value_dim()});
    check_act(b, "gdn b", {T, Hv});
    check_act(a, "gdn a", {T, Hv});
    check_act(y, "gdn y", {T, cfg.gdn_value_dim()});
    FERN_CHECK(Hv % cfg.linear_num_key_heads == 0, "GDN value heads {} not a multiple of key heads {}", Hv,
               cfg.linear_num_key_heads);
    check_vec(w.conv_w, "gdn conv weight", cfg.gdn_conv_dim() * cfg.linear_conv_kernel_dim);
    check_vec(w.A_log, "gdn A_log", Hv);
    check_vec(w.dt_bias, "gdn dt_bias", Hv);
    check_vec(w.norm_w, "gdn norm weight", cfg.linear_value_head_dim);
    FERN_CHECK(layer >= 0 && layer < static_cast<int>(state.conv_state.size()) && !state.conv_state[layer].empty(),
               "layer {} has no GDN state", layer);
    cpu::gdn_core(y.ptr<float>(), mixed.ptr<float>(), z.ptr<float>(), b.ptr<float>(), a.ptr<float>(), T, w, cfg,
                  state.conv_state[layer].ptr<float>(), state.recurrent_state[layer].ptr<float>(), form_, threads_);
  }

  void attn_core(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                 SequenceState& state, int layer) override {
    const int64_t T = qg.dim(0), q_dim = int64_t(cfg.num_attention_heads) * cfg.head_dim;
    check_act(qg, "attn qg", {T, 2 * q_dim});
    check_act(k, "attn k", {T, kv_row(cfg)});
    check_act(v, "attn v", {T, kv_row(cfg)});
    check_act(o, "attn o", {T, q_dim});
    check_vec(w.q_norm, "attn q_norm", cfg.head_dim);
    check_vec(w.k_norm, "attn k_norm", cfg.head_dim);
    FERN_CHECK(cfg.num_attention_heads % cfg.num_key_value_heads == 0, "heads {} not a multiple of kv heads {}",
               cfg.num_attention_heads, cfg.num_key_value_heads);
    FERN_CHECK(layer >= 0 && layer < static_cast<int>(state.k_cache.size()) && !state.k_cache[layer].empty(),
               "layer {} has no KV cache", layer);
    if (state.pos + T > state.capacity)
      fail("context full: {} tokens + {} new exceed the state capacity {}", state.pos, T, state.capacity);
    cpu::attn_core(o.ptr<float>(), qg.ptr<float>(), k.ptr<float>(), v.ptr<float>(), T, state.pos, w, cfg,
                   state.k_cache[layer].ptr<float>(), state.v_cache[layer].ptr<float>(), threads_);
  }

  void moe(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg) override {
    check_act(x, "moe x", {-1, cfg.hidden_size});
    check_act(out, "moe out", {x.dim(0), cfg.hidden_size});
    cpu::moe(out.ptr<float>(), x.ptr<float>(), x.dim(0), w, cfg, threads_);
  }

  void argmax(Tensor ids, Tensor logits) override {
    check_act(logits, "argmax logits", {-1, -1});
    FERN_CHECK(ids.dtype == DType::I32 && ids.numel() == logits.dim(0), "argmax: ids must be I32 [{}]",
               logits.dim(0));
    cpu::argmax(ids.ptr<int32_t>(), logits.ptr<float>(), logits.dim(0), logits.dim(1));
  }

 private:
  int threads_;
  GdnForm form_;
  cpu::Arena arena_;
  std::vector<cpu::Arena::Mark> marks_;  // open scratch scopes
  std::vector<std::unique_ptr<std::byte[]>> owned_;  // alloc() buffers
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  CpuBackendOptions opt;
  opt.threads = threads;
  return make_cpu_backend(opt);
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opt) { return std::make_unique<CpuBackend>(opt); }

}  // namespace fern
