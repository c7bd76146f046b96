"""actpack for Lightning (pip install "actpack[lightning]").

    from actpack.integrations.lightning import ActpackCallback

    trainer = lightning.Trainer(callbacks=[ActpackCallback("6GiB")], ...)
    trainer.fit(module, data)   # <log_dir>/actpack_report.json
"""
from actpack.integrations._training import CallbackMixin, require

lightning = require("lightning", "lightning")


class ActpackCallback(CallbackMixin, lightning.pytorch.Callback):
    """Runs Trainer.fit's training under actpack.budget and writes the report into the run's
    log directory (trainer.log_dir, else default_root_dir).

    Args:
        limit: the budget ("6GiB", "80%", bytes); None takes it, and every other option, from
            ACTPACK_CONF (arguments given here win over its keys).
        **options: actpack.budget's options (codec, min_bytes, headroom, allowed_loss_increase,
            ...). report= overrides the path, <log_dir>/actpack_report.json by default
            (.rank<N> per process when distributed).

    The budget opens when training starts and closes when it ends or fails (the report then
    says why); each backward pass is a step of the report. `run` is the actpack Run (its
    `report` after training) and `report_path` where the report went.
    """

    def on_train_start(self, trainer, pl_module):
        self._training.start(trainer.log_dir or trainer.default_root_dir)

    def on_train_end(self, trainer, pl_module):
        self._training.stop()

    def on_exception(self, trainer, pl_module, exception):
        self._training.stop(exception)
