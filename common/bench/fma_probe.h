// The compute probe that benchmarks measure compute-bound work against: f32 multiply-adds
// per second on all threads of the OpenMP team, from registers only (no loads), with
// enough independent chains to keep every FMA pipe busy. A kernel's FLOP/s over this is
// its share of the machine's arithmetic, as a bandwidth over ReadProbe is its share of the
// memory's.
#ifndef STRATA_COMMON_BENCH_FMA_PROBE_H_
#define STRATA_COMMON_BENCH_FMA_PROBE_H_

namespace strata {

// FLOP/s (an FMA counts as 2) with vectors of `vector_bits`: 512 (AVX-512F) or 256 (AVX2
// with FMA). A width the CPU lacks must not be asked for.
double MeasureFmaPeak(int vector_bits);

}  // namespace strata

#endif  // STRATA_COMMON_BENCH_FMA_PROBE_H_
