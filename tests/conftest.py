import os
import sys

import pytest
import torch

# The demo (tools/demo.py) is imported by tests as a module.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; tools/gpu_check.sh runs these on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cpu_allocator():
    """actpack's CPU allocator from before the model is built: a budget counts everything."""
    import actpack
    installed = actpack.cpu_allocator_installed()
    actpack.install_cpu_allocator()
    yield
    if not installed:
        actpack.uninstall_cpu_allocator()
