// Kernels size their registers by a count known at compile time (rows of a tile, query
// heads at once); WithCount turns a run-time count into one.
#ifndef STRATA_KERNELS_CPU_STATIC_COUNT_H_
#define STRATA_KERNELS_CPU_STATIC_COUNT_H_

#include <type_traits>
#include <utility>

namespace strata::kernels {

// Calls f(std::integral_constant<int, min(count, kMax)>()); count >= 1.
template <int kMax, class F>
inline void WithCount(int count, F&& f) {
  if constexpr (kMax > 1) {
    if (count >= kMax) {
      f(std::integral_constant<int, kMax>());
      return;
    }
    WithCount<kMax - 1>(count, std::forward<F>(f));
  } else {
    f(std::integral_constant<int, 1>());
  }
}

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_STATIC_COUNT_H_
