"""The CUDA architectures the kernels are built for, and what a GPU outside them is told.

setup.py built sm_80, sm_90 and compute_90 PTX whatever torch was built for: a V100 or a T4
(still common in shared clusters and free notebooks) got "no kernel image is available" at
the first pack. Now setup.py builds for TORCH_CUDA_ARCH_LIST, else the visible GPUs (torch's
own choice for extensions), else, where no GPU is visible, every architecture torch was built
for (less what the nvcc at hand cannot write); and a device the build has no kernels for is
told so at its first CUDA use, naming itself, its architecture and the build's
(torch_plugin/csrc/kernel_image.h).
"""
import importlib.util
import os
import re

import pytest
import torch
from torch.utils import cpp_extension

import actpack
from actpack import _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and actpack._C.with_cuda),
    reason="needs a CUDA device and an actpack build with CUDA")

# torch 2.x CUDA 12 wheels' torch.cuda.get_arch_list()
TORCH_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
# `nvcc --list-gpu-code` of CUDA 13, which writes nothing below sm_75
NVCC_13 = {f"{kind}_{n}" for kind in ("sm", "compute")
           for n in (75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121)}


@pytest.fixture(scope="module")
def setup_py():
    """setup.py as a module: its functions, without building (main() runs as __main__ only)."""
    spec = importlib.util.spec_from_file_location("actpack_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_pick():
    raise AssertionError("torch's pick was asked, with no GPU visible and no list set")


def test_without_a_gpu_the_build_is_for_torchs_own_architectures(setup_py):
    assert setup_py.arch_list_of(TORCH_ARCHS) == "5.0;6.0;7.0;7.5;8.0;8.6;9.0+PTX"
    flags, source = setup_py.cuda_arch_flags({}, 0, TORCH_ARCHS, no_pick)
    assert flags == setup_py.gencode_flags("5.0;6.0;7.0;7.5;8.0;8.6;9.0+PTX")
    assert "-gencode=arch=compute_70,code=sm_70" in flags  # a V100
    assert "-gencode=arch=compute_75,code=sm_75" in flags  # a T4
    assert "-gencode=arch=compute_90,code=compute_90" in flags  # PTX for what comes after
    assert "torch.cuda.get_arch_list()" in source
    # What the nvcc at hand cannot write is left out, and the source says so.
    flags, source = setup_py.cuda_arch_flags({}, 0, TORCH_ARCHS, no_pick, NVCC_13)
    assert setup_py.architectures_macro(flags) == "sm_75+sm_80+sm_86+sm_90+compute_90"
    assert source.endswith("less sm_50, sm_60, sm_70, which this nvcc cannot build")


def test_torch_arch_list_and_visible_gpus_are_torchs_choice(setup_py):
    picked = ["-gencode=arch=compute_75,code=sm_75"]
    flags, source = setup_py.cuda_arch_flags({"TORCH_CUDA_ARCH_LIST": "7.5"}, 2, TORCH_ARCHS,
                                             lambda: picked, NVCC_13)
    assert flags == picked and source == "TORCH_CUDA_ARCH_LIST=7.5"
    flags, source = setup_py.cuda_arch_flags({}, 1, TORCH_ARCHS, lambda: picked)
    assert flags == picked and "visible GPUs" in source


def test_gencode_flags_read_an_arch_list_as_torch_does(setup_py, monkeypatch):
    for arch_list in ("7.5;8.0;9.0+PTX", "7.0 7.5 8.6+PTX", "9.0a", "8.0;10.0;12.0+PTX"):
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
        assert setup_py.gencode_flags(arch_list) == cpp_extension._get_cuda_arch_flags()
    with pytest.raises(SystemExit, match="unknown CUDA architecture 'Volta'"):
        setup_py.gencode_flags("Volta")


def test_the_build_names_its_architectures():
    built = _C.cuda_architectures
    if not _C.with_cuda:
        assert built == ""
    else:
        assert built and all(re.fullmatch(r"(sm|compute)_\d+a?", code) for code in built.split())


def test_a_gpu_without_a_kernel_image_is_told_its_name_architecture_and_the_builds():
    message = _C._no_kernel_image_message(1, "Tesla T4", 7, 5, "sm_80 sm_90 compute_90")
    assert message.startswith("actpack: its CUDA kernels cannot run on cuda:1 (Tesla T4, sm_75): "
                              "this build holds machine code for sm_80, sm_90 and PTX for "
                              "compute_90, none of which an sm_75 GPU runs."), message
    assert 'TORCH_CUDA_ARCH_LIST="7.5" pip install' in message
    newer = _C._no_kernel_image_message(0, "B200", 10, 0, "sm_80 sm_90 compute_90",
                                        ptx_too_new=True)
    assert "(B200, sm_100)" in newer and "the NVIDIA driver is older" in newer
    assert 'TORCH_CUDA_ARCH_LIST="10.0"' in newer
    assert "holds no CUDA kernels" in _C._no_kernel_image_message(0, "x", 8, 0, "")


def test_without_cuda_the_check_asks_nothing():
    if _C.with_cuda:
        pytest.skip("a build with CUDA checks the device")
    _C._check_kernel_image(3)  # no device, nothing to run


@pytest.mark.gpu
@requires_cuda
def test_the_gpu_at_hand_runs_the_builds_kernels():
    _C._check_kernel_image(0)
    x = torch.randn(4096, device="cuda")
    buffer = torch.ops.actpack.encode(x, "quant2")  # the first CUDA use checks the device
    assert torch.ops.actpack.decode(buffer).shape == x.shape
