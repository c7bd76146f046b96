"""Host waits per training step on a real GPU (tools/gpu_check.sh runs this): the models and the
counting are benchmarks/gpu_sync.py."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.gpu_sync import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
