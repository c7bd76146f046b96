"""Interrupts and misuse (issue 31, item 2): an exception or a KeyboardInterrupt in forward, in
backward and in the optimizer step; a KeyboardInterrupt inside actpack.plan; a budget opened
inside another; budgets in two threads; DataLoader workers forked inside a budget; torch.save in
the middle of a run.

After every budget: no saved-tensor hooks left installed, the CPU allocator and its cap as they
were, the global module hooks removed, and the report (where a path was given) written, naming
the failure when there was one.
"""
import io
import json
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from conftest import report_validator
from test_planner_state import BUDGET as PLAN_BUDGET, differences, state_of, training

STEPS = 3


def process_state():
    """What a budget changes in the process while it is open (and must put back)."""
    module = torch.nn.modules.module
    return {
        "saved_tensors_hooks": torch._C._autograd._top_saved_tensors_default_hooks(False),
        "cpu_allocator_installed": actpack.cpu_allocator_installed(),
        "cpu_cap": actpack.memory_budget("cpu"),
        "forward_hooks": len(module._global_forward_hooks),
        "forward_pre_hooks": len(module._global_forward_pre_hooks),
        "always_called_hooks": len(module._global_forward_hooks_always_called),
        "open_budgets": actpack.budget.open_budgets(),
    }


class Raises(torch.autograd.Function):
    """The identity whose backward raises the error it was given."""

    @staticmethod
    def forward(ctx, x, error):
        ctx.error = error
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise ctx.error


class Trap(nn.Module):
    """The identity, until armed with (where, error): then the step raises `error` there."""

    def __init__(self):
        super().__init__()
        self.armed = None

    def forward(self, x):
        where, error = self.armed or (None, None)
        if where == "forward":
            raise error
        if where == "backward":
            return Raises.apply(x, error)
        if where == "tensor hook":
            x = x * 1
            x.register_hook(lambda grad: (_ for _ in ()).throw(error))
        return x


def model_and_data(seed=0, width=64):
    """A small MLP with a Trap inside, SGD with momentum (state that a half-done step would
    change) and STEPS fixed batches."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, width), nn.Tanh(), Trap(), nn.Linear(width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trap = model[2]

    def step_hook(optimizer, args, kwargs):
        if trap.armed is not None and trap.armed[0] == "optimizer step":
            raise trap.armed[1]

    optimizer.register_step_pre_hook(step_hook)
    gen = torch.Generator().manual_seed(seed + 100)
    batches = [(torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))
               for _ in range(STEPS)]
    return model, optimizer, batches


def train(model, optimizer, batches):
    losses = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def lossless(**options):
    """A budget that packs every saved tensor losslessly: its training is plain training's,
    bit for bit."""
    return actpack.budget(options.pop("limit", "256MiB"), codec="identity", min_bytes=0,
                          **options)


def read_report(path):
    report = json.loads(path.read_text())
    errors = list(report_validator().iter_errors(report))
    assert not errors, [e.message for e in errors[:3]]
    return report


# ---- 1. an exception or a KeyboardInterrupt in forward, backward, the optimizer step ----

@pytest.mark.parametrize("kind", ["RuntimeError", "KeyboardInterrupt"])
@pytest.mark.parametrize("where", ["forward", "backward", "tensor hook", "optimizer step"])
def test_an_error_in_a_step_propagates_and_leaves_nothing_behind(tmp_path, where, kind):
    """The error reaches the caller as it was raised (the same object: type and message), the
    context puts back everything it changed (hooks, allocator, cap, module hooks), its report is
    written and names the error, and a new budget afterwards trains a fresh model exactly as
    plain training does."""
    plain = train(*model_and_data())
    before = process_state()
    error = RuntimeError(f"{where} failed on purpose") if kind == "RuntimeError" \
        else KeyboardInterrupt()

    model, optimizer, batches = model_and_data()
    with pytest.raises(type(error)) as caught:
        with actpack.budget("256MiB", codec="quant2", min_bytes=0,
                            report=tmp_path / "failed.json") as run:
            train(model, optimizer, batches[:1])  # a whole step first: the cap is on
            assert actpack.memory_budget("cpu") == 256 << 20
            model[2].armed = (where, error)
            train(model, optimizer, batches[1:2])
    assert caught.value is error
    assert type(caught.value) is type(error) and str(caught.value) == str(error)

    assert process_state() == before
    assert before["saved_tensors_hooks"] is None
    report = read_report(tmp_path / "failed.json")
    assert report == run.report
    named = f"{kind}: {error}" if str(error) else kind
    assert f"the run stopped on an exception: {named}" in report["run"]["warnings"]
    assert report["activations"]["totals"]["packs"] > 0

    with lossless(report=tmp_path / "after.json") as run:
        after = train(*model_and_data())
    assert after == plain
    assert run.report["activations"]["totals"]["packs"] > 0
    assert not any("exception" in w for w in run.report["run"]["warnings"])
    assert process_state() == before


# ---- 2. a KeyboardInterrupt inside actpack.plan ----

@pytest.mark.parametrize("k", [1, 6], ids=["warm-up step", "capped try"])
def test_a_keyboard_interrupt_inside_plan_restores_the_training(tmp_path, k):
    """plan(restore=True) puts back the model, gradients, optimizer, scheduler and random
    states bit for bit when its k-th call of step() is interrupted; the KeyboardInterrupt
    reaches the caller; the budget the step ran in is closed (hooks, allocator, cap, module
    hooks as before); the report asked for is written and says the plan was interrupted, in
    which step."""
    model, optimizer, scheduler, step = training()
    before = state_of(model, optimizer, scheduler)
    process = process_state()
    interrupt = KeyboardInterrupt()
    calls = [0]

    def interrupted(batch):
        calls[0] += 1
        if calls[0] == k:
            raise interrupt
        step(batch)

    with pytest.raises(KeyboardInterrupt) as caught:
        actpack.plan(interrupted, PLAN_BUDGET, batch_sizes=(4, 8), codecs=("quant2",),
                     progress=False, report=tmp_path / "plan.json")
    assert caught.value is interrupt and calls[0] == k
    assert differences(before, state_of(model, optimizer, scheduler)) == []
    assert process_state() == process

    report = read_report(tmp_path / "plan.json")
    assert "planner" not in report  # no plan was made
    warnings = report["run"]["warnings"]
    assert "the run stopped on an exception: KeyboardInterrupt" in warnings
    assert any(w.startswith("actpack.plan: stopped by KeyboardInterrupt in its step "
                            f"{k} (step(") and "no plan was made" in w for w in warnings), warnings


# ---- 3. a budget opened inside another ----

def test_a_budget_opened_inside_another_governs_until_it_exits(tmp_path):
    """Nesting works: the inner budget packs and caps (its hooks and cap on top) while it is
    open, and when it exits the outer one is as it was (its hooks, its cap, its module hooks,
    its count of the system's memory against the cap) and goes on packing; each report counts
    its own steps, and training is plain training's."""
    plain = train(*model_and_data())
    before = process_state()
    model, optimizer, batches = model_and_data()
    outer_budget = lossless(limit="256MiB", report=tmp_path / "outer.json")
    with outer_budget as outer:
        losses = train(model, optimizer, batches[:1])
        in_outer = process_state()
        packs = outer.totals()["packs"]
        assert actpack.memory.counts_system_memory("cpu")
        with lossless(limit="128MiB", report=tmp_path / "inner.json") as inner:
            assert actpack.memory_budget("cpu") == 128 << 20
            assert actpack.memory.counts_system_memory("cpu")
            assert process_state()["saved_tensors_hooks"] != in_outer["saved_tensors_hooks"]
            losses += train(model, optimizer, batches[1:2])
            assert outer_budget.relieve(1 << 20) == 0  # the inner budget relieves pressure
        assert outer.totals()["packs"] == packs  # the inner budget packed that step
        assert inner.report["activations"]["totals"]["packs"] > 0
        assert process_state() == in_outer
        # The inner budget stopped the count as it exited; the outer one counts again.
        assert actpack.memory.counts_system_memory("cpu")
        losses += train(model, optimizer, batches[2:])
        assert outer.totals()["packs"] > packs
    assert process_state() == before
    assert not actpack.memory.counts_system_memory("cpu")
    assert losses == plain
    assert len(read_report(tmp_path / "outer.json")["activations"]["steps"]) == STEPS - 1
    assert len(read_report(tmp_path / "inner.json")["activations"]["steps"]) == 1


def test_a_budget_cannot_be_entered_twice(tmp_path):
    """A budget is one run: entering it again, inside itself or after it exited, is a clear
    error that changes nothing (the open one goes on, and restores as usual)."""
    before = process_state()
    model, optimizer, batches = model_and_data()
    budget = lossless(report=tmp_path / "r.json")
    with budget:
        train(model, optimizer, batches[:1])
        open_state = process_state()
        with pytest.raises(RuntimeError, match="entered once"):
            with budget:
                pass
        assert process_state() == open_state
        train(model, optimizer, batches[1:])
    assert process_state() == before
    with pytest.raises(RuntimeError, match="entered once"):
        budget.__enter__()
    assert process_state() == before
    assert len(read_report(tmp_path / "r.json")["activations"]["steps"]) == STEPS


# ---- 4. budgets in two threads ----

def test_a_budget_in_a_second_thread_while_one_is_open_is_a_clear_error(tmp_path):
    """The allocator's cap and the module hooks are the process's, so one thread at a time
    runs budgets: a budget entered while another thread's is open raises a RuntimeError naming
    that thread, and changes nothing. The open budget trains on unharmed, the refused thread can
    train plainly meanwhile, and once the first budget exited the second thread opens its own.
    No crash, no hooks left in either thread."""
    plain_first = train(*model_and_data(seed=0))
    plain_second = train(*model_and_data(seed=1, width=48))
    before = process_state()
    opened, refused, closed = threading.Event(), threading.Event(), threading.Event()
    results = {}

    def first():
        try:
            model, optimizer, batches = model_and_data(seed=0)
            with lossless(report=tmp_path / "first.json") as run:
                opened.set()
                refused.wait()
                cap = actpack.memory_budget("cpu")
                losses = train(model, optimizer, batches)
            results["first"] = (losses, cap, process_state()["saved_tensors_hooks"],
                                run.report["activations"]["totals"]["packs"])
        except BaseException as error:  # noqa: BLE001 -- reported by the main thread
            results["first"] = error
        finally:
            opened.set()
            closed.set()

    def second():
        try:
            opened.wait()
            model, optimizer, batches = model_and_data(seed=1, width=48)
            try:
                with lossless(limit="128MiB"):
                    results["second entered"] = True
            except RuntimeError as error:
                results["refusal"] = (str(error), process_state()["saved_tensors_hooks"],
                                      actpack.memory_budget("cpu"))
            finally:
                refused.set()
            plain = train(model, optimizer, batches)  # meanwhile, no budget in this thread
            closed.wait()
            model, optimizer, batches = model_and_data(seed=1, width=48)
            with lossless(report=tmp_path / "second.json") as run:
                packed = train(model, optimizer, batches)
            results["second"] = (plain, packed, process_state()["saved_tensors_hooks"],
                                 run.report["activations"]["totals"]["packs"])
        except BaseException as error:  # noqa: BLE001
            results["second"] = error
        finally:
            refused.set()

    threads = [threading.Thread(target=first, name="first budget"),
               threading.Thread(target=second, name="second budget")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert "second entered" not in results
    message, hooks, cap = results["refusal"]
    assert "open in thread 'first budget'" in message and "one thread at a time" in message
    assert hooks is None and cap == 256 << 20  # the first budget's cap, untouched
    assert not isinstance(results["first"], BaseException), results["first"]
    assert not isinstance(results["second"], BaseException), results["second"]
    losses, cap, hooks, packs = results["first"]
    assert losses == plain_first and cap == 256 << 20 and hooks is None and packs > 0
    plain, packed, hooks, packs = results["second"]
    assert plain == packed == plain_second and hooks is None and packs > 0
    assert process_state() == before
    read_report(tmp_path / "first.json")
    read_report(tmp_path / "second.json")


# ---- 5. DataLoader workers inside a budget ----

class Samples(torch.utils.data.Dataset):
    """Samples made in the worker (their tensors come from the worker's allocator)."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        x = torch.randn(32, generator=torch.Generator().manual_seed(i))
        return x, int(x[:10].argmax())


def test_dataloader_workers_forked_inside_a_budget_work(tmp_path):
    """A DataLoader with two forked workers, iterated (so forked) while the budget is open,
    delivers every batch in order: no deadlock, no crash, and training on them is plain
    training's."""
    loader = torch.utils.data.DataLoader(Samples(), batch_size=16, num_workers=2,
                                         multiprocessing_context="fork")
    batches = list(torch.utils.data.DataLoader(Samples(), batch_size=16))  # in this process
    model, optimizer, _ = model_and_data()
    plain = train(model, optimizer, batches * 2)
    before = process_state()
    model, optimizer, _ = model_and_data()
    with lossless(report=tmp_path / "r.json") as run:
        losses = []
        for _ in range(2):  # each epoch forks its workers anew
            seen = list(loader)
            assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                       for a, b in zip(seen, batches)) and len(seen) == len(batches)
            losses += train(model, optimizer, seen)
    assert losses == plain
    assert run.report["activations"]["totals"]["packs"] > 0
    assert process_state() == before


# ---- 6. torch.save in the middle of a run ----

def test_torch_save_in_the_middle_of_a_budget_run(tmp_path):
    """torch.save of the state dict and of the whole model into a BytesIO works between steps
    and between forward and backward; what was saved loads back equal to the model as it was
    then, and the run's training is plain training's."""
    plain = train(*model_and_data())
    before = process_state()
    model, optimizer, batches = model_and_data()
    saved = []

    def save(when):
        state, whole = io.BytesIO(), io.BytesIO()
        torch.save(model.state_dict(), state)
        torch.save(model, whole)
        saved.append((when, {k: v.clone() for k, v in model.state_dict().items()}, state, whole))

    with lossless(report=tmp_path / "r.json") as run:
        losses = train(model, optimizer, batches[:1])
        save("between steps")
        x, y = batches[1]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        save("between forward and backward")
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        losses += train(model, optimizer, batches[2:])
        state, whole = saved[-1][2], saved[-1][3]
        state.seek(0)
        loaded_inside = torch.load(state)  # loading inside the budget too
    assert losses == plain
    assert run.report["activations"]["totals"]["packs"] > 0
    assert process_state() == before
    assert all(torch.equal(loaded_inside[k], v) for k, v in saved[-1][1].items())
    for when, expected, state, whole in saved:
        state.seek(0)
        whole.seek(0)
        loaded = torch.load(state)
        restored = torch.load(whole, weights_only=False)
        assert loaded.keys() == expected.keys(), when
        assert all(torch.equal(loaded[k], v) for k, v in expected.items()), when
        assert all(torch.equal(restored.state_dict()[k], v) for k, v in expected.items()), when
        fresh, _, _ = model_and_data()
        fresh.load_state_dict(loaded)
        assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), restored.parameters()))
