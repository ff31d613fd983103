// `fern bench`: decode and prefill throughput over context lengths, each figure next to its roofline
// (PERF.md section 4: warm-up, several runs, median and spread; decode = greedy steps from a filled state,
// prefill = a prompt from an empty state up to its first token's logits).
#include <fmt/format.h>
#include <unistd.h>  // environ
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "cli/setup.h"
#include "core/bf16.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/cost.h"
#include "model/forward.h"

#if defined(FERN_HAVE_CUDA)
#include "cuda/cuda_backend_impl.h"
#endif

#ifndef FERN_GIT_COMMIT
#define FERN_GIT_COMMIT "unknown"
#endif

namespace fern::cli {
namespace {

// The FERN_* environment switches of this process, sorted by name: a benchmark's figures depend on them (kernel
// forms, tile heights, chunk sizes), so its table and JSON record them.
std::vector<std::pair<std::string, std::string>> fern_switches() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (kv.rfind("FERN_", 0) == 0 && eq != std::string::npos) out.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

constexpr double kCopyBandwidth = 4.27e12;   // H200 device copy, bytes/s (PERF.md section 1)
constexpr double kTensorFlops = 790e12;      // H200 bf16 dense, FLOP/s (PERF.md section 1)

struct Options {
  ModelSource source;
  std::string backend = "auto";
  std::string phase = "decode";
  std::string lengths = "256,512,1024,2048,4096,8192,16384,32768,65536,131072";
  std::string prefill_lengths;  // empty: the same as `lengths`
  int steps = 64;
  int warmup = 8;
  int runs = 3;
  int threads = 0;
  bool host_loop = false;  // decode through Engine::decode (logits to the host every step) even on CUDA
  // The host loop picks each token with the server's Sampler and these parameters (temperature 0: greedy), so that
  // it times what a served request pays per token.
  SamplingParams sampling = [] {
    SamplingParams p;
    p.temperature = 0.0f;
    p.seed = 1;
    return p;
  }();
  std::string json_path, md_path;
  // "NAME=v1,v2,...": decode once per value of the environment switch NAME in each run, the values interleaved
  // run by run (same weights, same process: a comparison that drift between processes or machines cannot blur).
  std::string decode_switch;
  // Prefill chunk sizes to compare ("0": the backend's choice), run in increasing order so that the scratch column
  // (the arena's peak so far) is each chunk size's own peak.
  std::string prefill_chunks = "0";
};

// Comma-separated counts of tokens (K suffix = 1024), each at least `min`; `opt` names the option in errors.
std::vector<int64_t> parse_lengths(const std::string& s, const char* opt = "--lengths", int64_t min = 1) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    int64_t mult = 1;
    if (!item.empty() && (item.back() == 'K' || item.back() == 'k')) {
      mult = 1024;
      item.pop_back();
    }
    try {
      v.push_back(std::stoll(item) * mult);
    } catch (const std::exception&) {
      fail("{}: '{}' is not a number", opt, item);
    }
    if (v.back() < min) fail("{}: {} must be at least {}", opt, v.back(), min);
    pos = end + 1;
  }
  return v;
}

// Fills a tensor with values uniform in [-scale, scale] (cheap generator: the state need not be realistic, only
// non-zero and finite, so that timing is honest).
void fill_random(Backend& be, Tensor t, uint64_t seed, float scale) {
  if (t.empty()) return;
  const int64_t n = t.numel();
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
  };
  if (t.dtype == DType::F32) {
    std::vector<float> h(static_cast<size_t>(n));
    for (auto& x : h) x = next() * scale;
    be.copy(t, Tensor(h.data(), DType::F32, {n}).reshape({n}));
  } else if (t.dtype == DType::BF16) {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    for (auto& x : h) x = f32_to_bf16(next() * scale);
    be.copy(t, Tensor(h.data(), DType::BF16, {n}));
  } else {
    fail("bench: cannot fill a state tensor of dtype {}", dtype_name(t.dtype));
  }
}

// State of `context` tokens without running a prefill: random KV rows and recurrent/conv state.
void fill_state(Backend& be, SequenceState& st, int64_t context) {
  be.reset_state(st);
  for (size_t l = 0; l < st.k_cache.size(); ++l) {
    if (!st.k_cache[l].empty()) {
      fill_random(be, st.k_cache[l].slice0(0, context), 11 + l, 1.0f);
      fill_random(be, st.v_cache[l].slice0(0, context), 13 + l, 1.0f);
    }
  }
  for (size_t l = 0; l < st.recurrent_state.size(); ++l) {
    fill_random(be, st.recurrent_state[l], 17 + l, 0.05f);
    fill_random(be, st.conv_state[l], 19 + l, 0.5f);
  }
  be.advance(st, context);
}

// The device the numbers were measured on, for the JSON record.
nlohmann::json device_info(const Backend& be) {
  nlohmann::json d = {{"backend", be.name()}};
#if defined(FERN_HAVE_CUDA)
  if (const auto* cb = dynamic_cast<const CudaBackend*>(&be)) {
    cudaDeviceProp p{};
    int dev = 0, driver = 0, runtime = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess) {
      d["gpu"] = p.name;
      d["sm"] = fmt::format("{}.{}", p.major, p.minor);
      d["multiprocessors"] = cb->sm_count();
    }
    if (cudaDriverGetVersion(&driver) == cudaSuccess) d["cuda_driver_api"] = driver;
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) d["cuda_runtime"] = runtime;
  }
#endif
  return d;
}

// What the backend's scratch arena holds (zeros and an empty summary where the backend does not report it).
struct ScratchFigures {
  size_t reserved = 0;   // device memory held so far (the arena only grows: after a run, that run's peak)
  size_t live_peak = 0;  // the most one forward call held live at once (reserved less the arena's fragmentation)
  std::string at_peak;   // the allocations live at that peak, largest first, as "MB x count" (what to shrink next)
};
ScratchFigures scratch_figures(const Backend& be) {
  ScratchFigures f;
#if defined(FERN_HAVE_CUDA)
  if (const auto* cb = dynamic_cast<const CudaBackend*>(&be)) {
    f.reserved = cb->scratch_reserved();
    f.live_peak = cb->scratch_live_peak();
    std::map<size_t, int, std::greater<>> by_size;
    for (size_t b : cb->scratch_peak_sizes()) ++by_size[b];
    for (const auto& [bytes, n] : by_size)
      if (bytes >= (size_t(1) << 20))
        f.at_peak += fmt::format("{}{:.1f} MB x {}", f.at_peak.empty() ? "" : ", ", bytes / 1e6, n);
  }
#endif
  (void)be;
  return f;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Stat {
  double median, min, max;
};

Stat stat_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// Times `steps` greedy decode steps, `runs` times. On CUDA (unless --host-loop) one step (forward + argmax writing
// the next token into the input slot) is captured as a CUDA graph and replayed back to back: no host round trip
// between steps, which is how a decode loop that streams ids asynchronously runs. Elsewhere (and with --host-loop)
// each step goes through the Engine as a served request does (--temperature etc.): Engine::decode_pick (the token
// picked on the device where the backend can, the step replayed from its record) where the parameters allow, else
// Engine::decode and the host's Sampler.
std::vector<double> time_decode(Engine& engine, SequenceState& st, const Options& o, int32_t first_token,
                                bool* used_graph) {
  std::vector<double> rates;
  *used_graph = false;
#if defined(FERN_HAVE_CUDA)
  if (auto* cb = dynamic_cast<CudaBackend*>(&engine.backend()); cb && !o.host_loop) {
    const int64_t V = engine.config().vocab_size;
    Tensor ids = cb->alloc(DType::I32, {1});
    Tensor logits = cb->alloc(cb->act_dtype(), {1, V});
    int32_t tok = first_token;
    cb->copy(ids, Tensor(&tok, DType::I32, {1}));
    auto step = [&] {
      cb->begin_forward();
      forward(*cb, engine.weights(), st, ids, logits);
      cb->argmax(ids, logits);
    };
    step();  // eager run: sizes the scratch arena
    cb->synchronize();
    cb->capture_step(st, step);
    for (int i = 0; i < o.warmup; ++i) cb->replay(st);
    cb->synchronize();
    for (int r = 0; r < o.runs; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.steps; ++i) cb->replay(st);
      cb->synchronize();
      rates.push_back(o.steps / seconds_since(t0));
    }
    cb->drop_graph();
    *used_graph = true;
    return rates;
  }
#endif
  // As the Generator serves a request: the engine picks the tokens (on the device where the backend can) when the
  // parameters allow, else the host's Sampler picks from the logits of each step.
  std::vector<float> logits;
  int32_t next = first_token;
  Sampler sampler(o.sampling);
  const bool picks = Engine::can_pick(o.sampling);
  if (picks) engine.begin_pick(o.sampling);
  auto one = [&] {
    if (picks) {
      next = engine.decode_pick(st, next, logits);
      return;
    }
    engine.decode(st, next, logits);
    next = sampler.sample(logits);
    sampler.accept(next);
  };
  for (int i = 0; i < o.warmup; ++i) one();
  for (int r = 0; r < o.runs; ++r) {
    engine.backend().synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.steps; ++i) one();
    engine.backend().synchronize();
    rates.push_back(o.steps / seconds_since(t0));
  }
  if (picks) engine.end_pick();
  return rates;
}

// `runs` timed decode runs (tok/s each) from a state freshly filled to context L, sized for them.
std::vector<double> decode_runs(Engine& engine, const Options& o, int64_t L, int runs, int32_t first_token,
                                bool* used_graph) {
  Options r = o;
  r.runs = runs;
  auto st = engine.new_state(L + o.warmup + int64_t(o.steps) * runs + 2);
  fill_state(engine.backend(), *st, L);
  return time_decode(engine, *st, r, first_token, used_graph);
}

int run_bench(const Options& o) {
  auto weights = o.source.load();
  auto backend = make_backend(o.backend, o.threads);
  const std::string backend_name = backend->name();
  const int kv_bytes = backend->device() == Device::Cuda ? 2 : 4;
  EngineOptions eo;
  Engine engine(std::move(backend), weights, eo);
  const ModelConfig& cfg = engine.config();
  std::vector<int64_t> lengths = parse_lengths(o.lengths);
  nlohmann::json results = nlohmann::json::array();
  std::string md;
  // The switches as the process started (--decode-switch sets its own per run; its table names them).
  const auto switches = fern_switches();
  nlohmann::json switch_doc = nlohmann::json::object();
  if (!switches.empty()) {
    md += "switches:";
    for (const auto& [k, v] : switches) {
      md += fmt::format(" {}={}", k, v);
      switch_doc[k] = v;
    }
    md += "\n\n";
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(std::min<int64_t>(cfg.vocab_size, 151000) - 1));
  std::vector<float> logits;

  if ((o.phase == "decode" || o.phase == "both") && !o.decode_switch.empty()) {
    const size_t eq = o.decode_switch.find('=');
    if (eq == std::string::npos || eq == 0) fail("--decode-switch wants NAME=v1,v2,..., got '{}'", o.decode_switch);
    const std::string name = o.decode_switch.substr(0, eq);
    std::vector<std::string> values;
    for (size_t p = eq + 1; p <= o.decode_switch.size();) {
      size_t e = o.decode_switch.find(',', p);
      if (e == std::string::npos) e = o.decode_switch.size();
      values.push_back(o.decode_switch.substr(p, e - p));
      p = e + 1;
    }
    const char* before = std::getenv(name.c_str());
    const std::optional<std::string> saved = before ? std::optional<std::string>(before) : std::nullopt;
    md += fmt::format("| context | {} | tok/s (median of {}) | min-max |\n|---:|---|---:|---:|\n", name, o.runs);
    for (int64_t L : lengths) {
      std::vector<std::vector<double>> rates(values.size());
      for (int r = 0; r < o.runs; ++r) {
        for (size_t i = 0; i < values.size(); ++i) {
          ::setenv(name.c_str(), values[i].c_str(), 1);
          bool graph = false;
          rates[i].push_back(decode_runs(engine, o, L, 1, tok(rng), &graph).at(0));
        }
      }
      for (size_t i = 0; i < values.size(); ++i) {
        const Stat s = stat_of(rates[i]);
        md += fmt::format("| {} | {} | {:.1f} | {:.1f}-{:.1f} |\n", L, values[i], s.median, s.min, s.max);
        results.push_back({{"phase", "decode"}, {"context", L}, {"switch", name + "=" + values[i]},
                           {"tok_s_median", s.median}, {"tok_s_min", s.min}, {"tok_s_max", s.max}, {"runs", o.runs},
                           {"steps", o.steps}});
        log::info("decode ctx {} {}={}: {:.1f} tok/s", L, name, values[i], s.median);
      }
    }
    if (saved) {  // the switch as it was, for the prefill phase of --phase both
      ::setenv(name.c_str(), saved->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  } else if (o.phase == "decode" || o.phase == "both") {
    if (o.host_loop || engine.backend().device() != Device::Cuda)
      md += fmt::format("host loop (Engine::decode{}), tokens sampled with temperature {} top_p {} top_k {} "
                        "min_p {}\n\n", engine.decode_graph() ? ", recorded steps" : "", o.sampling.temperature, o.sampling.top_p,
                        o.sampling.top_k, o.sampling.min_p);
    md += "| context | tok/s (median) | min-max | bytes/token | GB/s | % of H200 roofline |\n|---:|---:|---:|---:|---:|---:|\n";
    for (int64_t L : lengths) {
      bool graph = false;
      const int64_t replayed0 = engine.replayed_steps(), device0 = engine.device_picks(), host0 = engine.host_picks();
      Stat s = stat_of(decode_runs(engine, o, L, o.runs, tok(rng), &graph));
      // Bytes at the mean context of the timed steps.
      DecodeCost cost = decode_cost(*weights, L + o.warmup + int64_t(o.steps) * o.runs / 2, kv_bytes);
      const double gbs = cost.total() * s.median / 1e9;
      const double roof = kCopyBandwidth / cost.total();
      md += fmt::format("| {} | {:.1f} | {:.1f}-{:.1f} | {:.3f} GB | {:.0f} | {:.1f}% |\n", L, s.median, s.min, s.max,
                        cost.total() / 1e9, gbs, 100.0 * s.median / roof);
      if (!graph)
        md += fmt::format("|  | picks: {} on the device, {} on the host | | | | |\n",
                          engine.device_picks() - device0, engine.host_picks() - host0);
      results.push_back({{"phase", "decode"}, {"context", L}, {"tok_s_median", s.median}, {"tok_s_min", s.min},
                         {"tok_s_max", s.max}, {"runs", o.runs}, {"steps", o.steps},
                         {"bytes_per_token", cost.total()}, {"weight_bytes", cost.weight_bytes},
                         {"gb_s", gbs}, {"roofline_tok_s", roof}, {"cuda_graph", graph}});
      if (!graph) {
        results.back()["host_sampling"] = {{"temperature", o.sampling.temperature}, {"top_p", o.sampling.top_p},
                                           {"top_k", o.sampling.top_k}, {"min_p", o.sampling.min_p}};
        results.back()["engine_replayed_steps"] = engine.replayed_steps() > replayed0;  // Engine::decode's records
        results.back()["device_picks"] = engine.device_picks() - device0;
        results.back()["host_picks"] = engine.host_picks() - host0;
      }
      log::info("decode ctx {}: {:.1f} tok/s", L, s.median);
    }
  }
  if (o.phase == "prefill" || o.phase == "both") {
    md += "\n| length | chunk | tok/s (median) | min-max | TFLOP/s | % of H200 bf16 peak | scratch (GB) "
          "| live peak (GB) |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    std::vector<int64_t> chunks;
    for (int64_t c : parse_lengths(o.prefill_chunks, "--prefill-chunk", 0))
      chunks.push_back(c > 0 ? c : engine.backend().prefill_chunk_hint());
    std::sort(chunks.begin(), chunks.end());
    chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
    const std::vector<int64_t> plens =
        o.prefill_lengths.empty() ? lengths : parse_lengths(o.prefill_lengths, "--prefill-lengths");
    std::vector<std::pair<int64_t, int64_t>> runs;  // (chunk, length), chunk-major
    for (int64_t c : chunks)
      for (int64_t L : plens) runs.emplace_back(c, L);
    for (const auto& [chunk, L] : runs) {
      engine.set_prefill_chunk(chunk);
      std::vector<int32_t> prompt(static_cast<size_t>(L));
      for (auto& t : prompt) t = tok(rng);
      auto st = engine.new_state(L + 1);
      std::vector<double> rates;
      for (int r = 0; r < o.runs + 1; ++r) {  // the first run is the warm-up
        engine.backend().reset_state(*st);
        engine.backend().synchronize();
        auto t0 = std::chrono::steady_clock::now();
        engine.prefill(*st, prompt, logits);
        engine.backend().synchronize();
        if (r > 0) rates.push_back(double(L) / seconds_since(t0));
      }
      Stat s = stat_of(rates);
      const double tflops = prefill_flops(cfg, *weights, L) / (double(L) / s.median) / 1e12;
      // Lengths run in increasing order and the arena never shrinks: this is the peak over lengths up to L.
      const ScratchFigures sf = scratch_figures(engine.backend());
      md += fmt::format("| {} | {} | {:.1f} | {:.1f}-{:.1f} | {:.2f} | {:.2f}% | {:.2f} | {:.2f} |\n", L, chunk,
                        s.median, s.min, s.max, tflops, 100.0 * tflops * 1e12 / kTensorFlops, sf.reserved / 1e9,
                        sf.live_peak / 1e9);
      results.push_back({{"phase", "prefill"}, {"length", L}, {"tok_s_median", s.median}, {"tok_s_min", s.min},
                         {"tok_s_max", s.max}, {"runs", o.runs}, {"tflop_s", tflops}, {"scratch_bytes", sf.reserved},
                         {"scratch_live_peak_bytes", sf.live_peak}, {"prefill_chunk", chunk}});
      log::info("prefill {} (chunks of {}): {:.1f} tok/s", L, chunk, s.median);
      if (sf.live_peak > 0) log::info("scratch live at its peak: {}", sf.at_peak);
    }
  }
  nlohmann::json doc = {{"commit", FERN_GIT_COMMIT}, {"backend", backend_name}, {"model", o.source.describe()},
                        {"device", device_info(engine.backend())}, {"switches", switch_doc}, {"results", results}};
  std::printf("%s", md.c_str());
  if (!o.json_path.empty()) std::ofstream(o.json_path) << doc.dump(2) << "\n";
  if (!o.md_path.empty()) std::ofstream(o.md_path) << md;
  return 0;
}

Command reg("bench", "Measure decode and prefill throughput against the roofline", [](CLI::App& app) -> RunFn {
  auto o = std::make_shared<Options>();
  o->source.add_options(app);
  app.add_option("--backend", o->backend, "auto | cpu | cuda");
  app.add_option("--phase", o->phase, "decode | prefill | both")->check(CLI::IsMember({"decode", "prefill", "both"}));
  app.add_option("--lengths", o->lengths, "Comma-separated context lengths (K suffix = 1024)");
  app.add_option("--prefill-lengths", o->prefill_lengths, "Prompt lengths for the prefill phase (default: --lengths)");
  app.add_option("--steps", o->steps, "Timed greedy decode steps per run")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o->warmup, "Untimed decode steps before the runs");
  app.add_option("--runs", o->runs, "Timed runs per length (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--threads", o->threads, "CPU threads (0 = all)");
  app.add_flag("--host-loop", o->host_loop, "Decode through the host (logits copied back each step) even on CUDA");
  app.add_option("--temperature", o->sampling.temperature, "Host loop: sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 2.0));
  app.add_option("--top-p", o->sampling.top_p, "Host loop: top-p")->check(CLI::Range(0.0, 1.0));
  app.add_option("--top-k", o->sampling.top_k, "Host loop: top-k (0 = off)")->check(CLI::NonNegativeNumber);
  app.add_option("--min-p", o->sampling.min_p, "Host loop: min-p")->check(CLI::Range(0.0, 1.0));
  app.add_option("--decode-switch", o->decode_switch,
                 "NAME=v1,v2,...: decode once per value of environment switch NAME in every run (interleaved)");
  app.add_option("--prefill-chunk", o->prefill_chunks,
                 "Prefill chunk sizes to compare, comma-separated (K suffix = 1024; 0 = the backend's choice)");
  app.add_option("--json", o->json_path, "Write results as JSON");
  app.add_option("--md", o->md_path, "Write the markdown table");
  return [o] { return run_bench(*o); };
});

}  // namespace
}  // namespace fern::cli
