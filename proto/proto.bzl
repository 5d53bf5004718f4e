"""grpc_cc_library: C++ messages and gRPC stubs from one .proto, with Debian's protoc and
grpc_cpp_plugin (absolute paths: genrules inherit PATH, and a changed PATH would invalidate
the cache)."""

def grpc_cc_library(name, src, deps = [], **kwargs):
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc", base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = ("/usr/bin/protoc -I. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(location {})").format(src),
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        deps = deps + ["//third_party:grpc"],
        **kwargs
    )

def proto_cc_library(name, src, deps = [], **kwargs):
    """C++ messages (no services) from one .proto."""
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) $(location {})".format(src),
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        deps = deps + ["//third_party:protobuf"],
        **kwargs
    )
