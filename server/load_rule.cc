#include "server/load_rule.h"

#include <cmath>

namespace strata {

void LoadRule::ObserveLoad(int blocks, double seconds, absl::Time now) {
  if (blocks <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  last_observed_ = now;
  late_ = false;
  const double n = blocks;
  w_ = kDecay * w_ + 1;
  n_ = kDecay * n_ + n;
  nn_ = kDecay * nn_ + n * n;
  t_ = kDecay * t_ + seconds;
  nt_ = kDecay * nt_ + n * seconds;
}

void PrefillRate::Observe(int64_t rows, double seconds) {
  if (rows <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  rate_.Observe(static_cast<double>(rows) / seconds);
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

double PreloadLead(double latency_s, double body_s, double compute_s, int layers) {
  layers = layers < 1 ? 1 : layers;
  const double load_layer = body_s > 0 ? body_s / layers : 0;
  const double compute_layer = compute_s > 0 ? compute_s / layers : 0;
  const double behind = load_layer > compute_layer ? load_layer - compute_layer : 0;
  return (latency_s > 0 ? latency_s : 0) + load_layer + (layers - 1) * behind;
}

void LoadRule::ObserveLate(absl::Time now) {
  last_observed_ = now;
  late_ = true;
}

bool LoadRule::Load(int blocks, int block_tokens, const PrefillRate& prefill, absl::Time now) {
  if (last_observed_ != absl::InfinitePast() && now - last_observed_ >= kRemeasureAfter) {
    last_observed_ = now;  // this batch measures it; the next look waits for its outcome
    return true;
  }
  if (late_) return false;
  const double load = LoadSeconds(blocks);
  if (load < 0 || prefill.rows_per_second() <= 0) return true;
  return load <= static_cast<double>(blocks) * block_tokens / prefill.rows_per_second();
}

}  // namespace strata
