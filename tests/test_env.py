"""ACTPACK_CONF: actpack enabled for an unmodified script from interpreter start."""
import json
import os
import site
import subprocess
import sys
import textwrap

import pytest
from conftest import HANG_GUARD_S

SCRIPT = textwrap.dedent("""
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
        loss = F.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
    print("loss", loss.item())
""")


def pth_installed():
    dirs = site.getsitepackages() + [site.getusersitepackages()]
    return any(os.path.exists(os.path.join(d, "actpack-env.pth")) for d in dirs)


pytestmark = pytest.mark.skipif(not pth_installed(),
                                reason="actpack-env.pth is not in a site directory (install with pip)")


def run(script_path, conf):
    env = dict(os.environ)
    env.pop("ACTPACK_CONF", None)
    if conf is not None:
        env["ACTPACK_CONF"] = conf
    return subprocess.run([sys.executable, str(script_path)], env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)


def test_unmodified_script_is_packed_and_reported(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report = tmp_path / "run.json"
    result = run(script, f"budget=512MiB,codec=quant4,report={report},min_bytes=4KiB")
    assert result.returncode == 0, result.stderr
    data = json.loads(report.read_text())
    assert data["run"]["codec"] == "quant4"
    assert data["run"]["budget"] == "512.00 MiB"
    assert data["activations"]["totals"]["packs"] >= 3
    assert len(data["activations"]["steps"]) == 3
    # Without the variable nothing of actpack is imported and the losses are plain PyTorch's.
    plain = run(script, None)
    assert plain.returncode == 0 and "loss" in plain.stdout


def test_budget_is_enforced_by_the_installed_allocator(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = run(script, "budget=1MiB,allocator=cpu")
    assert result.returncode != 0
    # The first step finishes over the cap to measure itself, then names what it needs.
    assert "OutOfMemoryError: actpack: a budget of 1.00 MiB cannot hold this training step" \
        in result.stderr, result.stderr[-2000:]
    assert "the smallest budget that would work is" in result.stderr


def test_recompute_key_reaches_the_regions(tmp_path):
    """recompute=true makes actpack.recompute's regions recompute; auto, under a budget the
    codecs hold, leaves them plain calls."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, actpack
        x = torch.randn(64, 256, requires_grad=True)
        out = actpack.recompute(torch.nn.Linear(256, 256), x, micro_batch=16)
        out.sum().backward()
        print(type(out.grad_fn).__name__)
    """))
    for conf, node in (("recompute=true", "_RegionBackward"), ("recompute=auto", "AddmmBackward0"),
                       ("recompute=false", "AddmmBackward0")):
        result = run(script, f"budget=512MiB,{conf}")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [node], (conf, result.stdout)


@pytest.mark.parametrize("conf, words", [
    ("budget=512MiB,codek=quant4", "unknown key 'codek'"),
    ("budget=6 gigs", "invalid memory size '6 gigs'"),
    ("codec=quant2", "key 'budget' is required"),
    ("budget=1GiB,allocator=gpu", "key 'allocator' is 'gpu'"),
    ("budget=1GiB,codec=zstd", "unknown codec 'zstd'"),
    ("budget=1GiB,seed=x", "key 'seed' is 'x'"),
    ("budget", "'budget' is not key=value"),
    ("budget=1GiB,codec=eb,allowed_loss_increase=lots", "key 'allowed_loss_increase' is 'lots'"),
    ("budget=1GiB,codec=quant2,allowed_loss_increase=0.01", "does not apply to codec 'quant2'"),
    ("budget=1GiB,recompute=maybe", "key 'recompute' is 'maybe'; expected true, false or auto"),
])
def test_malformed_values_stop_at_start_naming_the_key(tmp_path, conf, words):
    script = tmp_path / "train.py"
    script.write_text("print('should not run')\n")
    result = run(script, conf)
    assert result.returncode == 2
    assert "should not run" not in result.stdout
    assert words in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
