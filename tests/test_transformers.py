"""actpack.integrations.transformers: the Trainer callback and the batch-size helper, on a tiny
randomly initialised GPT-2 (built from a config in code: nothing is downloaded), on the CPU."""
import json

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="needs transformers (pip install \"actpack[transformers]\"; "
                           "tools/setup_env.sh installs it)")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (actpack[transformers])")

from actpack.integrations.transformers import ActpackCallback, plan_batch_size  # noqa: E402
from training_checks import check_budgeted_run  # noqa: E402

STEPS, BATCH, CONTEXT = 12, 8, 64


class Tokens(torch.utils.data.Dataset):
    """Byte-level language modelling on a fixed text: input_ids and labels of CONTEXT tokens."""

    def __init__(self, count=64):
        text = (b"actpack packs the activations autograd saves for backward; " * 200)
        data = torch.tensor(list(text), dtype=torch.long)
        self.examples = [data[i * 7:i * 7 + CONTEXT] for i in range(count)]

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return {"input_ids": self.examples[i], "labels": self.examples[i]}


def tiny_gpt2():
    transformers.set_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=64, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def train(tmp_path, name, callback=None, batch=BATCH):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / name), max_steps=STEPS, per_device_train_batch_size=batch,
        learning_rate=3e-3, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(),
                                   callbacks=[callback] if callback else None)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_trainer_under_a_budget_keeps_every_step_under_it_with_the_loss_of_plain_training(
        tmp_path, monkeypatch):
    monkeypatch.delenv("ACTPACK_CONF", raising=False)
    plain = train(tmp_path, "plain")
    assert len(plain) == STEPS and plain[-1] < plain[0] * 0.8  # it learns

    # The callback with packing off: the same losses, and the peak plain training reaches.
    measure = ActpackCallback("4GiB", enabled=False)
    assert train(tmp_path, "measure", measure) == plain
    plain_peak = measure.run.report["run"]["peak_reserved_bytes"]

    # Below what plain training reserved; at this size the allocator's 2 MiB segments leave
    # little room under tighter budgets.
    budget = int(plain_peak * 0.9)
    callback = ActpackCallback(budget)
    packed = train(tmp_path, "packed", callback)
    report_path = tmp_path / "packed" / "actpack_report.json"
    assert callback.report_path == str(report_path)
    report = json.loads(report_path.read_text())
    assert report == callback.run.report
    check_budgeted_run(report, budget, plain, packed, plain_peak, last=3, label="trainer")


def test_the_callback_takes_its_budget_from_actpack_conf(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTPACK_CONF", "budget=1GiB,codec=quant8,min_bytes=16KiB")
    callback = ActpackCallback(min_bytes="32KiB")  # an argument wins over the variable's key
    train(tmp_path, "conf", callback)
    report = json.loads((tmp_path / "conf" / "actpack_report.json").read_text())
    assert report["run"]["budget_bytes"] == 1 << 30
    assert report["run"]["codec"] == "quant8"
    packed = [s for s in report["activations"]["saved_tensors"] if s["codec"].startswith("quant8")]
    assert packed and min(s["raw_bytes"] for s in packed) >= 32 << 10


def test_without_a_budget_the_callback_says_how_to_give_one(tmp_path, monkeypatch):
    monkeypatch.delenv("ACTPACK_CONF", raising=False)
    with pytest.raises(ValueError, match="ACTPACK_CONF"):
        ActpackCallback()
    with pytest.raises(ValueError, match="'6 gigs'"):
        ActpackCallback("6 gigs").on_train_begin(
            transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none"), None, None)


def test_plan_batch_size_sets_the_largest_batch_that_fits_and_leaves_the_weights(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.delenv("ACTPACK_CONF", raising=False)
    model = tiny_gpt2()
    before = [p.detach().clone() for p in model.parameters()]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none",
                                          use_cpu=True, auto_find_batch_size=True)
    plan = plan_batch_size(args, model, Tokens(count=256), budget=32 << 20, codec="auto",
                           progress=False)
    assert args.per_device_train_batch_size == plan.max_batch_size["auto"]
    assert not args.auto_find_batch_size
    # The plain step supports fewer: the helper plans for the packed step.
    assert plan.max_batch_size["none"] < plan.max_batch_size["auto"]
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)  # planning steps had a learning rate of 0
    # Capped at the dataset's size.
    plan_batch_size(args, model, Tokens(count=4), budget=32 << 20, progress=False)
    assert args.per_device_train_batch_size == 4


def test_plan_batch_size_with_verify_takes_the_batch_that_ran_under_the_cap(tmp_path,
                                                                            monkeypatch):
    # What actpack.plan answers is tested with the planner; here, which of its numbers is used.
    import actpack

    def fake_plan(step, budget, verify, **kwargs):
        step(2)  # the step function trains on collated dataset batches
        choice = {"fixed_bytes": 0, "per_sample_bytes": 1 << 20, "fragmentation": 1.0,
                  "headroom": 0.05, "calibration": None, "max_batch_size": 52}
        return actpack.Plan(32 << 20, [8, 16], {"auto": choice},
                            {"codec": "auto", "batch_size": verified, "predicted_batch_size": 52,
                             "smallest_tried": 36, "peak_bytes": None} if verify else None, {})

    monkeypatch.setattr(actpack, "plan", fake_plan)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    verified = 40
    plan_batch_size(args, tiny_gpt2(), Tokens(count=256), budget="32MiB", verify=True)
    assert args.per_device_train_batch_size == 40
    plan_batch_size(args, tiny_gpt2(), Tokens(count=256), budget="32MiB", verify=False)
    assert args.per_device_train_batch_size == 52
    verified = 0  # no batch ran under the cap
    with pytest.raises(ValueError, match="does not fit one example"):
        plan_batch_size(args, tiny_gpt2(), Tokens(count=256), budget="32MiB", verify=True)


def test_plan_batch_size_refuses_a_budget_that_fits_no_batch(tmp_path, monkeypatch):
    monkeypatch.delenv("ACTPACK_CONF", raising=False)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="does not fit one example"):
        plan_batch_size(args, tiny_gpt2(), Tokens(), budget=64 << 10, progress=False)
    with pytest.raises(ValueError, match="'quant4' is not a planner choice"):
        plan_batch_size(args, tiny_gpt2(), Tokens(), budget="1GiB", codec="quant4")
