"""Shared build settings for actpack: compiler flags, test/benchmark macros, CUDA via nvcc."""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")

# -ffp-contract=off: the CPU reference must round exactly like the CUDA kernels (built with
# --fmad=false), so that both write byte-identical buffers.
# -O1 under the sanitizers (ASan's advice, and half the compile time of -O3 with
# UBSan: runtime/session.cc 46 s -> 24 s); rules' copts come after --copt, so the level is set
# here, not in .bazelrc.
ACTPACK_COPTS = [
    "-std=c++20",
] + select({
    "//third_party:asan_enabled": ["-O1"],
    "//conditions:default": ["-O3"],
}) + [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
]

CUDA_DEFINES = select({
    "//third_party:cuda_enabled": ["ACTPACK_WITH_CUDA=1"],
    "//conditions:default": [],
})

# The architectures of the compile check (and of tools/ptxas_check.py's table): machine code for
# Turing (sm_75: T4), Ampere (sm_80: A100; sm_86: A10, A40, RTX 30xx, whose smaller per-SM
# limits ptxas allocates for apart) and Hopper (sm_90), and PTX that newer GPUs compile. Ada
# (sm_89) runs sm_86's machine code and the kernels use nothing it adds; one more target costs
# CI half a minute on two cores. The wheel's architectures are setup.py's (cuda_arch_flags).
NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "--fmad=false",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-ffp-contract=off",
    "-DACTPACK_WITH_CUDA=1",
    "-gencode=arch=compute_75,code=sm_75",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_86,code=sm_86",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
])

def actpack_cc_library(name, copts = [], defines = [], **kwargs):
    cc_library(
        name = name,
        copts = ACTPACK_COPTS + copts,
        local_defines = CUDA_DEFINES + defines,
        **kwargs
    )

def actpack_cc_test(name, deps = [], size = "small", copts = [], **kwargs):
    # A test's own code at -O1: the work it checks is the libraries' (at -O3); its TU compiles
    # in 0.7 of the time, and every build of CI's compiles the tests again.
    cc_test(
        name = name,
        size = size,
        copts = ACTPACK_COPTS + ["-O1"] + copts,
        local_defines = CUDA_DEFINES,
        deps = deps + ["@system//:gtest_main"],
        **kwargs
    )

def actpack_cc_benchmark(name, deps = [], copts = [], tags = [], benchmark_main = True, **kwargs):
    """A benchmark binary; on Google Benchmark's main unless it has its own (benchmark_main)."""
    cc_binary(
        name = name,
        copts = ACTPACK_COPTS + copts,
        local_defines = CUDA_DEFINES,
        tags = tags + ["benchmark"],
        deps = deps + (["@system//:benchmark_main"] if benchmark_main else []),
        **kwargs
    )

def actpack_cuda_library(name, srcs, hdrs = [], deps = [], **kwargs):
    """The CUDA kernels of `srcs`: nvcc objects under --config=cuda, the same sources compiled
    as host C++ for the emulator under --config=cudaemu, an empty library otherwise.

    The nvcc objects are position independent so they link into tests and the Python extension.
    Under the emulator each .cu is copied to a .cc that starts with a #line directive, so that
    diagnostics, __FILE__ and coverage name the .cu file; `__CUDA_ARCH__` is defined, so shared
    headers take their device branches, as nvcc's device pass does.
    """
    native.cc_library(
        name = name + "_headers",
        hdrs = hdrs,
        deps = deps,
        visibility = ["//visibility:private"],
    )
    objects = []
    emulated = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        ptxas_log = obj.replace(".o", ".ptxas.log")
        native.genrule(
            name = obj + "_nvcc",
            # nvcc sees the package's headers (deduplicated: hdrs are among them).
            srcs = depset([src] + hdrs + native.glob(["**/*.h", "**/*.cuh"]) +
                          ["//common:cuda_check.h"]).to_list(),
            outs = [obj, ptxas_log],
            # ptxas's resource report (-v) is kept beside the object for tools/ptxas_check.py,
            # so the compile check's nvcc pass is the only one; nvcc's other output is shown.
            cmd = ("/usr/local/cuda/bin/nvcc %s -Xptxas=-v -I. -I$(GENDIR) -c $(location %s) " +
                   "-o $(location %s) 2> $(location %s) || { cat $(location %s) >&2; exit 1; }; " +
                   "grep -vE '^(ptxas info|    [0-9]+ bytes stack frame)' $(location %s) >&2 || true") %
                  (NVCC_FLAGS, src, obj, ptxas_log, ptxas_log, ptxas_log),
            tags = ["cuda", "manual"],  # built only through the select() below
        )
        objects.append(obj)
        copy = name + "_emulated/" + src + ".cc"
        native.genrule(
            name = name + "_emulated_" + src.replace("/", "_"),
            srcs = [src],
            outs = [copy],
            cmd = "(echo '#line 1 \"%s/%s\"'; cat $<) > $@" % (native.package_name(), src),
            tags = ["manual"],
        )
        emulated.append(copy)
    native.cc_library(
        name = name + "_emulated",
        srcs = emulated,
        # The race checker's build also counts coverage (gcov): one instrumented build serves
        # both, tools/cudaemu_coverage.py reads the counts. The counters are updated atomically,
        # which the race checker knows is no race (plain increments from every CUDA thread of a
        # kernel would be reported as races on statics).
        copts = ACTPACK_COPTS + select({
            "//third_party:cudaemu_race": ["-fsanitize=thread", "--coverage", "-fprofile-update=atomic"],
            "//conditions:default": [],
        }),
        linkopts = select({
            "//third_party:cudaemu_race": ["--coverage"],
            "//conditions:default": [],
        }),
        local_defines = ["ACTPACK_WITH_CUDA=1", "__CUDA_ARCH__=900"],
        deps = [":" + name + "_headers", "//testing/cudaemu:cudart"],
        tags = ["manual"],
        visibility = ["//visibility:private"],
    )
    cc_library(
        name = name,
        srcs = select({
            "//third_party:cudaemu_enabled": [],
            "//third_party:cuda_enabled": objects,
            "//conditions:default": [],
        }),
        deps = [":" + name + "_headers"] + select({
            "//third_party:cudaemu_enabled": [":" + name + "_emulated"],
            "//third_party:cuda_enabled": ["//third_party:cudart"],
            "//conditions:default": [],
        }),
        **kwargs
    )
