"""cuda_library: compiles .cu sources with nvcc where CUDA exists.

With CUDA, each .cu file becomes a position-independent object made by nvcc in a genrule,
and the library defines STRATA_HAS_CUDA=1. Without CUDA, the library is built from
`fallback_srcs` instead (launchers that report that CUDA is unavailable), and defines
STRATA_HAS_CUDA=0. Either way dependents build and link.
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "NVCC")

# sm_80 SASS also runs on sm_86/sm_89 (consumer Ampere/Ada); sm_90 for Hopper, plus PTX
# for newer parts.
_GENCODE = " ".join([
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=[sm_90,compute_90]",
])

def cuda_library(name, srcs, hdrs, fallback_srcs = [], deps = [], **kwargs):
    if not HAS_CUDA:
        native.cc_library(
            name = name,
            srcs = fallback_srcs,
            hdrs = hdrs,
            defines = ["STRATA_HAS_CUDA=0"],
            deps = deps,
            **kwargs
        )
        return
    objs = []
    for src in srcs:
        obj = src.replace(".cu", ".pic.o")
        native.genrule(
            name = name + "_" + src.replace(".cu", "").replace("/", "_") + "_nvcc",
            srcs = [src] + hdrs + native.glob(["**/*.cuh"]),
            outs = [obj],
            cmd = ("{nvcc} -std=c++20 -O3 -I. -Xcompiler -fPIC --expt-relaxed-constexpr " +
                   "{gencode} -c $(location {src}) -o $@").format(
                nvcc = NVCC,
                gencode = _GENCODE,
                src = src,
            ),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        defines = ["STRATA_HAS_CUDA=1"],
        deps = deps + ["@local_cuda//:cudart"],
        **kwargs
    )
