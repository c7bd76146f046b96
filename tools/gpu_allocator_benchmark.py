"""Entry point: the allocators' replay of recorded training steps on the GPU (tools/gpu_check.sh runs this); the code is benchmarks/alloc_replay.py."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.alloc_replay import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
