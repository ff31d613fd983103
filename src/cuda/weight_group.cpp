#include "cuda/weight_group.h"

namespace fern::cuda {
namespace {
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

// (Shapes only: the random device model lays out weights that have no memory yet, so sizes, not pointers, decide.)
GroupLayout group_layout(std::span<const LinearWeight* const> ws) {
  GroupLayout L;
  if (ws.empty()) return L;
  const LinearWeight& w0 = *ws[0];
  for (const LinearWeight* w : ws)
    if (!w->quantized() || w->experts != 0 || w->bits != w0.bits || w->in != w0.in ||
        w->group_size != w0.group_size || w->scales.numel() == 0 || w->biases.numel() == 0)
      return L;
  L.at.resize(ws.size());
  size_t off = 0;
  // One array (codes, scales or biases) of every matrix after the other, the array on a 256-byte boundary.
  auto lay_out = [&](size_t GroupPiece::*piece, Tensor LinearWeight::*part) {
    off = round_up(off, 256);
    for (size_t i = 0; i < ws.size(); ++i) {
      L.at[i].*piece = off;
      off += round_up((ws[i]->*part).nbytes(), 16);
    }
  };
  lay_out(&GroupPiece::w, &LinearWeight::w);
  lay_out(&GroupPiece::s, &LinearWeight::scales);
  lay_out(&GroupPiece::b, &LinearWeight::biases);
  L.bytes = off;
  return L;
}

std::vector<LinearWeight> group_views(std::span<const LinearWeight* const> ws, const GroupLayout& layout, char* base) {
  std::vector<LinearWeight> r;
  for (size_t i = 0; i < ws.size(); ++i) {
    LinearWeight d = *ws[i];
    d.expert_stride = 0;
    d.w.data = base + layout.at[i].w;
    d.scales.data = base + layout.at[i].s;
    d.biases.data = base + layout.at[i].b;
    d.w.device = d.scales.device = d.biases.device = Device::Cuda;
    r.push_back(d);
  }
  return r;
}

}  // namespace fern::cuda
