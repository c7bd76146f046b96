"""How the emulated CUDA tests run under the race checker with gcov counts: the Bazel config
and the test environment that tools/cudaemu_coverage.py and tools/mutate_kernels.py share (the
mutation run's unmutated build must be the coverage run's cached one, so both pass the same)."""
import subprocess

CONFIG = "cudaemu_race"


def bazel(*args):
    return subprocess.run(["bazel", *args], check=False, text=True, capture_output=True)


def execution_root():
    return bazel("info", f"--config={CONFIG}", "execution_root").stdout.strip()


def gcov_test_env(execroot):
    """The --test_env flags that send every test's gcov counts beside the objects. The objects
    name their counts file /proc/self/cwd/bazel-out/... (Bazel compiles in /proc/self/cwd): strip
    those 3 components and put the execution root in front."""
    return [f"--test_env=GCOV_PREFIX={execroot}", "--test_env=GCOV_PREFIX_STRIP=3"]
