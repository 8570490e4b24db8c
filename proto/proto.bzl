"""Generates C++ protobuf + gRPC code with the system protoc and grpc_cpp_plugin."""

load("@rules_cc//cc:defs.bzl", "cc_library")

def muster_grpc_library(name, srcs, deps = [], visibility = None):
    """cc_library `name` with the messages and services of `srcs` (.proto files).

    deps: other muster_grpc_library targets whose .proto files `srcs` import.
    """
    bases = [s[:-len(".proto")] for s in srcs]
    outs = []
    for b in bases:
        outs += [b + ".pb.h", b + ".pb.cc", b + ".grpc.pb.h", b + ".grpc.pb.cc"]
    dep_protos = [d + "_protos" for d in deps]
    native.filegroup(name = name + "_protos", srcs = srcs + dep_protos)
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_protos,
        outs = outs,
        cmd = ("protoc --proto_path=. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) " +
               " ".join(["$(location %s)" % s for s in srcs])),
    )
    cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["//third_party:grpc", "//third_party:protobuf"],
        visibility = visibility,
    )
