"""actpack.on_report: callbacks that see every report actpack makes, as it is made."""
import collections

from torch.utils.hooks import RemovableHandle

_observers = collections.OrderedDict()  # weakly referenced by each handle


def on_report(callback):
    """Calls callback(report) with each report actpack makes in this process: a budget's run
    report when its context exits (the dict run.report holds) and a plan's when actpack.plan
    returns (Plan.report). For logging them elsewhere (an experiment tracker) or checking
    them; an exception the callback raises goes to the caller of the exit or the plan. Returns
    a handle whose remove() stops the calls."""
    if not callable(callback):
        raise TypeError(f"actpack.on_report: callback must be callable, got "
                        f"{type(callback).__name__}")
    handle = RemovableHandle(_observers)
    _observers[handle.id] = callback
    return handle


def notify(report):
    """Hands `report` to every callback, in the order they were added."""
    for callback in list(_observers.values()):
        callback(report)
