// The next token picked on the device (Backend::pick, ops/token_pick.h): the host Sampler's rule for a uniform draw
// (engine/sampler.h, Sampler::sample_at) without copying the logits to the host. Three launches per step
// (docs/notes/sampler-v2-device-pick.md):
//   1. per block of kPickChunk logits: the logit-bias entries added, the penalties applied (the token fed to this
//      step counted first), the temperature applied (the values kept for 2 and 3), the block's best key, and for
//      top-k / top-p its best kPickMaxTopK keys sorted;
//   2. per block, for temperature sampling over the whole vocabulary (min-p included) or top-p alone: the sum of
//      the block's weights exp(v - max);
//   3. one block: the draw. Over the whole vocabulary: the block whose cumulative weight passes u * total, then the
//      token inside it. With top-k / top-p: the candidates sorted, the exact prefix of the global order they give
//      (top-k: all k; top-p: the keys above every block's last kept key), the top-p and min-p cuts, the draw.
// A key is (order_key(value) << 32) | ~index: larger value first, then the lower index, as the host breaks ties.
#pragma once
#include <cstdint>

#include "cuda/kernels.h"
#include "ops/token_pick.h"

namespace fern::cuda {

inline constexpr int kPickChunk = 2048;      // logits per block of launches 1 and 2
inline constexpr int kPickSortSlots = 8192;  // candidates launch 3 sorts (1024 threads x 8)

// Device-resident parameters, written by the host between requests and read by the kernels at every replay.
struct PickDevice {
  int enabled = 0;         // 0: the launches return at once
  int top_k = 0;           // 0 = off; < V
  float temperature = 0;   // 0 = greedy
  float inv_t = 1;         // 1 / temperature, as the host Sampler computes it
  float top_p = 1;
  float min_p = 0;
  float log_min_p = 0;     // std::log(min_p) as the host computes it
  int penalties = 0;       // any of the three below in use: launch 1 counts the fed token and applies them
  float presence = 0, frequency = 0, repetition = 1;
  int n_bias = 0;
  uint64_t seed = 0;
  uint64_t draw = 0;       // the draw of the next pick; launch 3 advances it
};

struct PickResult {
  int32_t token;
  int32_t status;  // 0: picked (written into ids[0] too), 1: NaN logits, 2: the nucleus passes the candidates
};

struct PickBuffers {
  PickDevice* params = nullptr;
  const int32_t* bias_tok = nullptr;  // [kPickMaxBias]
  const float* bias_val = nullptr;
  int32_t* counts = nullptr;          // [V] times each token was fed (frequency / presence penalties)
  uint8_t* seen = nullptr;            // [V] prompt or fed (repetition penalty)
  float* v = nullptr;                 // [V] biased, penalised, scaled logits
  uint64_t* cand = nullptr;           // [pick_blocks(V) * kPickMaxTopK] each block's best keys, descending
  double* bsum = nullptr;             // [pick_blocks(V)]
  int* flags = nullptr;               // [1] NaN seen; zero between steps
  PickResult* result = nullptr;
};

inline int pick_blocks(int64_t V) { return static_cast<int>((V + kPickChunk - 1) / kPickChunk); }
// The device form serves vocabularies whose candidate lists fit one sort (262,144 tokens).
inline bool pick_supported(int64_t V) { return V > 0 && int64_t(pick_blocks(V)) * kPickMaxTopK <= kPickSortSlots; }

// Enqueues the three launches for logits [V]; ids[0] holds the token the step was fed (counted for the penalties)
// and receives the pick; the pick and its status also go to b.result.
void pick(const Ctx& c, const float* logits, int64_t V, const PickBuffers& b, int32_t* ids);

}  // namespace fern::cuda
