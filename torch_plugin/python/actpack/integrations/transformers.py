"""actpack for the Hugging Face Trainer (pip install "actpack[transformers]").

    from actpack.integrations.transformers import ActpackCallback, plan_batch_size

    args = TrainingArguments(output_dir="out", ...)
    plan_batch_size(args, model, train_dataset, collator, budget="6GiB")  # sets the batch size
    trainer = Trainer(model=model, args=args, train_dataset=train_dataset,
                      data_collator=collator, callbacks=[ActpackCallback("6GiB")])
    trainer.train()     # out/actpack_report.json: `actpack report out/actpack_report.json`
"""
import torch

import actpack
from actpack.integrations._training import CallbackMixin, options_from, require

transformers = require("transformers", "transformers")


class ActpackCallback(CallbackMixin, transformers.TrainerCallback):
    """Runs Trainer.train() under actpack.budget and writes the report into args.output_dir.

    Args:
        limit: the budget ("6GiB", "80%", bytes); None takes it, and every other option, from
            ACTPACK_CONF (arguments given here win over its keys).
        **options: actpack.budget's options (codec, min_bytes, headroom, allowed_loss_increase,
            ...). report= overrides the path, which is otherwise
            <output_dir>/actpack_report.json (.rank<N> per process when distributed).

    The budget opens when training begins and closes when it ends; each backward pass is a
    step of the report (several per optimizer step with gradient accumulation). `run` is the
    actpack Run (its `report` after training) and `report_path` where the report went.
    """

    def on_train_begin(self, args, state, control, **kwargs):
        self._training.start(args.output_dir)

    def on_train_end(self, args, state, control, **kwargs):
        self._training.stop()


def plan_batch_size(args, model, train_dataset, data_collator=None, budget=None, codec="auto",
                    batch_sizes=(8, 16), verify=False, report=None, progress=True):
    """Sets args.per_device_train_batch_size to the largest batch `budget` supports.

    Instead of auto_find_batch_size's out-of-memory trials, actpack.plan profiles real training
    steps of `model` (forward on a batch of `train_dataset` collated by `data_collator`,
    backward, an AdamW step) at `batch_sizes` and solves for the largest batch whose peak fits
    the budget with codec choice `codec` ("auto", "none", "quant2", "division" or "eb": train
    with the same codec). The planning steps use a learning rate of 0, so the weights stay as
    they are. auto_find_batch_size is switched off. With verify=True the batch set is the one
    real steps ran under the cap at (the prediction, or less). The batch is capped at the
    dataset's size.

    Args:
        args: the TrainingArguments to set.
        model: the model as it will train (on its device), returning a loss for labelled input.
        train_dataset: indexable examples.
        data_collator: builds a batch from a list of examples (default: transformers'
            default_data_collator).
        budget: "6GiB", "80%" or bytes; None takes ACTPACK_CONF's.
        batch_sizes, verify, report, progress: as actpack.plan.
    Returns the actpack Plan. Raises ValueError when no batch fits (or none verified).
    """
    limit, _ = options_from(budget, {}, "plan_batch_size")
    if codec not in actpack._planner.CHOICES:
        raise ValueError(f"plan_batch_size: codec {codec!r} is not a planner choice; expected "
                         f"one of {', '.join(actpack._planner.CHOICES)}")
    if len(train_dataset) < 1:
        raise ValueError("plan_batch_size: train_dataset is empty")
    collate = data_collator or transformers.default_data_collator
    device = next(model.parameters()).device
    # The optimizer's state is part of the step's memory; lr=0 leaves the weights unchanged.
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    was_training = model.training
    model.train()

    def step(batch_size):
        examples = [train_dataset[i % len(train_dataset)] for i in range(batch_size)]
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                 for k, v in collate(examples).items()}
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        plan = actpack.plan(step, limit, batch_sizes=batch_sizes, verify=verify,
                            codecs=["none", codec] if codec != "none" else ["none"],
                            report=report, progress=progress)
    finally:
        del optimizer
        model.train(was_training)
    batch_size = plan.verified["batch_size"] if verify else plan.max_batch_size[codec]
    batch_size = min(batch_size, len(train_dataset))
    if batch_size < 1:
        raise ValueError(f"plan_batch_size: a budget of {limit!r} does not fit one example "
                         f"with codec {codec!r}:\n{plan.table()}")
    args.per_device_train_batch_size = batch_size
    args.auto_find_batch_size = False
    return plan
