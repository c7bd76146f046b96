"""On a GPU: a training step under actpack makes the host wait once (the statuses' read at the
end of backward), plus once more where eb tensors are unpacked before their sizes were read,
and never in a pack or an unpack: the CUDA runtime's own API trace (torch.profiler) counts the
blocking calls. The CUDA emulator checks the session and the codecs the same way in CI
(runtime/session_cuda_test); this checks the whole plugin on hardware. Skipped without CUDA;
tools/gpu_check.sh runs it."""
import collections

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import actpack

WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
         "cudaFree", "cudaMalloc")


def blocking_calls_per_step(codec, warmup=6, measured=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.GELU(),
                          nn.Dropout(0.1), nn.Flatten(), nn.Linear(64 * 16 * 16, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")

    def step():
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with actpack.budget("64GiB", codec=codec):
        for _ in range(warmup):  # the policy's profile steps, the pools' growth
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(measured):
                step()
        torch.cuda.synchronize()
    counts = collections.Counter(e.name for e in prof.events() if e.name in WAITS)
    return sum(counts.values()) / measured, counts


@pytest.mark.gpu
@pytest.mark.parametrize("codec, most", [("quant2", 1), ("division", 1), ("eb", 2), ("auto", 2)])
def test_a_steady_step_waits_for_the_device_at_most_once_or_twice(codec, most):
    per_step, counts = blocking_calls_per_step(codec)
    assert per_step <= most, dict(counts)
