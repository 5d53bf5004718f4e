"""Detects the CUDA toolkit and exposes it as an external repository.

When nvcc is found (at $CUDA_PATH, else /usr/local/cuda), @local_cuda provides the
headers, cudart and cuBLAS, and its defs.bzl says HAS_CUDA = True. Otherwise the
repository holds empty targets and HAS_CUDA = False, so that the rest of strata still
builds and tests on a machine with no toolkit.
"""

_BUILD_WITH_CUDA = """
package(default_visibility = ["//visibility:public"])

# Some CCCL headers have no extension, so the glob takes everything under include/.
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcublas", "-lcublasLt"],
    deps = [":cudart"],
)
"""

_BUILD_WITHOUT_CUDA = """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda_headers")

cc_library(name = "cudart")

cc_library(name = "cublas")
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    has_cuda = nvcc.exists and ctx.os.environ.get("STRATA_DISABLE_CUDA", "") != "1"
    if has_cuda:
        ctx.symlink(root + "/include", "include")
        ctx.file("BUILD", _BUILD_WITH_CUDA.format(root = root))
    else:
        ctx.file("BUILD", _BUILD_WITHOUT_CUDA)
    ctx.file("defs.bzl", "HAS_CUDA = {}\nNVCC = \"{}\"\n".format(has_cuda, str(nvcc)))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "STRATA_DISABLE_CUDA"],
    local = True,
)
