"""What a result file records about how it was made: the command, the commit and the machine.

    from benchmarks import provenance
    document.update(provenance.record())   # {"command", "commit", "dirty", "date", "machine"}

The command is the script's path as run from the repository's root and its arguments; the
commit is `git rev-parse HEAD` and `dirty` whether tracked files differed from it (None where
there is no git); the machine is the CPU's model, its cores, the intra-op threads, torch's
and Python's versions (and the GPU's name where a device is used). Imports nothing that
imports torch until `record` is called.
"""
import datetime
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(argv=None):
    """`python3 <script relative to the root> <args>` of this process (or of `argv`)."""
    argv = list(sys.argv if argv is None else argv)
    script = argv[0] if argv else ""
    if script and os.path.exists(script):
        script = os.path.relpath(os.path.abspath(script), ROOT)
    return " ".join(["python3", script] + argv[1:])


def commit():
    """(HEAD, dirty): dirty is whether tracked files differ from HEAD; (None, None) without
    git."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        changes = subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                                  "--untracked-files=no"], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return (head, bool(changes)) if head else (None, None)


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), else platform's answer."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device=None):
    """The machine as a result file records it."""
    import torch

    info = {"cpu": cpu_model(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version()}
    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def record(argv=None, device=None):
    """{"command", "commit", "dirty", "date", "machine"} for a result file."""
    head, dirty = commit()
    return {"command": command(argv), "commit": head, "dirty": dirty,
            "date": datetime.date.today().isoformat(), "machine": machine(device)}
