"""On a GPU: every codec the registry holds, not only those tests/test_codec_registry.py's table
names, writes the CPU's bytes on CUDA; and that table covers every registered codec, so its
byte-identity test (every spec, dtype and shape) runs for each. A codec registered later fails
here until the table names it. Skipped without CUDA; tools/gpu_check.sh runs it with the registry's GPU tests.
"""
import pytest
import torch

import actpack
import test_codec_registry as registry

SHAPE = (4, 16, 56, 56)


@pytest.mark.gpu
@pytest.mark.parametrize("name", actpack.codec_names())
def test_every_registered_codec_writes_the_cpus_bytes_on_cuda(name):
    specs = [s for s in registry.SPECS if registry.codec_of(s) == name]
    assert specs, f"{name} is registered but tests/test_codec_registry.py's SPECS has no spec for it"
    spec = specs[0]
    dtype = registry.SPECS[spec][0]
    for x in registry.inputs(spec, dtype, SHAPE):
        cpu = actpack.encode(x, spec, seed=11)
        cuda = actpack.encode(x.cuda(), spec, seed=11)
        assert torch.equal(cpu, cuda.cpu()), (spec, dtype)
        assert registry.same_values(actpack.decode(cuda).cpu(), actpack.decode(cpu))
