"""What the framework callbacks share: a budget that spans one training run."""
import json
import os
import warnings

import actpack
from actpack import _budget, _env

REPORT_NAME = "actpack_report.json"


def require(module, extra):
    """Imports `module` (a framework), or raises ImportError naming the extra that installs it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"actpack.integrations.{extra} needs the {module!r} package: "
                          f"pip install \"actpack[{extra}]\"") from error


def options_from(limit, options, caller):
    """(limit, budget options) from the arguments, else from ACTPACK_CONF."""
    if limit is not None:
        return limit, dict(options)
    text = os.environ.get("ACTPACK_CONF")
    if not text:
        raise ValueError(f"{caller}: no budget: pass one (e.g. limit=\"6GiB\") or set "
                         "ACTPACK_CONF=\"budget=6GiB,...\"")
    conf = _env.parse(text)
    # The allocator key says which allocator to install at interpreter start; a budget opened
    # when training starts uses the CPU pool or, on CUDA, whatever was installed by then.
    conf.pop("allocator", None)
    conf.update(options)
    return conf.pop("budget"), conf


class TrainingBudget:
    """actpack.budget from the start to the end of training, reporting into a directory.

    When ACTPACK_CONF already opened a budget for the whole process at interpreter start, that
    one is used (a second would nest inside it and split the run): it is closed when training
    ends, and its report is written into the directory as well. A later run opens its own.
    """

    def __init__(self, limit, options, caller):
        self._caller = caller
        self._limit, self._options = options_from(limit, options, caller)
        self._budget = None
        self._directory = None
        self.run = None

    @property
    def report_path(self):
        """Where this process's report is (or will be) written; None before training starts."""
        if self._directory is None:
            return None
        return _budget._rank_path(self._options.get("report")
                                  or os.path.join(self._directory, REPORT_NAME))

    def start(self, directory):
        if self._budget is not None:
            self.stop()  # a run that ended without telling (an exception): close it first
        self._directory = os.fspath(directory)
        os.makedirs(self._directory, exist_ok=True)
        self.run = None
        if _env.active() is not None:
            return
        options = dict(self._options)
        options.setdefault("report", os.path.join(self._directory, REPORT_NAME))
        self._budget = actpack.budget(self._limit, **options)
        self.run = self._budget.__enter__()

    def stop(self, error=None):
        """Closes the run's budget and writes its report. Idempotent."""
        if self._budget is not None:
            budget, self._budget = self._budget, None
            budget.__exit__(type(error) if error is not None else None, error, None)
            self.run = budget.run
        elif _env.active() is not None and self._directory is not None:
            self.run = _env.deactivate()
            with open(self.report_path, "w") as f:
                json.dump(self.run.report, f, indent=2)
                f.write("\n")
        elif self._directory is None:
            warnings.warn(f"{self._caller}: training ended before it started; no report",
                          stacklevel=3)


class CallbackMixin:
    """The frameworks' callbacks' common face: built from a budget, `run` and `report_path`;
    `_training` is the TrainingBudget their events start and stop."""

    def __init__(self, limit=None, **options):
        super().__init__()
        self._training = TrainingBudget(limit, options, type(self).__name__)

    @property
    def run(self):
        """The actpack Run of the last training (its `report` once training ended); None
        before."""
        return self._training.run

    @property
    def report_path(self):
        """Where this process's report is (or will be) written; None before training starts."""
        return self._training.report_path
