"""Entry point: records the allocation trace of real training steps of the demo models; the code is benchmarks/record_trace.py."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.record_trace import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
