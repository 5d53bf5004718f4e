#include "server/load_rule.h"

#include <algorithm>
#include <cmath>

namespace strata {

void LoadRule::ObserveLoad(int blocks, double seconds) {
  if (blocks <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const double n = blocks;
  w_ = kDecay * w_ + 1;
  n_ = kDecay * n_ + n;
  nn_ = kDecay * nn_ + n * n;
  t_ = kDecay * t_ + seconds;
  nt_ = kDecay * nt_ + n * seconds;
}

void LoadRule::ObservePrefill(int64_t rows, double seconds) {
  if (rows <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double rate = static_cast<double>(rows) / seconds;
  prefill_rate_ = prefill_rate_ == 0 ? rate : 0.8 * prefill_rate_ + 0.2 * rate;
}

double LoadRule::LoadSeconds(int blocks) const {
  if (w_ == 0) return -1;
  const double spread = w_ * nn_ - n_ * n_;
  double latency = 0, per_block = t_ / n_;
  // Batches of different sizes: the line through them; otherwise all of it is per block.
  if (spread > 1e-9 * w_ * nn_) {
    per_block = (w_ * nt_ - n_ * t_) / spread;
    latency = (t_ - per_block * n_) / w_;
    if (per_block < 0 || latency < 0) {
      per_block = t_ / n_;
      latency = 0;
    }
  }
  return latency + per_block * blocks;
}

double LoadRule::RecomputeSeconds(int64_t tokens) const {
  if (prefill_rate_ <= 0) return -1;
  return static_cast<double>(tokens) / prefill_rate_;
}

bool LoadRule::Load(int blocks, int block_tokens) const {
  const double load = LoadSeconds(blocks);
  const double recompute = RecomputeSeconds(static_cast<int64_t>(blocks) * block_tokens);
  if (load < 0 || recompute < 0) return true;
  return load <= recompute;
}

}  // namespace strata
