// `fern quantize IN OUT`: HF bf16 checkpoint -> MLX-layout affine checkpoint (quant/quantize_checkpoint.h).
#include "cli/command.h"
#include "core/error.h"
#include "model/progress_bar.h"
#include "quant/quantize_checkpoint.h"

namespace {

struct QuantizeArgs {
  std::string in, out;
  int bits = 4, group_size = 64;
  double shard_gb = 5.0;
};

fern::cli::Command reg("quantize", "Convert an HF bf16 checkpoint to the MLX 4-bit layout", [](CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  app.add_option("IN", a->in, "HF checkpoint directory")->required();
  app.add_option("OUT", a->out, "output directory")->required();
  app.add_option("--bits", a->bits, "4 or 8 (router and shared-expert gate always 8)")->capture_default_str();
  app.add_option("--group-size", a->group_size, "32, 64 or 128")->capture_default_str();
  app.add_option("--shard-gb", a->shard_gb, "maximum shard size in GB")->capture_default_str();
  return [a]() -> int {
    fern::QuantizeOptions opt;
    opt.bits = a->bits;
    opt.group_size = a->group_size;
    if (!(a->shard_gb > 0.001 && a->shard_gb < 1e4)) fern::fail("--shard-gb must be in (0.001, 10000)");
    opt.max_shard_bytes = static_cast<uint64_t>(a->shard_gb * 1e9);
    fern::ProgressBar bar("quantize " + a->out);
    opt.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
    fern::quantize_checkpoint(a->in, a->out, opt);
    return 0;
  };
});

}  // namespace
