// CUDA decode micro-benchmarks (docs/notes/cuda-decode-v1.md): GEMV bandwidth at the real shapes with a cold L2
// (rotating over enough copies to exceed the 60 MiB L2), a 1.67 GB sweep, the per-block costs of one decode step,
// and whole decode steps of a full-size random model replayed as a CUDA graph at several contexts.
// Times come from CUDA events around graph replays (so launch gaps inside a graph are included, host launch
// overhead is not); each figure is the median of several replays.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "kernel_timeline.h"
#include "cuda/attn_decode_tc.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "cuda/kernels.h"
#include "cuda/qweight.h"
#include "cuda/random_weights.h"
#include "model/forward.h"

using namespace fern;

namespace {

constexpr double kCopyBw = 4.27e12;  // device-to-device copy bandwidth measured on the H200 (PERF.md)

// Runs `body` once eagerly (sizes the arena, loads modules), then captures it into a graph and returns the median
// seconds per replay.
double time_graph(CudaBackend& be, const std::function<void()>& body, int reps = 7) {
  body();
  be.synchronize();
  return bench::graph_median_ms(be.stream(), body, reps, [&] { be.join_side(); }) * 1e-3;
}

LinearWeight rand_affine(CudaBackend& be, int64_t out, int64_t in, int bits, uint64_t seed) {
  LinearWeight w;
  w.kind = LinearWeight::Kind::Affine;
  w.out = out;
  w.in = in;
  w.bits = bits;
  w.group_size = 64;
  w.name = "bench";
  w.w = be.alloc(DType::U32, {out, in * bits / 32});
  w.scales = be.alloc(DType::BF16, {out, in / 64});
  w.biases = be.alloc(DType::BF16, {out, in / 64});
  cuda::fill_random_u32(be.stream(), w.w.ptr<uint32_t>(), w.w.numel(), seed);
  cuda::fill_random_bf16(be.stream(), w.scales.ptr<uint16_t>(), w.scales.numel(), seed + 1, 0.001f, 0.01f, true);
  cuda::fill_random_bf16(be.stream(), w.biases.ptr<uint16_t>(), w.biases.numel(), seed + 2, 0.0f, 0.05f, true);
  return w;
}

void bench_gemv() {
  struct Shape {
    const char* name;
    int64_t out, in;
    int bits;
    const char* env = nullptr;  // a variable set for this row only (linear.cu's comparisons), and its value
    const char* val = nullptr;
    bool tc = false;  // FERN_CUDA_GEMV_TC=1 for this row: the tensor-core loop (by default only for lm_head)
  };
  std::printf("\n== GEMV, cold L2 (graph of launches rotating over >= 256 MB of copies); warm: one matrix 64 times ==\n");
  std::printf("%-22s %14s %8s %10s %9s %7s %9s\n", "shape", "[out x in]", "bits", "MB/matrix", "us/launch", "%BW",
              "warm us");
  for (const Shape& s : {Shape{"in_proj_qkv / q_proj", 8192, 2048, 4}, Shape{"in_proj_z", 4096, 2048, 4},
                         Shape{"expert gate/up", 512, 2048, 4}, Shape{"expert down", 2048, 512, 4},
                         Shape{"out_proj / o_proj", 2048, 4096, 4}, Shape{"router", 256, 2048, 8},
                         Shape{"lm_head", 248320, 2048, 4},
                         Shape{"qkv, tensor cores", 8192, 2048, 4, nullptr, nullptr, true},
                         Shape{"in_proj_z, tensor cores", 4096, 2048, 4, nullptr, nullptr, true},
                         Shape{"down, tensor cores", 2048, 512, 4, nullptr, nullptr, true},
                         Shape{"out_proj, tensor cores", 2048, 4096, 4, nullptr, nullptr, true},
                         Shape{"lm_head, CUDA cores", 248320, 2048, 4, "FERN_CUDA_GEMV_TC", "0"},
                         Shape{"lm_head, TC 2 buffers", 248320, 2048, 4, "FERN_CUDA_GEMV_TC_NB", "2"}}) {
    if (s.env != nullptr) setenv(s.env, s.val, 1);
    if (s.tc) setenv("FERN_CUDA_GEMV_TC", "1", 1);
    CudaBackend be(0);
    const LinearWeight probe = rand_affine(be, s.out, s.in, s.bits, 1);
    const double bytes = double(probe.nbytes());
    const int copies = std::max(1, int(std::ceil(256e6 / bytes)));
    std::vector<LinearWeight> ws{probe};
    for (int i = 1; i < copies; ++i) ws.push_back(rand_affine(be, s.out, s.in, s.bits, 10 + 3 * i));
    Tensor x = be.alloc(DType::F32, {1, s.in}), y = be.alloc(DType::F32, {1, s.out});
    cuda::fill_random_f32(be.stream(), x.ptr<float>(), s.in, 99, -1.0f, 1.0f);
    const int launches = std::max(copies, 64);
    const double t = time_graph(be, [&] {
      for (int i = 0; i < launches; ++i) be.linear(y, x, ws[i % copies]);
    });
    const double per = t / launches;
    // The same matrix launch after launch: from L2 where it fits (50 MB), what a step whose weights were already
    // cached would pay per GEMV.
    const double warm = bytes < 40e6 ? time_graph(be, [&] {
      for (int i = 0; i < 64; ++i) be.linear(y, x, probe);
    }) / 64 : 0.0;
    std::printf("%-22s %7ld x %5ld %8d %10.2f %9.2f %6.1f%% %9.2f\n", s.name, long(s.out), long(s.in), s.bits,
                bytes / 1e6, per * 1e6, 100.0 * bytes / per / kCopyBw, warm * 1e6);
    if (s.env != nullptr) unsetenv(s.env);
    if (s.tc) unsetenv("FERN_CUDA_GEMV_TC");
  }
  // The whole-model sweep: 1.67 GB of 8192 x 2048 4-bit matrices, each read once.
  CudaBackend be(0);
  std::vector<LinearWeight> ws;
  double total = 0;
  while (total < 1.67e9) {
    ws.push_back(rand_affine(be, 8192, 2048, 4, 1000 + ws.size()));
    total += double(ws.back().nbytes());
  }
  Tensor x = be.alloc(DType::F32, {1, 2048}), y = be.alloc(DType::F32, {1, 8192});
  cuda::fill_random_f32(be.stream(), x.ptr<float>(), 2048, 98, -1.0f, 1.0f);
  const double t = time_graph(be, [&] {
    for (auto& w : ws) be.linear(y, x, w);
  });
  std::printf("%-22s %7zu mats        4 %10.1f %9.1f %6.1f%%   (%.0f GB/s)\n", "sweep 1.67 GB", ws.size(), total / 1e6,
              t * 1e6, 100.0 * total / t / kCopyBw, total / t / 1e9);
}

ModelConfig full_config() {
  ModelConfig c;  // defaults are the 35B-A3B values
  c.layer_types.clear();
  for (int i = 0; i < c.num_hidden_layers; ++i)
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  return c;
}

void fill_state(CudaBackend& be, CudaState& st, int64_t ctx) {
  uint64_t seed = 500;
  for (size_t l = 0; l < st.k_cache.size(); ++l) {
    if (!st.k_cache[l].empty()) {
      cuda::fill_random_bf16(be.stream(), st.k_cache[l].ptr<uint16_t>(), st.k_cache[l].numel(), ++seed, 0, 1, true);
      cuda::fill_random_bf16(be.stream(), st.v_cache[l].ptr<uint16_t>(), st.v_cache[l].numel(), ++seed, 0, 1, true);
    } else {
      cuda::fill_random_f32(be.stream(), st.recurrent_state[l].ptr<float>(), st.recurrent_state[l].numel(), ++seed,
                            -0.05f, 0.05f);
      cuda::fill_random_f32(be.stream(), st.conv_state[l].ptr<float>(), st.conv_state[l].numel(), ++seed, -1, 1);
    }
  }
  const int32_t p = static_cast<int32_t>(ctx);
  FERN_CUDA_CHECK(cudaMemcpy(st.d_pos, &p, 4, cudaMemcpyHostToDevice));
  st.pos = ctx;
}

// One 4K decode step captured and replayed `reps` times, nothing else: for a kernel-level profiler (nsys).
// The full-size random model, a state filled to `ctx` positions and one greedy decode step captured as a graph.
struct CapturedStep {
  ModelConfig cfg = full_config();
  CudaBackend be{0};
  std::shared_ptr<ModelWeights> w = cuda::random_device_weights(be, cfg, 1);
  Tensor tok = be.alloc(DType::I32, {1});
  std::unique_ptr<SequenceState> st;

  explicit CapturedStep(int64_t ctx) {
    FERN_CUDA_CHECK(cudaMemset(tok.data, 0, 4));
    st = be.new_state(cfg, ctx + 256);
    fill_state(be, static_cast<CudaState&>(*st), ctx);
    auto step = [this] {
      be.begin_forward();
      Tensor lg = be.scratch(DType::F32, {1, cfg.vocab_size});
      forward(be, *w, *st, tok, lg);
      be.argmax(tok, lg);
    };
    step();  // eager: sizes the arena
    be.synchronize();
    be.capture_step(*st, step);
  }
  // Microseconds per step over n back-to-back replays (CUDA events).
  double replay_us(int n) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, be.stream());
    for (int i = 0; i < n; ++i) be.replay(*st);
    cudaEventRecord(b, be.stream());
    FERN_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms * 1e3 / n;
  }
};

void profile_step(int reps) {
  CapturedStep cs(4096);
  for (int i = 0; i < reps; ++i) cs.be.replay(*cs.st);
  cs.be.synchronize();
  std::printf("profiled %d replays of the 4K step\n", reps);
}

// Where one decode step's time goes, kernel by kernel, in real graph replays (CUPTI activity records; kernels
// overlap under PDL as they do without tracing). Per kernel: its start relative to the end of the kernel before it
// (negative: it was resident early), its duration (residency, including any wait), and its advance of the step's
// frontier (how much later the latest end becomes when it ends): the advances add up to the step's wall time, so
// they say which kernels the step waits for. Medians over the traced steps; the per-position table goes to `path`.
void timeline_step(int64_t ctx, int steps, const char* path) {
#ifndef FERN_HAVE_CUPTI
  (void)ctx, (void)steps, (void)path;
  std::printf("timeline: this build has no CUPTI\n");
#else
  CapturedStep cs(ctx);
  CudaBackend& be = cs.be;
  auto timed_us = [&] { return cs.replay_us(64); };  // untraced steps, for comparison with the traced ones
  const double plain_us = timed_us();
  bench::KernelTimeline tl;
  tl.start();
  for (int i = 0; i < steps; ++i) be.replay(*cs.st);
  be.synchronize();
  const std::vector<bench::KernelSpan> sp = tl.stop();
  const double traced_plain_us = timed_us();
  if (steps < 3 || sp.size() % size_t(steps) != 0) {
    std::printf("timeline: %zu kernels over %d steps, not a whole number per step\n", sp.size(), steps);
    return;
  }
  const size_t n = sp.size() / size_t(steps);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Steps 1 .. steps-1 (the first has no traced predecessor); per position: start lag, duration, advance.
  std::vector<std::vector<double>> lag(n), dur(n), adv(n), at(n);
  std::vector<double> wall;
  for (int s = 1; s < steps; ++s) {
    const size_t o = size_t(s) * n;
    uint64_t frontier = 0;
    for (size_t i = 0; i < o; ++i) frontier = std::max(frontier, sp[i].end);
    const uint64_t t0 = frontier;  // the previous step's last end
    for (size_t i = 0; i < n; ++i) {
      const auto& k = sp[o + i];
      const uint64_t prev_end = i == 0 ? t0 : sp[o + i - 1].end;
      lag[i].push_back((double(k.start) - double(prev_end)) * 1e-3);
      dur[i].push_back(double(k.end - k.start) * 1e-3);
      adv[i].push_back(k.end > frontier ? double(k.end - frontier) * 1e-3 : 0.0);
      at[i].push_back((double(k.start) - double(t0)) * 1e-3);
      frontier = std::max(frontier, k.end);
    }
    wall.push_back(double(frontier - t0) * 1e-3);
  }
  std::printf("\n== decode step timeline, %ld context: %zu kernels per step, %d traced steps ==\n", long(ctx), n, steps);
  std::printf("step: %.1f us traced (median of %d; last end to last end), %.1f us untraced before, %.1f after\n",
              median(wall), steps - 1, plain_us, traced_plain_us);
  // By kernel (name and grid): launches per step, summed medians.
  struct Sum {
    int count = 0;
    double lag = 0, dur = 0, adv = 0;
  };
  std::map<std::string, Sum> by;
  std::vector<std::string> key(n);
  for (size_t i = 0; i < n; ++i) {
    key[i] = bench::short_kernel_name(sp[i].name) + " [" + std::to_string(sp[i].grid) + "x" +
             std::to_string(sp[i].block) + "]";
    Sum& x = by[key[i]];
    ++x.count;
    x.lag += median(lag[i]);
    x.dur += median(dur[i]);
    x.adv += median(adv[i]);
  }
  std::vector<std::pair<std::string, Sum>> rows(by.begin(), by.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.adv > b.second.adv; });
  std::printf("%-56s %6s %10s %10s %10s %9s\n", "kernel [blocks x threads]", "count", "adv us", "dur us", "lag us",
              "adv/each");
  double tadv = 0, tdur = 0;
  for (const auto& [k, x] : rows) {
    std::printf("%-56s %6d %10.1f %10.1f %10.1f %9.2f\n", k.c_str(), x.count, x.adv, x.dur, x.lag, x.adv / x.count);
    tadv += x.adv;
    tdur += x.dur;
  }
  std::printf("%-56s %6zu %10.1f %10.1f\n", "total", n, tadv, tdur);
  if (path != nullptr) {
    FILE* f = std::fopen(path, "w");
    if (f != nullptr) {
      std::fprintf(f, "# position, kernel, start us (from the previous step's end), lag us, duration us, advance us "
                      "(medians over %d steps)\n", steps - 1);
      for (size_t i = 0; i < n; ++i)
        std::fprintf(f, "%4zu %-56s %9.2f %7.2f %7.2f %7.2f\n", i, key[i].c_str(), median(at[i]), median(lag[i]),
                     median(dur[i]), median(adv[i]));
      std::fclose(f);
    }
  }
#endif
}

// Where a prefill's time goes, kernel by kernel (CUPTI): a prompt of `len` random tokens prefilled in chunks of
// `chunk` rows (the engine's loop: one forward per chunk, the last row's logits), once untraced (warm-up: sizes the
// arena, loads the modules), then traced. Per kernel name: launches, summed durations and summed advances of the
// prefill's frontier (the advances add up to the traced wall time from the first kernel's start), and the idle time
// before it (the GPU running nothing between the frontier and its start); the ten longest idle gaps with the kernels
// on either side. With `path`, every launch (start, duration, idle before, stream) goes there.
void prefill_timeline(int64_t len, int64_t chunk, const char* path) {
#ifndef FERN_HAVE_CUPTI
  (void)len, (void)chunk, (void)path;
  std::printf("prefill-timeline: this build has no CUPTI\n");
#else
  const ModelConfig cfg = full_config();
  CudaBackend be(0);
  auto w = cuda::random_device_weights(be, cfg, 1);
  auto st = be.new_state(cfg, len + 1);
  std::vector<int32_t> ids(static_cast<size_t>(len));
  uint64_t x = 88172645463325252ull;
  for (auto& t : ids) {  // xorshift: any token ids below the vocabulary
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % 151000);
  }
  auto prefill = [&] {
    be.reset_state(*st);
    for (int64_t off = 0; off < len; off += chunk) {
      const int64_t n = std::min(chunk, len - off);
      be.begin_forward();
      Tensor dev_ids = be.scratch(DType::I32, {n});
      Tensor lg = be.scratch(DType::F32, {1, cfg.vocab_size});
      be.copy(dev_ids, Tensor(ids.data() + off, DType::I32, {n}));
      forward(be, *w, *st, dev_ids, lg);
    }
    be.synchronize();
  };
  prefill();
  auto t0 = std::chrono::steady_clock::now();
  prefill();
  const double plain_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bench::KernelTimeline tl;
  tl.start();
  prefill();
  const std::vector<bench::KernelSpan> sp = tl.stop();
  if (sp.empty()) return;
  struct Sum {
    int count = 0;
    double dur = 0, adv = 0, idle = 0;
  };
  std::map<std::string, Sum> by;
  std::vector<std::string> key(sp.size());
  std::vector<double> idle(sp.size(), 0.0);
  uint64_t frontier = sp.front().start;
  for (size_t i = 0; i < sp.size(); ++i) {
    const auto& k = sp[i];
    key[i] = bench::short_kernel_name(k.name) + " [" + std::to_string(k.block) + "]";
    Sum& s = by[key[i]];
    ++s.count;
    s.dur += double(k.end - k.start) * 1e-6;
    s.adv += k.end > frontier ? double(k.end - frontier) * 1e-6 : 0.0;
    idle[i] = k.start > frontier ? double(k.start - frontier) * 1e-6 : 0.0;
    s.idle += idle[i];
    frontier = std::max(frontier, k.end);
  }
  const double wall_ms = double(frontier - sp.front().start) * 1e-6;
  double idle_ms = 0;
  for (double v : idle) idle_ms += v;
  std::printf("\n== prefill timeline: %ld tokens in chunks of %ld, %zu kernels ==\n", long(len), long(chunk), sp.size());
  std::printf("untraced %.2f ms (%.0f tok/s, host clock); traced kernels %.2f ms first start to last end, %.2f ms of "
              "it with no kernel running\n",
              plain_s * 1e3, double(len) / plain_s, wall_ms, idle_ms);
  std::vector<std::pair<std::string, Sum>> rows(by.begin(), by.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.adv > b.second.adv; });
  std::printf("%-50s %7s %10s %10s %7s %10s\n", "kernel [threads]", "count", "adv ms", "dur ms", "adv %", "idle ms");
  for (const auto& [k, s] : rows)
    std::printf("%-50s %7d %10.3f %10.3f %6.1f%% %10.3f\n", k.c_str(), s.count, s.adv, s.dur, 100.0 * s.adv / wall_ms,
                s.idle);
  // The longest idle gaps: which launch the GPU waited for, and what ran before it.
  std::vector<size_t> order(sp.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t top = std::min<size_t>(10, order.size());
  std::partial_sort(order.begin(), order.begin() + top, order.end(),
                    [&](size_t a, size_t b) { return idle[a] > idle[b]; });
  std::printf("longest idle gaps (us before the launch; launch index, the launch before it):\n");
  for (size_t r = 0; r < top && idle[order[r]] > 0; ++r) {
    const size_t i = order[r];
    std::printf("  %8.1f us  #%zu %s (stream %u)  after #%zu %s (stream %u)\n", idle[i] * 1e3, i, key[i].c_str(),
                sp[i].stream, i - 1, i > 0 ? key[i - 1].c_str() : "-", i > 0 ? sp[i - 1].stream : 0u);
  }
  if (path != nullptr) {
    FILE* f = std::fopen(path, "w");
    if (f != nullptr) {
      std::fprintf(f, "# launch, kernel [threads], stream, start ms (from the first), duration us, idle before us\n");
      for (size_t i = 0; i < sp.size(); ++i)
        std::fprintf(f, "%5zu %-50s %3u %10.3f %9.1f %8.1f\n", i, key[i].c_str(), sp[i].stream,
                     double(sp[i].start - sp.front().start) * 1e-6, double(sp[i].end - sp[i].start) * 1e-3,
                     idle[i] * 1e3);
      std::fclose(f);
    }
  }
#endif
}

void bench_decode(bool splitk, bool steps = true) {
  const ModelConfig cfg = full_config();
  CudaBackend be(0);
  auto w = cuda::random_device_weights(be, cfg, 1);
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  Tensor tok = be.alloc(DType::I32, {1});
  FERN_CUDA_CHECK(cudaMemset(tok.data, 0, 4));

  // Per-block breakdown at 4K context: each row replays only that kind of block, for all layers of that kind.
  {
    auto st = be.new_state(cfg, 4096 + 256);
    fill_state(be, static_cast<CudaState&>(*st), 4096);
    Tensor xn = be.alloc(DType::F32, {1, H}), out = be.alloc(DType::F32, {1, H}), h = be.alloc(DType::F32, {1, H});
    Tensor out2 = be.alloc(DType::F32, {1, H});
    cuda::fill_random_f32(be.stream(), out.ptr<float>(), H, 2, -0.1f, 0.1f);
    cuda::fill_random_f32(be.stream(), xn.ptr<float>(), H, 3, -1, 1);
    cuda::fill_random_f32(be.stream(), h.ptr<float>(), H, 4, -1, 1);
    // unfused: the core with its gated norm (gdn_core), then out_proj as a plain GEMV (before version 8 of the
    // decode GDN; forward.cpp now calls gdn_core_linear, whose GEMV applies the norm).
    auto gdn_mixer_as = [&](int l, bool unfused) {
      const GdnWeights& g = w->layers[l].gdn;
      Tensor mixed = be.scratch(DType::F32, {1, cfg.gdn_conv_dim()}), z = be.scratch(DType::F32, {1, cfg.gdn_value_dim()});
      Tensor b = be.scratch(DType::F32, {1, cfg.linear_num_value_heads}), a = be.scratch(DType::F32, {1, cfg.linear_num_value_heads});
      Tensor y = be.scratch(DType::F32, {1, cfg.gdn_value_dim()});
      const Tensor po[] = {mixed, z, b, a};  // as forward.cpp: the input norm and the four projections in one launch
      const LinearWeight* const pw[] = {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a};
      be.rmsnorm_linear_multi(po, h, w->layers[l].input_norm, 1e-6f, xn, pw);
      if (unfused) {
        be.gdn_core(y, mixed, z, b, a, g, cfg, *st, l);
        be.linear(out, y, g.out_proj);
      } else {
        be.gdn_core_linear(out, y, mixed, z, b, a, g, cfg, *st, l);
      }
    };
    auto gdn_mixer = [&](int l) { gdn_mixer_as(l, false); };
    auto attn_mixer = [&](int l) {
      const AttnWeights& at = w->layers[l].attn;
      const int64_t qd = int64_t(cfg.num_attention_heads) * cfg.head_dim, kvd = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
      Tensor qg = be.scratch(DType::F32, {1, 2 * qd}), k = be.scratch(DType::F32, {1, kvd}), v = be.scratch(DType::F32, {1, kvd});
      Tensor o = be.scratch(DType::F32, {1, qd});
      const Tensor po[] = {qg, k, v};  // as forward.cpp: the input norm and q/k/v in one launch
      const LinearWeight* const pw[] = {&at.q_proj, &at.k_proj, &at.v_proj};
      be.rmsnorm_linear_multi(po, h, w->layers[l].input_norm, 1e-6f, xn, pw);
      be.attn_core(o, qg, k, v, at, cfg, *st, l);
      be.linear(out, o, at.o_proj);
    };
    // The MoE and attention kernels one by one (chains of the same dependent launch), to split the block times.
    cuda::Ctx kc;
    kc.stream = be.stream();
    kc.sms = be.sm_count();
    kc.pdl = be.pdl();
    Tensor cnt = be.alloc(DType::I32, {4096});
    FERN_CUDA_CHECK(cudaMemset(cnt.data, 0, cnt.nbytes()));
    kc.counters = cnt.ptr<int>();
    kc.n_counters = 4096;
    const int topk = cfg.num_experts_per_tok;
    const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, Is = cfg.shared_expert_intermediate_size;
    Tensor rl = be.alloc(DType::F32, {E}), sgl = be.alloc(DType::F32, {1}), ids = be.alloc(DType::I32, {topk}),
           tw = be.alloc(DType::F32, {topk}), sg = be.alloc(DType::F32, {1}), hh = be.alloc(DType::F32, {topk * I + Is});
    const cuda::MoeScratch ms{rl.ptr<float>(), sgl.ptr<float>(), ids.ptr<int32_t>(), tw.ptr<float>(), sg.ptr<float>(),
                              hh.ptr<float>()};
    auto mq = [&](int l) -> const MoeWeights& { return w->layers[l].moe; };
    cuda::moe_route(kc, cuda::make_qw(mq(0).router), cuda::make_qw(mq(0).shared_expert_gate), xn.ptr<float>(), ms, 1,
                    topk);  // valid expert ids for the gate/up and down rows
    cuda::moe_gate_up(kc, cuda::make_qw(mq(0).gate), cuda::make_qw(mq(0).up), cuda::make_qw(mq(0).shared_gate),
                      cuda::make_qw(mq(0).shared_up), xn.ptr<float>(), ms, 1, topk);
    const int64_t qd = int64_t(cfg.num_attention_heads) * cfg.head_dim;
    auto& cst = static_cast<CudaState&>(*st);
    cuda::AttnShape ash{cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim(),
                        static_cast<float>(cfg.rope_theta), static_cast<float>(cfg.rms_norm_eps), cst.capacity};
    Tensor aq = be.alloc(DType::F32, {qd}), aqg = be.alloc(DType::F32, {2 * qd}), ao = be.alloc(DType::F32, {qd});
    Tensor pml = be.alloc(DType::F32, {qd / cfg.head_dim, cst.nsplit, 2}), pacc = be.alloc(DType::F32, {qd, cst.nsplit});
    cuda::fill_random_f32(be.stream(), aq.ptr<float>(), qd, 5, -1, 1);
    cuda::fill_random_f32(be.stream(), aqg.ptr<float>(), 2 * qd, 6, -1, 1);
    const int64_t kvd = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
    Tensor akv = be.alloc(DType::F32, {2 * kvd});  // k then v of the new position (attn_prep)
    cuda::fill_random_f32(be.stream(), akv.ptr<float>(), 2 * kvd, 7, -1, 1);
    struct Row {
      const char* name;
      std::function<void()> body;
    };
    std::vector<Row> rows = {
        {"30 x GDN mixer (4 proj + core + out)", [&] { be.begin_forward(); for (int l = 0; l < cfg.num_hidden_layers; ++l) if (!cfg.is_attention_layer(l)) gdn_mixer(l); }},
        {"  same, 512-thread GEMV blocks (GEMV_WIDE=1)", [&] {
           setenv("FERN_CUDA_GEMV_WIDE", "1", 1);
           be.begin_forward();
           for (int l = 0; l < cfg.num_hidden_layers; ++l) if (!cfg.is_attention_layer(l)) gdn_mixer(l);
           unsetenv("FERN_CUDA_GEMV_WIDE");
         }},
        {"  same, out_proj with the norm at 512 threads (GNORM_WIDE=1)", [&] {
           setenv("FERN_CUDA_GNORM_WIDE", "1", 1);
           be.begin_forward();
           for (int l = 0; l < cfg.num_hidden_layers; ++l) if (!cfg.is_attention_layer(l)) gdn_mixer(l);
           unsetenv("FERN_CUDA_GNORM_WIDE");
         }},
        {"  same, unfused (gdn_core with its norm, then out_proj)", [&] {
           be.begin_forward();
           for (int l = 0; l < cfg.num_hidden_layers; ++l) if (!cfg.is_attention_layer(l)) gdn_mixer_as(l, true);
         }},
        {"10 x attention mixer @4K", [&] { be.begin_forward(); for (int l = 0; l < cfg.num_hidden_layers; ++l) if (cfg.is_attention_layer(l)) attn_mixer(l); }},
        {"  of which 30 x gdn_core", [&] {
           be.begin_forward();
           Tensor mixed = be.scratch(DType::F32, {1, cfg.gdn_conv_dim()}), z = be.scratch(DType::F32, {1, cfg.gdn_value_dim()});
           Tensor b = be.scratch(DType::F32, {1, cfg.linear_num_value_heads}), a = be.scratch(DType::F32, {1, cfg.linear_num_value_heads});
           Tensor y = be.scratch(DType::F32, {1, cfg.gdn_value_dim()});
           for (int l = 0; l < cfg.num_hidden_layers; ++l)
             if (!cfg.is_attention_layer(l)) be.gdn_core(y, mixed, z, b, a, w->layers[l].gdn, cfg, *st, l);
         }},
        {"  of which 30 x raw step kernel (no norm)", [&] {
           be.begin_forward();
           Tensor mixed = be.scratch(DType::F32, {1, cfg.gdn_conv_dim()});
           Tensor b = be.scratch(DType::F32, {1, cfg.linear_num_value_heads}), a = be.scratch(DType::F32, {1, cfg.linear_num_value_heads});
           Tensor y = be.scratch(DType::F32, {1, cfg.gdn_value_dim()});
           const cuda::GdnShape gsh{cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                    cfg.linear_value_head_dim, static_cast<int>(cfg.gdn_conv_dim()),
                                    cfg.linear_conv_kernel_dim, static_cast<float>(cfg.rms_norm_eps)};
           for (int l = 0; l < cfg.num_hidden_layers; ++l)
             if (!cfg.is_attention_layer(l)) {
               const GdnWeights& g = w->layers[l].gdn;
               auto& cs = static_cast<CudaState&>(*st);
               cuda::gdn_step_raw(kc, gsh, 0, mixed.ptr<float>(), b.ptr<float>(), a.ptr<float>(), g.conv_w.ptr<float>(),
                                  g.A_log.ptr<float>(), g.dt_bias.ptr<float>(), cs.conv_state[l].ptr<float>(),
                                  cs.recurrent_state[l].ptr<float>(), y.ptr<float>(), true);
             }
         }},
        {"  of which 30 x out_proj with the gated norm", [&] {
           be.begin_forward();
           Tensor y = be.scratch(DType::F32, {1, cfg.gdn_value_dim()}), z = be.scratch(DType::F32, {1, cfg.gdn_value_dim()});
           for (int l = 0; l < cfg.num_hidden_layers; ++l)
             if (!cfg.is_attention_layer(l)) {
               const GdnWeights& g = w->layers[l].gdn;
               cuda::linear_gated_norm(kc, cuda::make_qw(g.out_proj), y.ptr<float>(), z.ptr<float>(), g.norm_w.ptr<float>(),
                                       1e-6f, cfg.linear_value_head_dim, out.ptr<float>(), true);
             }
         }},
        {"  of which 30 x out_proj, plain GEMV", [&] {
           be.begin_forward();
           Tensor y = be.scratch(DType::F32, {1, cfg.gdn_value_dim()});
           for (int l = 0; l < cfg.num_hidden_layers; ++l)
             if (!cfg.is_attention_layer(l)) cuda::linear(kc, cuda::make_qw(w->layers[l].gdn.out_proj), y.ptr<float>(), out.ptr<float>(), 1);
         }},
        {"  of which 10 x attn_core @4K", [&] {
           be.begin_forward();
           const int64_t qd = int64_t(cfg.num_attention_heads) * cfg.head_dim, kvd = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
           Tensor qg = be.scratch(DType::F32, {1, 2 * qd}), k = be.scratch(DType::F32, {1, kvd}), v = be.scratch(DType::F32, {1, kvd});
           Tensor o = be.scratch(DType::F32, {1, qd});
           for (int l = 0; l < cfg.num_hidden_layers; ++l)
             if (cfg.is_attention_layer(l)) be.attn_core(o, qg, k, v, w->layers[l].attn, cfg, *st, l);
         }},
        {"40 x MoE block (with norm + residual)", [&] { be.begin_forward(); for (int l = 0; l < cfg.num_hidden_layers; ++l) be.moe_residual(h, out, xn, w->layers[l].post_norm, 1e-6f, out2, w->layers[l].moe, cfg); }},
        {"  same, 256-thread blocks (MOE_WIDE=0)", [&] {
           setenv("FERN_CUDA_MOE_WIDE", "0", 1);  // read when the launches are recorded
           be.begin_forward();
           for (int l = 0; l < cfg.num_hidden_layers; ++l) be.moe_residual(h, out, xn, w->layers[l].post_norm, 1e-6f, out2, w->layers[l].moe, cfg);
           unsetenv("FERN_CUDA_MOE_WIDE");
         }},
        {"  40 x moe alone (one launch each)", [&] { be.begin_forward(); for (int l = 0; l < cfg.num_hidden_layers; ++l) be.moe(out, xn, w->layers[l].moe, cfg); }},
        {"  three-launch path: 40 x moe_route", [&] { for (int l = 0; l < cfg.num_hidden_layers; ++l) cuda::moe_route(kc, cuda::make_qw(mq(l).router), cuda::make_qw(mq(l).shared_expert_gate), xn.ptr<float>(), ms, 1, topk); }},
        {"  three-launch path: 40 x moe_gate_up", [&] { for (int l = 0; l < cfg.num_hidden_layers; ++l) cuda::moe_gate_up(kc, cuda::make_qw(mq(l).gate), cuda::make_qw(mq(l).up), cuda::make_qw(mq(l).shared_gate), cuda::make_qw(mq(l).shared_up), xn.ptr<float>(), ms, 1, topk); }},
        {"  three-launch path: 40 x moe_down", [&] { for (int l = 0; l < cfg.num_hidden_layers; ++l) cuda::moe_down(kc, cuda::make_qw(mq(l).down), cuda::make_qw(mq(l).shared_down), ms, out.ptr<float>(), 1, topk); }},
        {"  of which 10 x attn split+combine @4K", [&] { for (int l = 0; l < cfg.num_hidden_layers; ++l) if (cfg.is_attention_layer(l)) cuda::attn_decode(kc, ash, cst.d_pos, aq.ptr<float>(), aqg.ptr<float>(), cst.k_cache[l].ptr<uint16_t>(), cst.v_cache[l].ptr<uint16_t>(), pml.ptr<float>(), pacc.ptr<float>(), ao.ptr<float>(), 1, cst.nsplit); }},
        {"  of which 10 x attn tc+combine @4K", [&] { for (int l = 0; l < cfg.num_hidden_layers; ++l) if (cfg.is_attention_layer(l)) cuda::attn_decode_tc(kc, ash, cst.d_pos, aq.ptr<float>(), aqg.ptr<float>(), cst.k_cache[l].ptr<uint16_t>(), cst.v_cache[l].ptr<uint16_t>(), pml.ptr<float>(), pacc.ptr<float>(), ao.ptr<float>(), 1, cst.nsplit); }},
        {"  of which 10 x attn combine @4K", [&] { for (int l = 0; l < cfg.num_hidden_layers; ++l) if (cfg.is_attention_layer(l)) cuda::attn_decode_combine(kc, ash, cst.nsplit, pml.ptr<float>(), pacc.ptr<float>(), aqg.ptr<float>(), ao.ptr<float>(), 1); }},
        {"  same, combine v1 (ATTN_COMBINE=v1)", [&] {
           setenv("FERN_CUDA_ATTN_COMBINE", "v1", 1);
           for (int l = 0; l < cfg.num_hidden_layers; ++l) if (cfg.is_attention_layer(l)) cuda::attn_decode_combine(kc, ash, cst.nsplit, pml.ptr<float>(), pacc.ptr<float>(), aqg.ptr<float>(), ao.ptr<float>(), 1);
           unsetenv("FERN_CUDA_ATTN_COMBINE");
         }},
        {"  of which 10 x attn_prep", [&] { for (int l = 0; l < cfg.num_hidden_layers; ++l) if (cfg.is_attention_layer(l)) cuda::attn_prep(kc, ash, cst.d_pos, aqg.ptr<float>(), akv.ptr<float>(), akv.ptr<float>() + kvd, w->layers[l].attn.q_norm.ptr<float>(), w->layers[l].attn.k_norm.ptr<float>(), aq.ptr<float>(), cst.k_cache[l].ptr<uint16_t>(), cst.v_cache[l].ptr<uint16_t>(), 1); }},
        {"  (v3's 80 x add_rmsnorm, now folded)", [&] { for (int l = 0; l < 80; ++l) be.add_rmsnorm(h, out, xn, w->layers[l / 2].post_norm, 1e-6f); }},
        {"lm_head + argmax", [&] { be.begin_forward(); Tensor lg = be.scratch(DType::F32, {1, V}); be.linear(lg, xn, w->lm_head); be.argmax(tok, lg); }},
        {"  same, 256-thread GEMV blocks (GEMV_WIDE=0)", [&] {
           setenv("FERN_CUDA_GEMV_WIDE", "0", 1);
           be.begin_forward(); Tensor lg = be.scratch(DType::F32, {1, V}); be.linear(lg, xn, w->lm_head); be.argmax(tok, lg);
           unsetenv("FERN_CUDA_GEMV_WIDE");
         }},
    };
    std::printf("\n== one decode step, by block (full-size random model, 4K context, graph replay) ==\n");
    double sum = 0;
    for (auto& r : rows) {
      const double t = time_graph(be, r.body);
      if (r.name[0] != ' ') sum += t;
      std::printf("%-40s %9.1f us\n", r.name, t * 1e6);
    }
    std::printf("%-40s %9.1f us\n", "sum of blocks", sum * 1e6);

    // Phase timing of the fused MoE (a build with -DFERN_MOE_PHASE_TIMING only): the "40 x MoE block" row three
    // times over, each launch with its own %globaltimer stamps, replayed as a graph; means over the 120 launches.
    const int L = cfg.num_hidden_layers, R = 3;
    unsigned long long* dst = nullptr;
    const size_t sbytes = size_t(R) * L * cuda::kMoeStamps * sizeof(unsigned long long);
    FERN_CUDA_CHECK(cudaMalloc(&dst, sbytes));
    cuda::Ctx tc = kc;
    tc.counters = cnt.ptr<int>() + 64;  // its own counters (the epoch protocol), apart from the three-launch rows'
    tc.n_counters = cuda::kMoeFusedCounters;
    cuda::MoeNorm nm;
    nm.resid = h.ptr<float>();
    nm.delta = out.ptr<float>();
    nm.eps = 1e-6f;
    nm.xn = xn.ptr<float>();
    nm.add_out = true;
    auto moe_qw = [&](int l) { return cuda::make_moe_qw(mq(l)); };
    // FERN_BENCH_MOE_ONE_LAYER=1: every launch on layer 0's experts (one layer's pages instead of forty: a probe of
    // address translation's share in the expert rows' segment; docs/notes/cuda-decode-v15-topk.md section 5).
    const bool one_layer = std::getenv("FERN_BENCH_MOE_ONE_LAYER") != nullptr;
    // The fold form (as the forward pass runs it: the router in the mixer's output projection before each MoE,
    // kernels.h RouteFold): each timed launch follows a fold projection of that layer's own output projection on a
    // random input row, which adds to the residual and leaves the pre-logits. One packed router copy per layer.
    std::vector<Tensor> fold_packed;
    std::vector<cuda::RouteFold> folds;
    Tensor fold_pre = be.alloc(DType::I64, {(E + 1) * cuda::kFoldStride});
    FERN_CUDA_CHECK(cudaMemset(fold_pre.data, 0, fold_pre.nbytes()));
    auto fold_proj = [&](int l) -> const LinearWeight& {
      return cfg.is_attention_layer(l) ? w->layers[l].attn.o_proj : w->layers[l].gdn.out_proj;
    };
    bool fold_ok = cuda::moe_fused_fold_ok(tc, moe_qw(0), topk);
    for (int l = 0; l < L && fold_ok; ++l) {
      cuda::RouteFold f;
      f.router = cuda::make_qw(mq(l).router);
      f.sgr = cuda::make_qw(mq(l).shared_expert_gate);
      fold_ok = cuda::route_fold_pack_ok(f.router, f.sgr) && fold_proj(l).in == qd;
      if (!fold_ok) break;
      fold_packed.push_back(be.alloc(DType::U8, {int64_t(cuda::route_fold_pack_bytes(f.router))}));
      cuda::Ctx pc = kc;
      pc.pdl = false;
      cuda::route_fold_pack(pc, f.router, f.sgr, fold_packed.back().data);
      f.packed = fold_packed.back().data;
      f.norm_w = w->layers[l].post_norm.ptr<float>();
      f.resid = h.ptr<float>();
      f.pre = fold_pre.ptr<long long>();
      fold_ok = cuda::route_fold_ok(cuda::make_qw(fold_proj(l)), f);
      folds.push_back(f);
    }
    FERN_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
    for (const char* form : {"1", "0", "fold"}) {
    const bool fold = form[0] == 'f';
    const char* wide = fold ? "1" : form;
    if (!steps && wide[0] == '0') continue;  // "blocks": the default block size only
    if (fold && !fold_ok) {
      std::printf("\n(fused MoE phase timing, fold form: not taken for these weights or switches)\n");
      continue;
    }
    setenv("FERN_CUDA_MOE_WIDE", wide, 1);
    cuda::MoeNorm fnm = nm;
    if (fold) {
      fnm.delta = nullptr;
      fnm.pre = fold_pre.ptr<long long>();
      fnm.pre_stride = cuda::kFoldStride;
    }
    bool timed = true;
    const double tt = time_graph(be, [&] {
      FERN_CUDA_CHECK(cudaMemsetAsync(dst, 0, sbytes, be.stream()));
      for (int r = 0; r < R && timed; ++r)
        for (int l = 0; l < L && timed; ++l) {
          const int lw = one_layer ? 0 : l;
          fnm.w = w->layers[lw].post_norm.ptr<float>();
          if (fold) cuda::linear_fold(kc, cuda::make_qw(fold_proj(lw)), aq.ptr<float>(), out.ptr<float>(), folds[lw]);
          timed = cuda::moe_fused_timed(tc, moe_qw(lw), nullptr, ms, out2.ptr<float>(), topk, &fnm,
                                        dst + (size_t(r) * L + l) * cuda::kMoeStamps);
        }
    });
    if (!timed) {
      std::printf("\n(fused MoE phase timing: not compiled in; build with CUDAFLAGS=-DFERN_MOE_PHASE_TIMING)\n");
      break;
    } else {
      std::vector<unsigned long long> hs(sbytes / sizeof(unsigned long long));
      FERN_CUDA_CHECK(cudaMemcpy(hs.data(), dst, sbytes, cudaMemcpyDeviceToHost));
      const int n = R * L;
      auto at = [&](int i, int k) { return hs[size_t(i) * cuda::kMoeStamps + k]; };
      auto first = [&](int i) { return ~at(i, cuda::kMoeStampFirstStart); };
      std::printf("\n== fused MoE phases (moe_residual, %s blocks%s, %d launches%s, graph replay %.2f us per launch%s): "
                  "us from the launch's first block start ==\n", wide[0] == '1' ? "512-thread" : "256-thread",
                  fold ? ", fold form" : "", n, one_layer ? " all on layer 0" : "", tt * 1e6 / n,
                  fold ? " with its projection" : "");
      std::printf("%-60s %8s %8s %8s\n", "point", "mean", "min", "max");
      const struct {
        const char* name;
        int k;
      } pts[] = {{"last block start", cuda::kMoeStampLastStart},
                 {"block 0: start", cuda::kMoeStampStart},
                 {"block 0: past the PDL wait", cuda::kMoeStampWaited},
                 {"block 0: input (norm) staged", cuda::kMoeStampStaged},
                 {"block 0: router/shared rows done (arrive 1; fold: warp 1's shared rows)", cuda::kMoeStampArrive1},
                 {"last block arrives at handoff 1", cuda::kMoeStampLastArrive1},
                 {"block 0: past handoff 1", cuda::kMoeStampPass1},
                 {"block 0: top-k keys loaded", cuda::kMoeStampTopkKeys},
                 {"block 0: top-k rounds done", cuda::kMoeStampTopkRounds},
                 {"block 0: top-k + expert tables done", cuda::kMoeStampRouted},
                 {"block 0: gate/up rows done (arrive 2)", cuda::kMoeStampArrive2},
                 {"last block arrives at handoff 2", cuda::kMoeStampLastArrive2},
                 {"block 0: past handoff 2", cuda::kMoeStampPass2},
                 {"block 0: h staged", cuda::kMoeStampHStaged},
                 {"block 0: end", cuda::kMoeStampEnd},
                 {"last block end", cuda::kMoeStampLastEnd}};
      for (const auto& pt : pts) {
        bool stamped = false;  // (the fold form has no router handoff: its three points are never stamped)
        for (int i = 0; i < n; ++i) stamped = stamped || at(i, pt.k) != 0;
        if (!stamped) continue;
        double sum = 0, mn = 1e30, mx = -1e30;
        for (int i = 0; i < n; ++i) {
          const double v = (double(at(i, pt.k)) - double(first(i))) * 1e-3;
          sum += v;
          mn = std::min(mn, v);
          mx = std::max(mx, v);
        }
        std::printf("%-60s %8.2f %8.2f %8.2f\n", pt.name, sum / n, mn, mx);
      }
      double gap = 0;
      for (int i = 1; i < n; ++i) gap += (double(first(i)) - double(at(i - 1, cuda::kMoeStampLastEnd))) * 1e-3;
      std::printf("%-60s %8.2f\n", fold ? "previous MoE's last end -> first start (the projection between)"
                                        : "gap: previous launch's last end -> first start", gap / (n - 1));
    }
    }
    unsetenv("FERN_CUDA_MOE_WIDE");
    FERN_CUDA_CHECK(cudaFree(dst));
  }

  // Split-K choice: 10 attention cores at several contexts and split counts, for each decode kernel
  // (FERN_CUDA_ATTN_DECODE: tensor cores, CUDA-core split kernel with its default head grouping).
  for (const char* kern : {"tc", "split"}) {
    if (!splitk) break;
    setenv("FERN_CUDA_ATTN_DECODE", kern, 1);
    std::printf("\n== attention split-K, FERN_CUDA_ATTN_DECODE=%s: us for 10 x attn_core (graph replay) ==\n%8s", kern, "context");
    const int splits[] = {4, 16, 32, 64, 128};
    for (int n : splits) std::printf(" %8s%-3d", "nsplit=", n);
    std::printf("\n");
    const int64_t qd = int64_t(cfg.num_attention_heads) * cfg.head_dim, kvd = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
    for (int64_t ctx : {1024, 4096, 32768, 131072}) {
      auto st = be.new_state(cfg, ctx + 16);
      auto& cs = static_cast<CudaState&>(*st);
      fill_state(be, cs, ctx);
      std::printf("%8ld", long(ctx));
      for (int n : splits) {
        cs.nsplit = n;
        const double t = time_graph(be, [&] {
          be.begin_forward();
          Tensor qg = be.scratch(DType::F32, {1, 2 * qd}), k = be.scratch(DType::F32, {1, kvd}), v = be.scratch(DType::F32, {1, kvd});
          Tensor o = be.scratch(DType::F32, {1, qd});
          for (int l = 0; l < cfg.num_hidden_layers; ++l)
            if (cfg.is_attention_layer(l)) be.attn_core(o, qg, k, v, w->layers[l].attn, cfg, *st, l);
        });
        std::printf(" %11.1f", t * 1e6);
      }
      std::printf("   (default nsplit %d)\n", cuda::attn_splits(ctx + 256));
    }
  }
  unsetenv("FERN_CUDA_ATTN_DECODE");  // the decode steps below use the default kernel

  if (!steps) return;  // "blocks": the breakdown and the MoE phases only
  std::printf("\n== decode steps (graph replay, 64 steps per run, median of 3 runs) ==\n");
  std::printf("%8s %10s %10s %12s %9s %8s\n", "context", "us/token", "tok/s", "bytes/token", "GB/s", "%roof");
  // The last rows repeat 4K with one switch each (read while the step is captured): 256-thread blocks for every
  // GEMV, the fused MoE's 256-thread blocks of version 5.
  const struct {
    int64_t ctx;
    const char* env;
    const char* val;
  } step_rows[] = {{256, nullptr, nullptr},   {1024, nullptr, nullptr},  {4096, nullptr, nullptr},
                   {16384, nullptr, nullptr}, {32768, nullptr, nullptr}, {131072, nullptr, nullptr},
                   {4096, "FERN_CUDA_GEMV_WIDE", "0"}, {4096, "FERN_CUDA_MOE_WIDE", "0"},
                   {4096, "FERN_CUDA_ATTN_DECODE", "split"}, {131072, "FERN_CUDA_ATTN_DECODE", "split"}};
  for (const auto& row : step_rows) {
    const int64_t ctx = row.ctx;
    if (row.env != nullptr) setenv(row.env, row.val, 1);
    auto st = be.new_state(cfg, ctx + 256);
    fill_state(be, static_cast<CudaState&>(*st), ctx);
    auto step = [&] {
      be.begin_forward();
      Tensor lg = be.scratch(DType::F32, {1, V});
      forward(be, *w, *st, tok, lg);
      be.argmax(tok, lg);
    };
    step();  // eager: sizes the arena
    be.synchronize();
    be.capture_step(*st, step);
    std::vector<double> runs;
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int r = 0; r < 3; ++r) {
      cudaEventRecord(a, be.stream());
      for (int i = 0; i < 64; ++i) be.replay(*st);
      cudaEventRecord(b, be.stream());
      FERN_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      runs.push_back(ms * 1e-3 / 64);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    be.drop_graph();
    std::sort(runs.begin(), runs.end());
    const double t = runs[1];
    const double bytes = 1.670e9 + 126e6 + double(ctx) * 20480.0;
    if (ctx == 256) std::printf("(parallel branches %s)\n", be.branches() ? "on" : "off");
    std::printf("%8ld %10.1f %10.1f %11.2fG %9.0f %7.1f%%", long(ctx), t * 1e6, 1.0 / t, bytes / 1e9, bytes / t / 1e9,
                100.0 * bytes / t / kCopyBw);
    if (row.env != nullptr) {
      std::printf("  (%s=%s)", row.env, row.val);
      unsetenv(row.env);
    }
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string what = argc > 1 ? argv[1] : "all";
    {
      CudaBackend probe(0);
      std::printf("programmatic dependent launch: %s\n", probe.pdl() ? "on" : "off");
    }
    // "steps": the GEMV table, the breakdown and the decode steps without the split-K tables (a shorter GPU call).
    if (what == "all" || what == "gemv" || what == "steps") bench_gemv();
    if (what == "all" || what == "decode" || what == "steps") bench_decode(what != "steps");
    if (what == "attn") bench_decode(true);  // the decode breakdown, split-K tables and steps, no GEMV table
    if (what == "blocks") bench_decode(false, false);  // the 4K breakdown and the MoE phases alone
    if (what == "profile") profile_step(argc > 2 ? std::atoi(argv[2]) : 20);
    // "timeline [ctx] [steps] [file]": the per-kernel timeline of the decode step (CUPTI).
    if (what == "timeline")
      timeline_step(argc > 2 ? std::atoll(argv[2]) : 4096, argc > 3 ? std::atoi(argv[3]) : 9, argc > 4 ? argv[4] : nullptr);
    // "prefill-timeline [len] [chunk] [file]": the per-kernel breakdown of one prefill (CUPTI), every launch to file.
    if (what == "prefill-timeline")
      prefill_timeline(argc > 2 ? std::atoll(argv[2]) : 4096, argc > 3 ? std::atoll(argv[3]) : 8192,
                       argc > 4 ? argv[4] : nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
