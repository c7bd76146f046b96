"""On a GPU: a training step under actpack makes the host wait once (the statuses' read at the
end of backward), plus once more where eb tensors are unpacked before their sizes were read,
and never in a pack or an unpack: the CUDA runtime's own API trace (torch.profiler) counts the
blocking calls, less a plain run's (the profiler's own sync). The CUDA emulator checks the
session and the codecs the same way in CI (runtime/session_cuda_test); this checks the whole
plugin on hardware, with benchmarks/gpu_sync.py's models and counting. Skipped without CUDA;
tools/gpu_check.sh runs it."""
import pytest

from benchmarks import gpu_sync as gpu_sync_check


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cnn", "gpt"])
@pytest.mark.parametrize("codec", sorted(gpu_sync_check.PREDICTED))
def test_a_steady_step_waits_for_the_device_at_most_once_or_twice(kind, codec):
    extra = gpu_sync_check.extra_waits_per_step(kind, codec)
    # Not fewer than one either: the statuses are read once a step, or failures go unseen.
    assert 1 <= sum(extra.values()) <= gpu_sync_check.PREDICTED[codec], extra
