// An exponentially weighted moving average of timings and rates the scheduler learns from:
// the newest sample weighs kWeight, and the first sample is the average.
#ifndef STRATA_SERVER_MOVING_AVERAGE_H_
#define STRATA_SERVER_MOVING_AVERAGE_H_

namespace strata {

class MovingAverage {
 public:
  static constexpr double kWeight = 0.2;

  void Observe(double sample) {
    value_ = seen_ ? (1.0 - kWeight) * value_ + kWeight * sample : sample;
    seen_ = true;
  }
  double value() const { return value_; }  // 0 before the first sample

 private:
  double value_ = 0.0;
  bool seen_ = false;
};

}  // namespace strata

#endif  // STRATA_SERVER_MOVING_AVERAGE_H_
