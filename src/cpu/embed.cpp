// Embedding row gather (dequantizing one row per token) and greedy argmax.
#include "cpu/cpu_ops.h"

namespace fern::cpu {

void embed(float* out, const int32_t* ids, int64_t T, const LinearWeight& table, int nt) {
  validate_linear(table);
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= table.out)
      fail("token id {} at position {} is outside the vocabulary of {} rows ({})", ids[t], t, table.out, table.name);
#pragma omp parallel for num_threads(nt) schedule(static) if (T > 8)
  for (int64_t t = 0; t < T; ++t) dequant_row(table, ids[t], out + t * table.in);
}

void argmax(int32_t* ids, const float* logits, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    const float* r = logits + t * V;
    int64_t best = -1;
    for (int64_t j = 0; j < V; ++j)
      if (r[j] == r[j] && (best < 0 || r[j] > r[best])) best = j;  // r[j] == r[j] skips NaN
    ids[t] = static_cast<int32_t>(best < 0 ? 0 : best);
  }
}

}  // namespace fern::cpu
