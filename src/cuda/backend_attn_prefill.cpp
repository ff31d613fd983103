// Gated attention core for a chunk of T > 1 prompt rows (prefill) over the chunk and the KV cache of earlier
// chunks: attn_prep (norms, RoPE, KV append), then a tensor-core kernel from kAttnPrefillMinRows rows on (the decode
// kernel below that, or when FERN_ATTN_PREFILL=decode): from kAttnCopiesMinRows rows on, FP16 copies of the cache
// rows made once per layer and chunk and the warpgroup-MMA kernel (attn_prefill_wg.cu, sm_90a on compute capability
// 9.0) or, where that is not available, the flash kernel on the copies; below, the flash kernel converting in shared
// memory (attn_prefill.cu). Shapes are checked by attn_core.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "cuda/attn_prefill.h"
#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;

namespace {

// From this many rows the flash kernel is used: on the H200 it already beat the decode kernel at T = 2 (0.034 vs
// 0.087 ms at position 4K, 0.058 vs 0.160 ms at 32K; docs/notes/cuda-prefill-v2-attn.md), so every T > 1.
constexpr int kAttnPrefillMinRows = 2;

// From this many rows the cache rows are copied to FP16 once per layer and chunk (the keys as rows, the values as
// rows or, for the warpgroup kernel, transposed) instead of being converted in every block. Measured on the H200
// (bench_cuda_attn_prefill, twelfth session; docs/notes/cuda-prefill-v10-kv16.md, -v11-attn-wg.md): at T = 256 the
// warpgroup kernel with its copies beat the flash kernel at every position (0.094 vs 0.111 ms at 4K, 0.439 vs 0.669
// at 32K), at T = 64 it lost at 4K (0.053 vs 0.049) and won at 32K; below 64 rows the copies (0.04 ms at 32K) cost
// more than they save. The flash kernel on the copies gives the bits of the flash kernel alone, 15% faster at 2,048
// rows over 30K cached ones. 128: between the last loss and the first clean win.
constexpr int kAttnCopiesMinRows = 128;

// FERN_ATTN_PREFILL forces one form for every T > 1 (tests and benchmarks compare them): flash (converting in shared
// memory), flash-bf16 (its previous BF16 operands; attn_prefill.cu says why FP16 is the default), flash-kv16 (on the
// FP16 copies), wg (the warpgroup kernel where it takes the shape and the device, else flash-kv16) or decode.
enum class Choice { Auto, Flash, FlashBf16, FlashKv16, Wg, Decode };
Choice forced_choice() {
  return static_cast<Choice>(
      env_choice("FERN_ATTN_PREFILL", {"auto", "flash", "flash-bf16", "flash-kv16", "wg", "decode"}, 0));
}

bool decode_kernel_ok(const cuda::AttnShape& sh) {
  const int G = sh.Hkv > 0 ? sh.Hq / sh.Hkv : 0;
  return sh.Hkv > 0 && sh.Hq % sh.Hkv == 0 && (sh.D == 128 || sh.D == 256) && (G == 1 || G == 2 || G == 4 || G == 8);
}

}  // namespace

void CudaBackend::attn_prefill_(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                                SequenceState& state, int layer) {
  CudaState& st = cuda_state(state);
  const int T = static_cast<int>(qg.dim(0));
  const cuda::AttnShape sh = attn_shape(cfg, st.capacity);
  Choice choice = forced_choice();
  bool flash = cuda::attn_prefill_ok(sh) && (T >= kAttnPrefillMinRows || !decode_kernel_ok(sh));
  if (choice == Choice::Auto)
    choice = T >= kAttnCopiesMinRows ? Choice::Wg : Choice::Flash;
  else
    flash = choice != Choice::Decode;
  Tensor q = scratch(DType::F32, {T, sh.Hq, sh.D});
  Tensor kc = st.k_cache.at(layer), vc = st.v_cache.at(layer);
  cuda::attn_prep(ctx(), sh, st.d_pos, f32(qg, "attn qg"), f32(k, "attn k"), f32(v, "attn v"), f32(w.q_norm, "q_norm"),
                  f32(w.k_norm, "k_norm"), q.ptr<float>(), kc.ptr<uint16_t>(), vc.ptr<uint16_t>(), T);
  if (flash) {
    // Split over the KV length only when the query tiles leave multiprocessors idle (small T, long cache); the
    // partials are bounded to 64 MiB.
    int nsplit = cuda::attn_prefill_splits(sh, st.pos, T, sm_count());
    const int64_t per_split = int64_t(T) * sh.Hq * (sh.D + 2) * 4;
    nsplit = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(nsplit, (int64_t(64) << 20) / per_split), 1,
                                                  cuda::kAttnPrefillMaxSplits));
    float* pml = nullptr;
    float* pacc = nullptr;
    if (nsplit > 1) {
      pml = scratch(DType::F32, {T, sh.Hq, nsplit, 2}).ptr<float>();
      pacc = scratch(DType::F32, {T, sh.Hq, nsplit, sh.D}).ptr<float>();
    }
    const uint16_t* kp = kc.ptr<uint16_t>();
    const uint16_t* vp = vc.ptr<uint16_t>();
    const bool want_wg = choice == Choice::Wg;
    const bool wg = want_wg && cuda::attn_prefill_wg_ok(sh);
    const bool kv16 = choice == Choice::FlashKv16 || (want_wg && !wg);
    // The rows this chunk reads, [0, pos + T), as FP16 copies (scratch: 4 bytes per cached row element, K and V): the
    // keys as rows; the values as rows (flash-kv16) or transposed, a row of keys per dim in whole 64-key tiles (wg).
    const int64_t rows = st.pos + T, ld = (rows + 63) / 64 * 64;
    if (wg || kv16) {
      Tensor k16 = scratch(DType::F16, {rows, sh.Hkv, sh.D});
      Tensor v16 = wg ? scratch(DType::F16, {sh.Hkv, sh.D, ld}) : scratch(DType::F16, {rows, sh.Hkv, sh.D});
      cuda::kv_to_f16(ctx(), sh, st.d_pos, kp, vp, k16.ptr<uint16_t>(), wg ? nullptr : v16.ptr<uint16_t>(), T, rows);
      if (wg) cuda::v_to_f16_t(ctx(), sh, st.d_pos, vp, v16.ptr<uint16_t>(), T, ld);
      kp = k16.ptr<uint16_t>();
      vp = v16.ptr<uint16_t>();
    }
    if (wg)
      cuda::attn_prefill_wg(ctx(), sh, st.d_pos, q.ptr<float>(), qg.ptr<float>(), kp, vp, ld, pml, pacc,
                            f32(o, "attn o"), T, nsplit);
    else
      cuda::attn_prefill(ctx(), sh, st.d_pos, q.ptr<float>(), qg.ptr<float>(), kp, vp, pml, pacc, f32(o, "attn o"),
                         T, nsplit, choice != Choice::FlashBf16, kv16);
    return;
  }
  // The decode kernel over T query rows: they already give T-fold parallelism, so the split count is capped to keep
  // the partial results within 256 MiB of scratch.
  const int64_t per_split = int64_t(T) * sh.Hq * sh.D * 4;
  const int nsplit = static_cast<int>(std::clamp<int64_t>((int64_t(256) << 20) / per_split, 1, st.nsplit));
  Tensor pml = scratch(DType::F32, {T, sh.Hq, nsplit, 2});
  Tensor pacc = scratch(DType::F32, {T, sh.Hq, nsplit, sh.D});
  cuda::attn_decode(ctx(), sh, st.d_pos, q.ptr<float>(), qg.ptr<float>(), kc.ptr<uint16_t>(), vc.ptr<uint16_t>(),
                    pml.ptr<float>(), pacc.ptr<float>(), f32(o, "attn o"), T, nsplit);
}

}  // namespace fern
