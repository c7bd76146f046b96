"""The main job's entry point (bash tools/demo.sh runs it): the workload is benchmarks/demo.py,
whose docstring says what it does and which arguments it takes."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.demo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
