"""actpack.integrations.lightning: the callback on a tiny LightningModule on the CPU."""
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

lightning = pytest.importorskip(
    "lightning", reason="needs lightning (pip install \"actpack[lightning]\"; tools/setup_env.sh "
                        "installs it)")

from actpack.integrations.lightning import ActpackCallback  # noqa: E402
from training_checks import check_budgeted_run  # noqa: E402

STEPS = 20


class Classifier(lightning.LightningModule):
    """An MLP on labels from a fixed random linear teacher; wide and deep enough that its saved
    activations outweigh what a step holds raw at its peak (a layer's gradients in flight)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 256), nn.Tanh(),
                                 *[m for _ in range(4) for m in (nn.Linear(256, 256), nn.Tanh())],
                                 nn.Linear(256, 10))
        self.losses = []

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def data():
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(32, 10, generator=generator)
    x = torch.randn(STEPS * 4096, 32, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x @ teacher).argmax(1)),
                                       batch_size=4096)


def fit(tmp_path, name, callback=None):
    module = Classifier()
    trainer = lightning.Trainer(default_root_dir=str(tmp_path / name), max_steps=STEPS,
                                accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False,
                                callbacks=[callback] if callback else None)
    trainer.fit(module, data())
    return module.losses


def test_fit_under_a_budget_keeps_every_step_under_it_with_the_loss_of_plain_training(
        tmp_path, monkeypatch):
    monkeypatch.delenv("ACTPACK_CONF", raising=False)
    plain = fit(tmp_path, "plain")
    assert len(plain) == STEPS and plain[-1] < plain[0] * 0.5

    measure = ActpackCallback("4GiB", enabled=False)
    assert fit(tmp_path, "measure", measure) == plain
    plain_peak = measure.run.report["run"]["peak_reserved_bytes"]

    budget = int(plain_peak * 0.8)  # below what plain training reserved
    callback = ActpackCallback(budget)
    packed = fit(tmp_path, "packed", callback)
    report = json.loads((tmp_path / "packed" / "actpack_report.json").read_text())
    assert report == callback.run.report
    check_budgeted_run(report, budget, plain, packed, plain_peak, label="lightning")


class Fails(Classifier):
    def training_step(self, batch, index):
        if index == 2:
            raise RuntimeError("a bad batch")
        return super().training_step(batch, index)


def test_a_failing_fit_closes_the_budget_and_reports_why(tmp_path, monkeypatch):
    monkeypatch.delenv("ACTPACK_CONF", raising=False)
    import actpack
    installed = actpack.cpu_allocator_installed()
    callback = ActpackCallback("1GiB")
    trainer = lightning.Trainer(default_root_dir=str(tmp_path), max_steps=STEPS,
                                accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=[callback])
    with pytest.raises(RuntimeError, match="a bad batch"):
        trainer.fit(Fails(), data())
    report = json.loads((tmp_path / "actpack_report.json").read_text())
    assert any("a bad batch" in w for w in report["run"]["warnings"])
    assert len(report["activations"]["steps"]) == 2
    assert actpack.cpu_allocator_installed() == installed  # the budget put the allocator back
