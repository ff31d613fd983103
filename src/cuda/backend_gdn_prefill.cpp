// Gated DeltaNet core for a chunk of T > 1 prompt rows (prefill). Shapes are checked by gdn_core.
// Supported head shapes (all real ones) run the multi-row kernels: the conv/norm pre-pass, the delta rule as the
// register-resident scan (gdn_prefill.cu) or in the chunked WY form on the tensor cores (gdn_chunked.cu), the gated
// norm. Any other shape keeps the one-token kernel, launched once per row, then the gated norm over all rows.
//   FERN_GDN_PREFILL unset or "auto": the faster form for T (kChunkedMinRows below);
//                    "scan" / "chunked": that form for every T > 1 (chunked where gdn_chunked_ok, else the scan);
//                    "rows": the one-token kernel per row (to bisect whole-model differences).
#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "cuda/backend_internal.h"
#include "cuda/gdn_prefill.h"

namespace fern {
using namespace cuda_backend_detail;

namespace {

// From this many rows the chunked form is used. Measured on the H200 (docs/notes/cuda-prefill-v4-gdn.md, one layer
// at the real shape, whole GDN core, median of 7): scan / chunked 0.035 / 0.052 ms at T = 64, 0.054 / 0.064 at 128,
// 0.094 / 0.100 at 256, 0.183 / 0.156 at 512, 0.707 / 0.564 at 2048, 10.85 / 8.36 at 32K. The chunked form has a
// larger fixed cost (two launches, a 64-row chunk of work per block even for a few rows) and a smaller cost per row
// (0.22 against 0.35 us between 256 and 512 rows); the two lines cross near 300 rows, so from 320 (five chunks) on.
constexpr int kChunkedMinRows = 320;

enum class Choice { Auto, Scan, Chunked, Rows };
Choice forced_choice() {
  return static_cast<Choice>(env_choice("FERN_GDN_PREFILL", {"auto", "scan", "chunked", "rows"}, 0));
}

}  // namespace

void CudaBackend::gdn_prefill_(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                               const ModelConfig& cfg, SequenceState& state, int layer, bool norm) {
  CudaState& st = cuda_state(state);
  const int T = static_cast<int>(mixed.dim(0));
  const cuda::GdnShape sh = gdn_shape(cfg);
  float* conv = f32(st.conv_state.at(layer), "conv state");
  float* rec = f32(st.recurrent_state.at(layer), "recurrent state");
  const Choice choice = forced_choice();
  if (cuda::gdn_prefill_ok(sh) && choice != Choice::Rows) {
    const bool chunked = cuda::gdn_chunked_ok(sh) &&
                         (choice == Choice::Chunked || (choice == Choice::Auto && T >= kChunkedMinRows));
    const cuda::GdnForm form = chunked ? cuda::GdnForm::Chunked : cuda::GdnForm::Scan;
    Tensor xc = scratch(DType::F32, {cuda::gdn_prefill_scratch_floats(sh, T, form)});
    cuda::gdn_prefill(ctx(0), sh, T, f32(mixed, "gdn mixed"), f32(z, "gdn z"), f32(b, "gdn b"), f32(a, "gdn a"),
                      f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"),
                      norm ? f32(w.norm_w, "norm_w") : nullptr, conv, rec, f32(y, "gdn y"), f32(xc, "gdn scratch"),
                      form);
  } else {
    const bool early = last_gdn_state_ != rec;
    // Rows are sequential through the state: one decode-step launch per row, then the gated norm of all rows.
    for (int t = 0; t < T; ++t)
      cuda::gdn_step_raw(ctx(0), sh, t, f32(mixed, "gdn mixed"), f32(b, "gdn b"), f32(a, "gdn a"),
                         f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"), conv, rec,
                         f32(y, "gdn y"), early);
    if (norm) cuda::gdn_gated_norm(ctx(0), sh, T, f32(z, "gdn z"), f32(w.norm_w, "norm_w"), f32(y, "gdn y"));
  }
  last_gdn_state_ = rec;
}

}  // namespace fern
