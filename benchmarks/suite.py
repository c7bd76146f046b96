#!/usr/bin/env python3
"""actpack against PyTorch's own memory tools, side by side on real model shapes.

For each model (ResNet-50, a ViT-B/16-like encoder, a GPT-2-small-like decoder on real text,
a UNet) and each method — plain PyTorch, per-block `torch.utils.checkpoint`,
`torch.autograd.graph.save_on_cpu` (CUDA only), actpack with none / quant2 / division / eb /
auto, actpack auto with torch's per-block checkpointing, and actpack auto with its own
recomputation of the blocks (`recompute="auto"`) — in one run:

  max batch   the largest batch that trains under the budget's cap (real steps, each try in a
              fresh process: the truth, by actpack.search's scan over [2, the size's largest
              batch], every try recorded with its seconds; the smoke size brackets from the
              planner's answer instead), and actpack.plan's estimate and verified answer
  limit       what the budget could hold at best with packing alone: the batch whose allocated
              peak at the harshest codecs fills the budget, from the line through two batches
              near the answer of the part of the model (a block, the stem, the head; forward or
              backward) that allows the fewest (its packed bytes + its working set per sample),
              and how close auto comes to it
  step time   at one batch (the per-block checkpointing's largest), relative to plain
  gradients   per parameter group, cosine and relative norm of the difference against the
              exact gradient at the same weights and batch; and the worst group's cosine at
              each packing method's own max batch (cos @max), where its batch claim holds
  loss        after N steps on the same batches from the same start, against plain

Writes <out>/benchmark.json, <out>/benchmark.svg and prints a table.

  python3 benchmarks/suite.py                    CPU sizes (ResNet-50 and GPT: 21 min, 2 cores)
  python3 benchmarks/suite.py --size smoke       tiny, for the test command
  python3 benchmarks/suite.py --size full --device cuda
"""
import argparse
import contextlib
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import provenance  # noqa: E402

import actpack  # noqa: E402
from actpack import format_bytes, parse_budget, search  # noqa: E402

MiB = 1 << 20

# method -> (actpack codec or None for no actpack, per-block checkpointing, save_on_cpu,
# actpack's recomputation of the blocks: budget(recompute=...))
METHODS = {
    "plain": (None, False, False, False),
    "checkpoint": (None, True, False, False),
    # torch's selective checkpointing per block: matmul, convolution and attention outputs kept.
    "selective_checkpoint": (None, "selective", False, False),
    # bf16 autocast (torch.autocast's documented use: forward and loss inside, backward out).
    "bf16_autocast": (None, False, False, False),
    "save_on_cpu": (None, False, True, False),
    "actpack:none": ("none", False, False, False),
    "actpack:quant2": ("quant2", False, False, False),
    "actpack:division": ("division", False, False, False),
    "actpack:eb": ("eb", False, False, False),
    "actpack:auto": ("auto", False, False, False),
    # auto without its fidelity floor (budget(max_rel_rms=None)): any codec, 2 bits included.
    "actpack:auto,no floor": ("auto", False, False, False),
    # torch's checkpointing inside a budget: its own hooks shadow actpack's in the blocks.
    "actpack:auto+checkpoint": ("auto", True, False, False),
    # actpack's own: the blocks recomputed once the codecs alone cannot hold the step, their
    # inputs packed by the policy (the transformers' blocks in micro-batches of 8 samples).
    "actpack:auto+recompute": ("auto", False, False, "auto"),
    # actpack composed with bf16 autocast: the saved bf16 activations packed by the policy.
    "actpack:auto+bf16": ("auto", False, False, False),
    # torch.compile, and its min-cut partitioner's activation memory budget: the share of the
    # activations the compiled backward may keep, the rest recomputed (0: as few as it can).
    "compile": (None, False, False, False),
    "compile:budget=0.5": (None, False, False, False),
    "compile:budget=0": (None, False, False, False),
    # actpack's policy packing what the compiled graph saves.
    "actpack:auto+compile": ("auto", False, False, False),
}
# torch._functorch.config.activation_memory_budget of the compiled methods.
COMPILED = {"compile": 1.0, "compile:budget=0.5": 0.5, "compile:budget=0": 0.0,
            "actpack:auto+compile": 1.0}
# The methods whose budget takes more options.
BUDGET_OPTIONS = {"actpack:auto,no floor": {"max_rel_rms": None}}
# The methods whose forward runs under bf16 autocast; their gradients are compared with the
# float32 ones, so the cosine says what bf16 itself costs.
BF16 = {"bf16_autocast", "actpack:auto+bf16"}

# Per size: the budget per model, the steps of the loss run (the last two and those after are
# timed), the largest batch searched and the search (actpack.search's strategy): the scan over
# [2, max_batch] for the truth, or the bracket from the planner's answer to a precision.
SETTINGS = {
    # Budgets that hold batches of tens, a coarse search: the machinery in a few minutes.
    "smoke": {"budget": {"resnet50": "10MiB", "vit-b16": "3MiB", "gpt2-small": "8MiB",
                         "unet": "10MiB"},
              "loss_steps": 4, "time_steps": 1, "max_batch": 96, "search": "bracket",
              "precision": 0.25,
              # The planner's estimate only: its verification (tries under the cap) is tested
              # on its own (tests/test_planner_*.py) and was a quarter of the smoke run.
              "verify_plan": False},
    "cpu": {"budget": {"resnet50": "320MiB", "vit-b16": "192MiB", "gpt2-small": "192MiB",
                       "unet": "160MiB"},
            "loss_steps": 8, "time_steps": 3, "max_batch": 1024, "search": "scan"},
    "full": {"budget": {"resnet50": "8GiB", "vit-b16": "8GiB", "gpt2-small": "8GiB",
                        "unet": "8GiB"},
             "loss_steps": 50, "time_steps": 5, "max_batch": 8192, "search": "scan"},
}


# Steps of the gradient measurement at a method's own largest batch, and of auto's search tries.
GRADIENT_STEPS = 6


class Bench:
    def __init__(self, task, device, budget, progress, size, fresh_trials=True):
        self.task, self.device, self.progress, self.size = task, device, progress, size
        self.fresh_trials = fresh_trials
        self.budget_bytes = parse_budget(budget)["bytes"]
        self.initial = task.model(device).state_dict()

    def fresh(self, checkpointed):
        """The model at its initial weights, with an optimizer."""
        model = self.task.model(self.device)
        model.load_state_dict(self.initial)
        model.checkpointed = checkpointed
        return model, self.task.make_optimizer(model)

    def step_fn(self, model, optimizer, offload=False, bf16=False):
        """step(batch, index=0): one training step on batch `index`; returns the loss."""
        def step(batch, index=0, update=True):
            x, y = self.task.batch(batch, index, self.device)
            with (torch.autograd.graph.save_on_cpu(pin_memory=True) if offload
                  else contextlib.nullcontext()), \
                 (torch.autocast(self.device, dtype=torch.bfloat16) if bf16
                  else contextlib.nullcontext()):
                loss = self.task.loss(model(x), y)
            loss.backward()
            if update:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            return loss.item()
        return step

    def context(self, codec, recompute=False, options=None):
        """auto under the budget (what it picks depends on it); a fixed codec packs the same
        under any budget, so it runs uncapped and fits whatever batch plain PyTorch does.
        `options`: more of actpack.budget's (BUDGET_OPTIONS)."""
        if codec is None:
            return in_host_pool() if self.device == "cpu" else contextlib.nullcontext()
        return actpack.budget(self.budget_bytes if codec == "auto" else "100%", codec=codec,
                              recompute=recompute, **(options or {}))

    # ---- max batch under the cap ----

    def fits(self, method, batch):
        """Whether real steps at `batch` train under the budget's cap: in a fresh process
        (a process's memory remembers what ran before: oneDNN's caches, the pool's segments),
        or in this one with --trials in-process (the smoke run)."""
        if self.progress is not None:
            self.progress.set_postfix_str(f"batch {batch}")
        if not self.fresh_trials:
            return self.trial(method, batch)
        return self._in_a_fresh_process("--trial", method, batch)["fits"]

    def gradients_at(self, method, batch):
        """{"gradients": ...} of GRADIENT_STEPS steps of `method` at `batch` (the batch it
        claims), the last against the exact gradient, or {"error": the out-of-memory message}:
        in a fresh process as the search's tries are (with fresh trials), where nothing the run
        measured before holds memory the budget's system count charges (in the suite's process
        the GPT-2's auto+recompute run at its batch ran out with 140 MiB held outside the pool
        by the methods before it)."""
        if self.fresh_trials:
            return self._in_a_fresh_process("--gradients", method, batch)
        return self.gradient_run(method, batch)

    def gradient_run(self, method, batch):
        try:
            return {"gradients": self.train(method, batch, GRADIENT_STEPS, 0)["gradients"]}
        except torch.OutOfMemoryError as e:
            return {"error": str(e).splitlines()[0]}

    def _in_a_fresh_process(self, flag, method, batch):
        """This script with `flag MODEL METHOD BATCH` in its own process: its last line, JSON."""
        argv = [sys.executable, os.path.abspath(__file__), flag, self.task.name, method,
                str(batch), "--size", self.size, "--device", self.device,
                "--budget", str(self.budget_bytes), "--threads", str(torch.get_num_threads())]
        out = subprocess.run(argv, text=True, capture_output=True)
        if out.returncode != 0:
            raise RuntimeError(f"{flag} {method} at batch {batch} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def trial(self, method, batch):
        """One try of the search: a fresh model, a warm-up step that creates the optimizer's
        state in actpack's allocator (so the cap counts it, as it does for a user whose first
        step runs inside the budget, and as the planner warms up), then real steps under the
        cap, up to one capped step after those that may lift it before the policy's first
        plan."""
        codec, checkpointed, offload, recompute = METHODS[method]
        model, optimizer = self.fresh(checkpointed)
        # save_on_cpu's tries offload too (they had not: its max batch repeated plain's).
        step = self.step_fn(compiled(model, method), optimizer, offload, method in BF16)
        warm_up(step)
        # auto's tries run as many steps as the gradient run at the batch the table claims (6,
        # below): a 3-step try passed ResNet-50's auto at 101 whose 6-step run then ran out.
        # Under recompute="auto", as many more as the switch to recomputation may lift the cap
        # in (actpack.search.capped_from, the run's own rule).
        codec = codec or "none"
        steps = (GRADIENT_STEPS if codec == "auto" else 2) + (
            search.capped_from(codec, recompute) - search.capped_from(codec))
        return search.trains_under_cap(step, self.budget_bytes, batch, codec=codec,
                                       steps=steps, recompute=recompute,
                                       **BUDGET_OPTIONS.get(method, {})) is not None

    def largest_batch(self, method, ceiling, strategy, guess=None, precision=0.0):
        """The largest batch in [2, ceiling] that trains under the cap (0 if none), by
        actpack.search.largest_batch: the scan over the whole range (the truth; no guess), or
        the bracket from `guess` to within `precision` (a fraction of it; the smoke run's
        machinery). Batch 1 is left out: batch norm needs two samples. Returns max_batch,
        max_batch_upper (the largest batch not shown not to fit above it) and the search:
        its strategy, range, every try with its seconds, and its cost."""
        found = search.largest_batch(
            lambda batch: self.fits(method, batch), 2, max(2, ceiling), strategy=strategy,
            start=None if strategy == search.SCAN else guess, precision=precision)
        record = found.as_dict()
        for t in record["tries"]:
            t["seconds"] = round(t["seconds"], 1)
        return {"max_batch": found.batch, "max_batch_upper": found.upper, "search": record}

    def plan(self, batch_sizes, verify=True):
        model, optimizer = self.fresh(False)
        # The planner runs tens of steps at its batches; at learning rate 0 they leave the
        # weights where they are (the memory is the same), which 2-bit noise over that many
        # steps otherwise drives to NaN in the ResNet-50.
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        p = actpack.plan(self.step_fn(model, optimizer), self.budget_bytes,
                         batch_sizes=batch_sizes, verify=verify, progress=False)
        return {"estimate": {name: c["max_batch_size"] for name, c in p.choices.items()},
                "fixed_bytes": {name: c["fixed_bytes"] for name, c in p.choices.items()},
                "per_sample_bytes": {name: c["per_sample_bytes"]
                                     for name, c in p.choices.items()},
                "verified_auto": p.verified["batch_size"] if p.verified else None}

    # ---- the limit ----

    def limit(self, plan, batch):
        """What the budget could hold at best with packing alone: the largest batch whose
        allocated bytes fit the budget at the harshest codecs, with nothing for fragmentation
        or memory outside the pool. Measured in the model: per block, and for what runs before
        the blocks (a stem, an embedding) and after them (the head and the loss), the allocated
        peak while it runs forward and while it runs backward at `batch` and twice it; the line
        through the two (per sample: the slope; fixed: the weights, their gradients and the
        optimizer's state) gives the batch that fills the budget, and the part that allows the
        smallest is the limit. Of a sample's bytes there, the packed bytes alive (everything
        before the part in forward; up to and with it in backward) are reported apart from
        the rest, the part's working set."""
        # Between half the planner's batch and the planner's batch: a sample costs what it does
        # near the answer there (the ResNet-50's peak grew 1.02 MiB a sample from 8 to 16 and
        # 1.23-1.33 from 16 up: oneDNN's buffers and batch norm's temporaries grow faster).
        batch = max(batch, (plan["estimate"].get("auto") or 0) // 2)
        model, optimizer = self.fresh(False)
        step = self.step_fn(model, optimizer)
        warm_up(step, batch)
        (low, packed), (high, _) = (self.part_peaks(model, step, batch),
                                    self.part_peaks(model, step, 2 * batch))
        best = None
        for (where, part), peak in high.items():
            need = (peak - low[(where, part)]) / batch
            if need <= 0:
                continue
            fixed = peak - need * 2 * batch  # the line's batch-independent bytes
            fits = int((self.budget_bytes - fixed) / need)
            if best is None or fits < best["batch"]:
                best = {"per_sample_bytes": need, "fixed_bytes": fixed, "batch": fits,
                        "worst": {"block": part, "pass": where,
                                  "packed_per_sample_bytes": packed[(where, part)],
                                  "working_set_per_sample_bytes": need - packed[(where, part)]}}
        return best

    def part_peaks(self, model, step, batch):
        """In one step at `batch` under the harshest codecs (auto under a budget it cannot
        meet, as the planner profiles it), per part ("forward" | "backward", block index,
        BEFORE or AFTER): the allocated peak while it runs, and the packed bytes per sample
        alive then (everything before it in forward; up to and with it in backward). A
        block's backward runs from its output's gradient to its input's, which is the gradient
        of the block before's output; what runs after the blocks, from the last one's end
        through the loss and back to the last one's output gradient; what runs before them,
        to the end of the step (the optimizer's step adds nothing per sample)."""
        memory = actpack.memory
        peaks, running, run_ref = {}, [None], []
        packed = {("forward", BEFORE): 0.0}
        live = lambda: run_ref[0].totals()["live_stored_bytes"] / batch  # noqa: E731

        def observe():
            # The peak so far belongs to what is running.
            if running[0] is not None:
                peaks[running[0]] = max(peaks.get(running[0], 0),
                                        memory.max_memory_allocated(self.device))

        def mark(what):
            observe()
            running[0] = what
            memory.reset_peak_memory_stats(self.device)

        blocks = _blocks(model)
        # What runs before the blocks is read as each of its weights gets its gradient, and at
        # the step's end (with the optimizer's step, which adds nothing per sample).
        in_blocks = {id(p) for block in blocks for p in block.parameters()}
        outside = [p for p in model.parameters() if id(p) not in in_blocks]

        def forward_pre_hook(i):
            def hook(module, args):
                mark(("forward", i))
                packed[("forward", i)] = live()
                if i == 0:
                    packed[("backward", BEFORE)] = packed[("forward", i)]
            return hook

        def forward_hook(i):
            def hook(module, args, out):
                mark(("forward", AFTER) if i == len(blocks) - 1 else None)
                packed[("backward", i)] = after = live()
                if i == len(blocks) - 1:
                    packed[("forward", AFTER)] = packed[("backward", AFTER)] = after
                if out.requires_grad:
                    out.register_hook(lambda g: mark(("backward", i)))
                if i == 0 and args[0].requires_grad:
                    args[0].register_hook(lambda g: mark(("backward", BEFORE)))
            return hook

        hooks = [p.register_post_accumulate_grad_hook(lambda p: observe()) for p in outside]
        for i, block in enumerate(blocks):
            hooks.append(block.register_forward_pre_hook(forward_pre_hook(i)))
            hooks.append(block.register_forward_hook(forward_hook(i)))
        try:
            with actpack.budget(1, codec="auto", min_bytes="64KiB") as run:
                run_ref.append(run)
                mark(("forward", BEFORE))
                step(batch)
                mark(None)
        finally:
            for h in hooks:
                h.remove()
        return peaks, packed

    # ---- time, gradients, loss ----

    def train(self, method, batch, steps, time_steps):
        """`steps` steps from the initial weights on batches 0..steps-1 (the first a warm-up
        creating the optimizer's state); the gradients of the last against the exact ones at
        the same weights; the median time of the `time_steps` steps before the last."""
        codec, checkpointed, offload, recompute = METHODS[method]
        model, optimizer = self.fresh(checkpointed)
        step = self.step_fn(compiled(model, method), optimizer, offload, method in BF16)
        # The first step (batch 0) warms up as the max-batch search does (the optimizer's state in
        # actpack's allocator), in every method alike.
        losses, times = [warm_up(step, batch)], []
        with self.context(codec, recompute, BUDGET_OPTIONS.get(method)):
            for i in range(1, steps - 1):
                start = time.perf_counter()
                losses.append(step(batch, i))
                if i >= steps - 1 - time_steps:
                    times.append(time.perf_counter() - start)
            losses.append(step(batch, steps - 1, update=False))
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                 if p.grad is not None}
        optimizer.zero_grad(set_to_none=True)
        model.checkpointed = False
        state = copy.deepcopy(model.state_dict())  # BN running stats move on a forward
        self.step_fn(model, optimizer)(batch, steps - 1, update=False)
        model.load_state_dict(state)
        exact = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return {"losses": losses, "step_seconds": statistics.median(times) if times else None,
                "step_seconds_each": times,
                "gradients": gradient_error(grads, exact, models.parameter_groups(model))}


# The parts of a model the limit measures besides its blocks.
BEFORE, AFTER = "before the blocks", "after the blocks"


def _blocks(model):
    if hasattr(model, "blocks"):
        return list(model.blocks)
    return list(model.down) + list(model.up)


def _part(block):
    return f"block {block}" if isinstance(block, int) else block


@contextlib.contextmanager
def in_host_pool():
    """PyTorch's own methods' steps in actpack's host pool, uncapped, as the budget rows' steps
    are, so that time compares on one allocator: under glibc's malloc they paid page faults the
    pool does not (`none` ran at 0.48-0.64x plain's time). Only around the steps: the weights,
    built before, stay outside the pool, as the budget rows' do (a budget counts what the step
    allocates, not the weights)."""
    installed_here = not actpack.cpu_allocator_installed()
    if installed_here:
        actpack.install_cpu_allocator()
    try:
        yield
    finally:
        if installed_here:
            actpack.uninstall_cpu_allocator()


def default_methods(named, compile_too):
    """The methods a run measures: those `named`, else all but the compiled ones, which
    compile each try's model afresh (a minute a model on 2 cores) unless `compile_too`."""
    return [m for m in METHODS if m in (named or [])
            or not named and (m not in COMPILED or compile_too)]


def compiled(model, method):
    """`model` as `method` runs it: torch.compile'd (dynamic batch, so the tries' batch sizes
    share one graph) under its activation memory budget, or as it is. The gradients and the
    exact reference read the parameters of `model` itself."""
    if method not in COMPILED:
        return model
    import torch._dynamo
    import torch._functorch.config
    torch._dynamo.reset()  # a graph compiled under another method's budget is not reused
    torch._functorch.config.activation_memory_budget = COMPILED[method]
    return torch.compile(model, dynamic=True)


def warm_up(step, batch=2):
    """One step under a budget that caps nothing and packs nothing: what it allocates to stay
    (the optimizer's state) comes from actpack's allocator, which every later budget counts."""
    with actpack.budget("100%", codec="none"):
        return step(batch)


def gradient_error(grads, exact, groups):
    """Per group: cosine between the flattened gradients and |g - exact| / |exact|."""
    out = {}
    for group in dict.fromkeys(groups.values()):
        names = [n for n in exact if groups[n] == group and n in grads]
        if not names:
            continue
        g = torch.cat([grads[n].flatten().double() for n in names])
        e = torch.cat([exact[n].flatten().double() for n in names])
        norm = e.norm().item()
        out[group] = {"cosine": torch.nn.functional.cosine_similarity(g, e, 0).item()
                      if norm else 1.0,
                      "relative_norm": (g - e).norm().item() / norm if norm else 0.0}
    return out


def run(args, save=lambda results: None):
    from tqdm import tqdm

    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    settings = SETTINGS[args.size]
    tasks = [t for t in models.tasks(args.size) if not args.models or t.name in args.models]
    methods = default_methods(args.methods, args.compile)
    if args.device != "cuda":
        methods = [m for m in methods if not METHODS[m][2]]  # save_on_cpu offloads device memory
    else:
        actpack.install_allocator()
    stages = len(tasks) * (2 + 2 * len(methods))
    progress = tqdm(total=stages, desc="actpack benchmarks", unit="stage", file=sys.stderr,
                    disable=args.quiet)
    results = {**provenance.record(), "machine": machine(args), "size": args.size,
               "search": settings["search"], "models": {}}
    # --max-batch-from: the searches of an earlier run (fresh processes each, the slow part),
    # taken as they are for the methods it searched; the rest of the run is measured anew.
    # An interrupted run resumes from its own file: each search is saved as it ends.
    searched, source = {}, None
    if args.max_batch_from:
        with open(args.max_batch_from) as f:
            earlier_run = json.load(f)
        searched = earlier_run["models"]
        source = {"file": args.max_batch_from,
                  **{k: earlier_run.get(k) for k in ("commit", "dirty", "date", "command")}}
    for task in tasks:
        budget = args.budget or settings["budget"][task.name]
        bench = Bench(task, args.device, budget, progress, args.size,
                      fresh_trials=args.trials == "fresh")
        model = bench.fresh(False)[0]
        entry = {"budget_bytes": bench.budget_bytes, "parameters": models.param_count(model),
                 "methods": {}}
        del model
        progress.set_description(f"{task.name}: plan")
        entry["plan"] = bench.plan(settings.get("plan_batches", (2, 4)),
                                   verify=settings.get("verify_plan", True))
        progress.update()
        if args.limit_only:
            entry["limit"] = bench.limit(entry["plan"], 8)
            results["models"][task.name] = entry
            continue
        results["models"][task.name] = entry
        earlier = searched.get(task.name, {}).get("methods", {})
        for method in methods:
            progress.set_description(f"{task.name}: {method} max batch")
            if (method in earlier and earlier[method].get("max_batch") is not None
                    and method not in (args.search_again or ())):
                entry["methods"][method] = {
                    k: earlier[method][k] for k in ("max_batch", "max_batch_upper", "search")
                    if k in earlier[method]}
                # Where it was searched: the earlier file's own source when it took it too.
                entry["methods"][method]["max_batch_from"] = (
                    earlier[method].get("max_batch_from") or source)
            elif settings["search"] == search.SCAN:
                # The truth: the whole range, independent of the planner's answers.
                entry["methods"][method] = bench.largest_batch(
                    method, settings["max_batch"], search.SCAN)
            else:
                # From the planner's answer for the method's own choice (auto+recompute's is
                # its own: from auto's, the search bracketed below where recomputation pays).
                codec, recompute = METHODS[method][0] or "none", METHODS[method][3]
                estimates = entry["plan"]["estimate"]
                guess = estimates.get(f"{codec}+recompute" if recompute == "auto" else codec,
                                      estimates.get(codec, 8))
                entry["methods"][method] = bench.largest_batch(
                    method, settings["max_batch"], search.BRACKET, guess=guess,
                    precision=settings["precision"])
            save(results)
            progress.update()
            gc.collect()
        plain = entry["methods"].get("plain", {}).get("max_batch")
        batch = max(1, entry["methods"].get("checkpoint", {}).get("max_batch") or plain or 2)
        entry["time_batch"] = batch
        progress.set_description(f"{task.name}: limit")
        entry["limit"] = bench.limit(entry["plan"], min(batch, 8))
        progress.update()
        for method in methods:
            progress.set_description(f"{task.name}: {method} at batch {batch}")
            try:
                entry["methods"][method].update(
                    bench.train(method, batch, settings["loss_steps"], settings["time_steps"]))
            except torch.OutOfMemoryError as e:  # plain without a cap fits; a capped one may not
                entry["methods"][method]["error"] = str(e).splitlines()[0]
            progress.update()
            gc.collect()
        # The gradients at the batch each packing method claims (auto packs harder there than
        # at the shared batch above): GRADIENT_STEPS steps, the last (after auto's first plans,
        # as in training) against the exact gradient.
        for method in methods:
            m = entry["methods"][method]
            own = m.get("max_batch")
            if METHODS[method][0] in (None, "none") or not own or own == batch:
                continue  # nothing lossy, or measured above
            progress.set_description(f"{task.name}: {method} gradients at batch {own}")
            measured = bench.gradients_at(method, own)
            if "error" in measured:
                m["gradients_at_max_batch_error"] = measured["error"]
            else:
                m["gradients_at_max_batch"] = measured["gradients"]
            gc.collect()
        save(results)
    progress.close()
    return results


def alone(args):
    """--trial MODEL METHOD BATCH (one try of the search; prints {"fits": ...}) or --gradients
    MODEL METHOD BATCH (the gradient run at a method's claimed batch; prints Bench.gradient_run's
    answer), alone in this process."""
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    else:
        actpack.install_allocator()
    name, method, batch = args.trial or args.gradients
    task = next(t for t in models.tasks(args.size) if t.name == name)
    bench = Bench(task, args.device, int(args.budget), None, args.size, fresh_trials=False)
    if args.trial:
        print(json.dumps({"fits": bench.trial(method, int(batch))}))
    else:
        print(json.dumps(bench.gradient_run(method, int(batch))))


def machine(args):
    """provenance.machine's record (CPU model, cores, threads, torch, Python, the GPU), with
    the device the suite ran on and actpack's version."""
    return {"device": args.device, "actpack": actpack.__version__,
            **provenance.machine(args.device)}


def summarize(results):
    """Per model and method, the figures of the table."""
    rows = []
    for name, entry in results["models"].items():
        methods = entry["methods"]
        plain = methods.get("plain", {})
        for method, m in methods.items():
            row = {"model": name, "method": method, "max_batch": m.get("max_batch"),
                   "error": m.get("error")}
            for base in ("plain", "checkpoint"):
                b = methods.get(base, {}).get("max_batch")
                row[f"vs_{base}"] = m["max_batch"] / b if b else None
            if m.get("step_seconds") and plain.get("step_seconds"):
                row["time_vs_plain"] = m["step_seconds"] / plain["step_seconds"]
                if m.get("step_seconds_each"):  # each timed step over plain's median
                    row["time_vs_plain_range"] = [min(m["step_seconds_each"]) /
                                                  plain["step_seconds"],
                                                  max(m["step_seconds_each"]) /
                                                  plain["step_seconds"]]
            if "gradients" in m:
                g = m["gradients"].values()
                row["min_cosine"] = min(x["cosine"] for x in g)
                row["max_relative_norm"] = max(x["relative_norm"] for x in g)
            # At the method's own max batch: the gradients where its batch claim holds.
            g = m.get("gradients_at_max_batch", m.get("gradients") if
                      m.get("max_batch") == entry.get("time_batch") else None)
            if g:
                row["min_cosine_at_max_batch"] = min(x["cosine"] for x in g.values())
            if m.get("losses") and plain.get("losses"):
                row["final_loss"] = m["losses"][-1]
                row["loss_vs_plain"] = m["losses"][-1] - plain["losses"][-1]
            rows.append(row)
    return rows


def table(results):
    def f(value, spec):
        return "-" if value is None else format(value, spec)

    lines = []
    for name, entry in results["models"].items():
        plan, limit = entry["plan"], entry["limit"]
        auto = entry["methods"].get("actpack:auto", {}).get("max_batch")
        recomputed = entry["methods"].get("actpack:auto+recompute", {}).get("max_batch")
        lines.append(
            f"\n{name}: {entry['parameters'] / 1e6:.1f}M parameters, budget "
            f"{format_bytes(entry['budget_bytes'])}; planner (auto) estimate "
            f"{plan['estimate'].get('auto')}, verified "
            f"{'-' if plan['verified_auto'] is None else plan['verified_auto']}; limit "
            f"{limit['batch']} (fixed {format_bytes(limit['fixed_bytes'])}, at most "
            f"{format_bytes(limit['per_sample_bytes'])}/sample: {_part(limit['worst']['block'])}"
            f", {limit['worst']['pass']}, packed "
            f"{format_bytes(limit['worst']['packed_per_sample_bytes'])} + working set "
            f"{format_bytes(limit['worst']['working_set_per_sample_bytes'])})"
            + (f"; auto reaches {auto / limit['batch']:.0%} of it" if auto and limit["batch"]
               else "")
            + (f", auto+recompute (past packing alone) {recomputed / limit['batch']:.0%}"
               if recomputed and limit["batch"] else ""))
        lines.append(f"  {'method':<24}{'max batch':>10}{'x plain':>9}{'x ckpt':>8}"
                     f"{'time @' + str(entry.get('time_batch', '-')):>10}{'grad cos':>10}"
                     f"{'grad err':>10}{'loss':>8}{'vs plain':>10}{'cos @max':>10}")
        for row in (r for r in summarize(results) if r["model"] == name):
            lines.append(
                f"  {row['method']:<24}{f(row['max_batch'], 'd'):>10}"
                f"{f(row.get('vs_plain'), '.2f'):>9}{f(row.get('vs_checkpoint'), '.2f'):>8}"
                f"{f(row.get('time_vs_plain'), '.2f'):>10}{f(row.get('min_cosine'), '.4f'):>10}"
                f"{f(row.get('max_relative_norm'), '.3f'):>10}{f(row.get('final_loss'), '.3f'):>8}"
                f"{f(row.get('loss_vs_plain'), '+.3f'):>10}"
                f"{f(row.get('min_cosine_at_max_batch'), '.4f'):>10}"
                + (f"  ({row['error']})" if row.get("error") else ""))
    return "\n".join(lines)


def picture(results, path):
    """Max batch relative to plain, per model and method, as an SVG bar chart."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summarize(results)
    names = list(results["models"])
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(names) + 2), 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = [next((r.get("vs_plain") or 0 for r in rows
                        if r["model"] == n and r["method"] == method), 0) for n in names]
        ax.bar([k + i * width for k in range(len(names))], values, width, label=method)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(names))], names)
    ax.set_ylabel("largest batch under the budget / plain")
    ax.set_title(f"actpack benchmarks ({results['machine']['device']}, "
                 f"{results['size']} sizes)")
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SETTINGS), default="cpu",
                        help="model and input sizes: cpu (default), full (GPU sizes), smoke")
    parser.add_argument("--full", dest="size", action="store_const", const="full",
                        help="the GPU sizes (same as --size full)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="*", help="a subset of the models")
    parser.add_argument("--methods", nargs="*", choices=list(METHODS),
                        help="a subset of the methods")
    parser.add_argument("--max-batch-from", metavar="RESULTS",
                        help="take each method's largest batch from this earlier "
                             "benchmark.json (its search) instead of searching again; an "
                             "interrupted run's own file resumes it")
    parser.add_argument("--search-again", nargs="*", metavar="METHOD", choices=list(METHODS),
                        help="with --max-batch-from: these methods are searched anew (what "
                             "changed since that run)")
    parser.add_argument("--compile", action="store_true",
                        help="also the torch.compile methods (compile, its activation memory "
                             "budget at 0.5 and 0, actpack auto inside the compiled model)")
    parser.add_argument("--budget", help="one budget for every model (default: per model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmark-results")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--limit-only", action="store_true",
                        help="only the planner's estimates and the limit (a quick look)")
    parser.add_argument("--trials", choices=["fresh", "in-process"], default="fresh",
                        help="each try of the max-batch search in a fresh process (default; "
                             "the truth) or in this one (faster, for the smoke run)")
    parser.add_argument("--picture", nargs="+", metavar="RESULTS",
                        help="only draw the bar chart of these benchmark.json files, merged, "
                             "to OUT/benchmark.svg (docs/results.md's picture from its result files)")
    parser.add_argument("--trial", nargs=3, metavar=("MODEL", "METHOD", "BATCH"),
                        help=argparse.SUPPRESS)  # one try of the search, in its own process
    parser.add_argument("--gradients", nargs=3, metavar=("MODEL", "METHOD", "BATCH"),
                        help=argparse.SUPPRESS)  # the gradient run at a claimed batch, likewise
    args = parser.parse_args(argv)
    if args.picture:
        merged = None
        for path in args.picture:
            with open(path) as f:
                data = json.load(f)
            merged = merged or {"machine": data["machine"], "size": data["size"], "models": {}}
            for name, entry in data["models"].items():  # a second run of a model adds methods
                if name in merged["models"]:
                    if entry["budget_bytes"] != merged["models"][name]["budget_bytes"]:
                        raise SystemExit(f"--picture: {path} ran {name} under another budget "
                                         "than an earlier file; expected the same")
                    for method, m in entry["methods"].items():
                        merged["models"][name]["methods"].setdefault(method, m)
                else:
                    merged["models"][name] = entry
        os.makedirs(args.out, exist_ok=True)
        picture(merged, os.path.join(args.out, "benchmark.svg"))
        print(f"wrote {args.out}/benchmark.svg from {len(args.picture)} result files")
        return None
    if args.trial or args.gradients:
        alone(args)
        return None
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    os.makedirs(args.out, exist_ok=True)

    def save(results):
        results["rows"] = summarize(results)
        with open(os.path.join(args.out, "benchmark.json"), "w") as f:
            json.dump(results, f, indent=2)

    results = run(args, save)
    save(results)
    picture(results, os.path.join(args.out, "benchmark.svg"))
    print(f"actpack benchmarks on {results['machine']['cpu']} "
          f"({results['machine']['threads']} threads), torch {results['machine']['torch']}, "
          f"{args.size} sizes")
    print(table(results))
    print(f"\nwrote {args.out}/benchmark.json and {args.out}/benchmark.svg")
    return results


if __name__ == "__main__":
    main()
