"""pip install --no-build-isolation .  — builds actpack._C against the installed torch.
python -m build --no-isolation         — the sdist and a wheel (for that torch).

CPU-only against a CPU torch; with the CUDA kernels (codecs/cuda/*.cu) against a CUDA torch.
The sources are the same ones Bazel builds. Abseil and Highway come from Debian's libabsl-dev
and libhwy-dev: the shared libraries named in third_party/system/BUILD.system (one list for both
builds), found at run time through an rpath; nlohmann-json3-dev and libcli11-dev are headers.
ACTPACK_ABSL_PREFIX points at another install of them all (the GPU script unpacks the .debs
there). Debian's static archives cannot go into a shared object (their thread-locals are not
position independent).
"""
import glob
import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources(*patterns):
    found = []
    for pattern in patterns:
        found += glob.glob(os.path.join(ROOT, pattern))
    # budget.cc is the C++ programs' guard (Bazel's //torch_plugin); Python has actpack.budget.
    excluded = ("_test.cc", "_benchmark.cc", "_fuzz.cc", "torch_plugin/csrc/budget.cc")
    return sorted(os.path.relpath(f, ROOT) for f in found if not f.endswith(excluded))


def system_link_args(prefix):
    """-L, rpath and the -labsl_* and -lhwy flags of Bazel's @system//:absl and :hwy targets."""
    with open(os.path.join(ROOT, "third_party", "system", "BUILD.system")) as f:
        libraries = re.findall(r'"(-l(?:absl_\w+|hwy))"', f.read())
    for libdir in (os.path.join(prefix, "lib", "x86_64-linux-gnu"), os.path.join(prefix, "lib")):
        if glob.glob(os.path.join(libdir, "libabsl_status.so*")):
            # An RPATH rather than a RUNPATH (--disable-new-dtags): the loader also searches it
            # for the Abseil libraries' own dependencies, which a RUNPATH does not cover.
            return [f"-L{libdir}", "-Wl,--disable-new-dtags", f"-Wl,-rpath,{libdir}", *libraries]
    raise SystemExit(
        f"actpack: no Abseil libraries (libabsl_status.so) under {prefix}; install libabsl-dev "
        "(apt-get install libabsl-dev) or set ACTPACK_ABSL_PREFIX")


def version():
    """The version, from common/version.h (its one place)."""
    with open(os.path.join(ROOT, "common", "version.h")) as f:
        return re.search(r'#define ACTPACK_VERSION "([^"]+)"', f.read()).group(1)


def torch_requirement():
    """The torch this build's binary works with: the same major.minor as the torch it is
    compiled against (C++ extensions have no stable ABI across torch releases)."""
    major, minor = __import__("torch").__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


absl_prefix = os.environ.get("ACTPACK_ABSL_PREFIX", "/usr")
with_cuda = cpp_extension.CUDA_HOME is not None and __import__("torch").version.cuda is not None
if os.environ.get("ACTPACK_FORCE_CPU") == "1":
    with_cuda = False

cc_sources = sources("codecs/*.cc", "codecs/internal/*.cc", "allocator/*.cc",
                     "allocator/internal/*.cc", "runtime/*.cc", "torch_plugin/csrc/*.cc",
                     "torch_plugin/bindings/*.cc", "report/*.cc")
cu_sources = sources("codecs/cuda/*.cu") if with_cuda else []
defines = [("ACTPACK_WITH_CUDA", "1")] if with_cuda else []
extension_type = cpp_extension.CUDAExtension if with_cuda else cpp_extension.CppExtension

extension = extension_type(
    name="actpack._C",
    sources=cc_sources + cu_sources,
    include_dirs=[ROOT, os.path.join(absl_prefix, "include")],
    define_macros=defines,
    extra_compile_args={
        # -fopenmp: torch's at::parallel_for (OpenMP backend) is inline; without OpenMP where
        # it is compiled, it runs on the calling thread alone. Linked as libgomp.so.1, the one
        # torch loads (its wheel's copy), so the process keeps a single OpenMP pool.
        "cxx": ["-std=c++20", "-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-Wno-unused-parameter",
                "-fopenmp"],
        "nvcc": ["-O3", "--fmad=false", "-Xcompiler=-ffp-contract=off",
                 "-gencode=arch=compute_80,code=sm_80",
                 "-gencode=arch=compute_90,code=sm_90",
                 "-gencode=arch=compute_90,code=compute_90"],
    },
    extra_link_args=system_link_args(absl_prefix) + ["-fopenmp"],
)

class BuildPyWithPth(build_py):
    """Also puts actpack-env.pth at the root of the install (site-packages), where Python's
    site module runs it at start: it activates actpack when ACTPACK_CONF is set."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(ROOT, "torch_plugin", "python", "actpack-env.pth"),
                       os.path.join(self.build_lib, "actpack-env.pth"))


# Metadata, extras and the console command are in pyproject.toml; version and dependencies
# are computed here (see version() and torch_requirement()).
setup(
    version=version(),
    install_requires=[torch_requirement()],
    package_dir={"actpack": "torch_plugin/python/actpack"},
    packages=["actpack", "actpack.integrations"],
    ext_modules=[extension],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True),
              "build_py": BuildPyWithPth},
)
