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


def arch_list_of(torch_archs):
    """TORCH_CUDA_ARCH_LIST's form ("7.5;8.0;9.0+PTX") of torch.cuda.get_arch_list()'s answer
    (["sm_75", "sm_80", "sm_90"], with "compute_XY" where torch carries PTX): every machine code
    torch has, and PTX of the newest architecture (as torch.utils.cpp_extension adds it)."""
    machine = sorted({int(a[3:]) for a in torch_archs if re.fullmatch(r"sm_\d+", a)})
    ptx = {int(a[8:]) for a in torch_archs if re.fullmatch(r"compute_\d+", a)}
    if not machine and not ptx:
        return ""
    ptx.add(max(machine or ptx))
    return ";".join(f"{n // 10}.{n % 10}" + ("+PTX" if n in ptx else "")
                    for n in sorted(set(machine) | ptx))


def gencode_flags(arch_list):
    """nvcc's -gencode flags for a TORCH_CUDA_ARCH_LIST of numbers ("7.5;8.0;9.0+PTX", ';' or
    ' ' between them), as torch.utils.cpp_extension writes them."""
    flags = []
    for arch in arch_list.replace(" ", ";").split(";"):
        if not arch:
            continue
        match = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", arch)
        if match is None:
            raise SystemExit(f"actpack: unknown CUDA architecture {arch!r} in {arch_list!r}; "
                             "expected numbers such as 7.5 or 9.0+PTX")
        number = match.group(1) + match.group(2) + match.group(3)
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if match.group(4):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return sorted(set(flags))


def cuda_arch_flags(environ, visible_devices, torch_archs, torch_pick, nvcc_codes=None):
    """(the -gencode flags the kernels are built with, where they come from).

    TORCH_CUDA_ARCH_LIST when it is set (`torch_pick()`: torch.utils.cpp_extension's reading
    of it, named architectures and "native" too); else, with GPUs visible, torch's pick for
    them (their architectures, PTX of the newest); else, building where no GPU is (a wheel for
    other machines), every architecture torch itself was built for (`torch_archs`:
    torch.cuda.get_arch_list()), so that actpack runs wherever this torch does. `nvcc_codes`:
    the code= values this nvcc can write (nvcc --list-gpu-code), to leave out of the last
    list what torch was built for and this nvcc cannot (a CUDA 13 nvcc writes nothing below
    sm_75), or None to leave it whole."""
    chosen = environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if chosen:
        return sorted(set(torch_pick())), f"TORCH_CUDA_ARCH_LIST={chosen}"
    if visible_devices > 0:
        return sorted(set(torch_pick())), "the visible GPUs (torch.utils.cpp_extension's choice)"
    flags = gencode_flags(arch_list_of(torch_archs))
    if not flags:
        raise SystemExit(
            "actpack: no CUDA architectures to build for: no GPU is visible, TORCH_CUDA_ARCH_LIST "
            "is not set and torch.cuda.get_arch_list() is empty; set TORCH_CUDA_ARCH_LIST (such "
            "as \"8.0;9.0+PTX\") or ACTPACK_FORCE_CPU=1")
    source = "the architectures torch was built for (torch.cuda.get_arch_list())"
    if nvcc_codes is not None:
        left = [f for f in flags if _code(f) not in nvcc_codes]
        if left:
            codes = ", ".join(sorted(map(_code, left), key=_code_order))
            source += f", less {codes}, which this nvcc cannot build"
            flags = [f for f in flags if f not in left]
    return flags, source


def _code(flag):
    """"sm_80" of "-gencode=arch=compute_80,code=sm_80"."""
    return flag.rsplit("code=", 1)[1]


def _code_order(code):
    """By architecture, machine code before PTX."""
    return int(re.sub(r"\D", "", code)), code.startswith("compute_")


def architectures_macro(flags):
    """ACTPACK_CUDA_ARCHS (torch_plugin/csrc/kernel_image_probe.cu): the code= values of
    `flags`, machine code before PTX per architecture, joined by '+' (sm_80+sm_90+compute_90)."""
    return "+".join(sorted({_code(f) for f in flags}, key=_code_order))


def nvcc_gpu_codes(cuda_home):
    """The code= values this nvcc writes (nvcc --list-gpu-code), or None where it cannot say."""
    import subprocess
    try:
        listed = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--list-gpu-code"],
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    codes = set(listed.split())
    return codes | {"compute_" + c[3:] for c in codes if c.startswith("sm_")}


class BuildPyWithPth(build_py):
    """Also puts actpack-env.pth at the root of the install (site-packages), where Python's
    site module runs it at start: it activates actpack when ACTPACK_CONF is set."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(ROOT, "torch_plugin", "python", "actpack-env.pth"),
                       os.path.join(self.build_lib, "actpack-env.pth"))


def main():
    absl_prefix = os.environ.get("ACTPACK_ABSL_PREFIX", "/usr")
    with_cuda = cpp_extension.CUDA_HOME is not None and __import__("torch").version.cuda is not None
    if os.environ.get("ACTPACK_FORCE_CPU") == "1":
        with_cuda = False

    cc_sources = sources("codecs/*.cc", "codecs/internal/*.cc", "allocator/*.cc",
                         "allocator/internal/*.cc", "runtime/*.cc", "torch_plugin/csrc/*.cc",
                         "torch_plugin/bindings/*.cc", "report/*.cc")
    cu_sources = sources("codecs/cuda/*.cu", "torch_plugin/csrc/*.cu") if with_cuda else []
    defines = [("ACTPACK_WITH_CUDA", "1")] if with_cuda else []
    arch_flags = []
    if with_cuda:
        import torch
        arch_flags, arch_source = cuda_arch_flags(
            os.environ, torch.cuda.device_count(), torch.cuda.get_arch_list(),
            cpp_extension._get_cuda_arch_flags, nvcc_gpu_codes(cpp_extension.CUDA_HOME))
        print(f"actpack: CUDA kernels for {architectures_macro(arch_flags).replace('+', ' ')}, from "
              f"{arch_source}")
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
            # -g0: no debug information (Python's own CFLAGS ask for -g), as torch's wheels: a
            # translation unit with torch's headers compiles in 0.7 of the time and its object
            # is 40x smaller.
            "cxx": ["-std=c++20", "-O3", "-g0", "-ffp-contract=off", "-fno-strict-aliasing",
                    "-Wno-unused-parameter", "-fopenmp"],
            # The architectures: cuda_arch_flags. Given here, they are the only ones (torch adds
            # its own pick only where no -gencode flag is given).
            "nvcc": ["-O3", "--fmad=false", "-Xcompiler=-ffp-contract=off", *arch_flags,
                     f"-DACTPACK_CUDA_ARCHS={architectures_macro(arch_flags)}"],
        },
        extra_link_args=system_link_args(absl_prefix) + ["-fopenmp"],
    )

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


# Run as the build runs it (setuptools' build backend, `python setup.py`), not when a test
# imports it for its functions.
if __name__ == "__main__":
    main()
