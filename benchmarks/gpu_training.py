#!/usr/bin/env python3
"""Training on the GPU under a fixed device budget: the largest batch each method trains, its
gradients against exact training, auto's step time against plain's, and the host waits and
device allocations per step at the cap. The GPU check's training stage (tools/gpu_check.sh).

Models: the suite's ResNet-50 at 224 x 224 and its GPT-2-small-like LM (benchmarks/models.py,
`tasks("full")`), float32 with TF32 matrix products (`--matmul-precision high`, recorded).
Methods, each under an 8 GiB cap on the device (`--budget`):

  plain           torch's caching allocator, capped with torch.cuda.set_per_process_memory_fraction
  checkpoint      the same, every block in non-reentrant torch.utils.checkpoint
  selective       the same, each block in selective checkpointing (benchmarks/models.py's policy:
                  matrix products, convolutions and attention saved, the rest recomputed)
  save_on_cpu     the same, saved tensors in pinned host memory (torch.autograd.graph.save_on_cpu)
  auto            actpack's allocator (install_allocator before CUDA starts), actpack.budget(cap,
                  codec="auto") at the default fidelity floor
  auto+recompute  the same with recompute="auto" (the models' blocks are actpack.recompute regions)

actpack's allocator has to be installed before CUDA starts, so the methods run in two worker
processes, one per allocator, started together (their start-up overlaps) and driven one request
at a time (never two on the device at once: actpack's budget counts the device's used memory
above its value at the budget's start, which another process's growth would change). Each try
of the search runs in the worker as a user's first steps do: the model at its initial weights,
a new optimizer whose state a step at batch 2 creates, then real steps at the batch under the
cap (2 for PyTorch's methods; 5 for auto and 7 for auto+recompute, whose first 2 and 4 steps
may go over the cap to measure, as benchmarks/suite.py counts them: 3 capped steps follow). The
last step's gradients (no update)
are kept on the host for the largest batch that fitted; the worst parameter group's cosine is
taken against the exact gradients at the same weights and batch, computed uncapped with
per-block checkpointing (the same arithmetic, recomputed, so it fits any batch).

The search per method: from a guess (a line through two small batches' peaks for PyTorch's
methods; ratios of the answers before for actpack's), up by 1.5x until a try runs out (or down
until one fits), then bisection to --precision. Every try is recorded (batch, outcome, seconds,
peaks). Time: --time-limit is shared among the jobs by their weights (JOBS), the core jobs (the
figures the GPU issue checks) first, the extra ones on what those leave; a job that finishes
early leaves its time to those after it, a try that would not fit in what is left is not
started, and a request unanswered well past its time is stopped as hung (its stacks dumped) and
its worker restarted.
Step time: at the batch both auto and per-block checkpointing train (the smaller of their
largest), plain uncapped and auto under the cap take turns step by step for --rounds rounds,
then actpack's `none` (the hooks and accounting, nothing packed, on actpack's allocator) for as
many. Waits and allocations: torch.profiler's CUDA API trace, step by step from the first, of
auto at its largest batch (its profile steps and first plan included) and of plain at its own.

    python3 benchmarks/gpu_training.py --json training.json          # on a GPU (8 GiB, ~150 s)
    python3 benchmarks/gpu_training.py --device cpu --size smoke     # the plumbing on a CPU

On the CPU (a dry run) PyTorch's methods are capped by actpack's host pool, as torch has no cap
of its own there, and save_on_cpu is left out.
"""
import argparse
import collections
import contextlib
import gc
import json
import os
import platform
import selectors
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROTOCOL = "@@gpu_training@@ "
GiB = 1 << 30

# method -> how it runs: which worker (allocator), checkpointing, offload, actpack's options.
METHODS = {
    "plain": {"kind": "torch"},
    "checkpoint": {"kind": "torch", "checkpointed": True},
    "selective": {"kind": "torch", "checkpointed": "selective"},
    "save_on_cpu": {"kind": "torch", "offload": True},
    "auto": {"kind": "actpack", "codec": "auto", "recompute": False},
    "auto+recompute": {"kind": "actpack", "codec": "auto", "recompute": "auto"},
}
# Steps of a try at the batch, after the warm-up at batch 2: PyTorch's methods 2; auto's first
# two may lift the cap to measure, auto+recompute's first four (benchmarks/suite.py counts them
# so), and three capped steps follow.
TRY_STEPS = {"plain": 2, "checkpoint": 2, "selective": 2, "save_on_cpu": 2, "auto": 5,
             "auto+recompute": 7}

# The jobs in the order they run, each with its weight (about the seconds it takes on an H100)
# and its tier: the "core" jobs (the figures the issue checks) share the time limit among
# themselves, and the "extra" ones share what the core jobs leave.
JOBS = [
    ("search", "resnet50", "plain", 3, "core"),
    ("search", "resnet50", "checkpoint", 3, "core"),
    ("search", "resnet50", "auto", 15, "core"),
    ("search", "gpt2-small", "plain", 3, "core"),
    ("search", "gpt2-small", "checkpoint", 6, "core"),
    ("search", "gpt2-small", "selective", 4, "core"),
    ("search", "gpt2-small", "auto", 8, "core"),
    ("search", "gpt2-small", "auto+recompute", 35, "core"),
    ("timing", "resnet50", None, 7, "core"),
    ("timing", "gpt2-small", None, 9, "core"),
    ("profile", "resnet50", None, 6, "core"),
    ("profile", "gpt2-small", None, 4, "core"),
    ("search", "resnet50", "auto+recompute", 20, "extra"),
    ("search", "resnet50", "selective", 4, "extra"),
    ("search", "gpt2-small", "save_on_cpu", 12, "extra"),
    ("search", "resnet50", "save_on_cpu", 12, "extra"),
]

# Per size: the budget per model, the search's ceiling, the probes of the first guess.
SIZES = {
    "full": {"budget": {"resnet50": "8GiB", "gpt2-small": "8GiB"}, "ceiling": 4096,
             "probes": {"resnet50": (4, 8), "gpt2-small": (2, 4)}},
    "smoke": {"budget": {"resnet50": "10MiB", "gpt2-small": "8MiB"}, "ceiling": 256,
              "probes": {"resnet50": (2, 4), "gpt2-small": (2, 4)}},
}
# A blocking call of the CUDA runtime (benchmarks/gpu_sync.py's list), and the device allocations.
WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
         "cudaFree", "cudaFreeHost", "cudaMalloc", "cudaHostAlloc")
ALLOCATIONS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cuMemCreate",
               "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemAddressReserve",
               "cuMemAddressFree", "cuMemSetAccess")


# ---------------------------------------------------------------- the search (driver side) ----

class Stop(Exception):
    """Ends a search early: `status` says why ("time", "hang", "error", "crashes")."""

    def __init__(self, status, message=""):
        super().__init__(message)
        self.status, self.message = status, message


# Outcomes of a try that mean "does not train at this batch". A crash or a CUDA error after
# running out also counts (the worker is restarted), at most MAX_CRASHES times per search.
NOT_FITTING = ("oom", "oom_as_runtime_error", "crash", "cuda_error")
MAX_CRASHES = 3


def shared_search():
    """actpack.search, loaded from its source file: it imports nothing from the package, and
    importing actpack would import torch into the driver (seconds of its time limit)."""
    import importlib.util

    module = sys.modules.get("actpack.search") or sys.modules.get("_actpack_search")
    if module is None:
        path = os.path.join(ROOT, "torch_plugin", "python", "actpack", "search.py")
        spec = importlib.util.spec_from_file_location("_actpack_search", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["_actpack_search"] = module
        spec.loader.exec_module(module)
    return module


def search(fits, guess, ceiling, precision=0.05, floor=2, growth=1.5):
    """The largest batch in [floor, ceiling] for which `fits(batch)` says "fits":
    actpack.search.largest_batch's bracket (the fast search; fits are not monotone in the batch,
    so its answer is a batch that trains below one that does not, not a scan's truth).

    `fits` returns an outcome ("fits", or one of NOT_FITTING) or raises Stop. From `guess`: up
    by `growth`, then by 2 at each step, while it fits (down likewise while it does not: a
    guess near the answer costs few tries, a far one not many more), then bisection until the
    gap between the largest batch that fitted and the smallest that did not is at most
    `precision` of the former. A hang, an outcome that is none of those, or more than
    MAX_CRASHES crashes stop it. Returns {"max_batch", "max_batch_upper", "status", "tries"}:
    max_batch 0 when nothing fitted; max_batch_upper the largest batch not shown to fail; status
    "done", "ceiling" (the ceiling fitted), or the Stop's; tries {"batch", "outcome"} in order,
    and {"stopped", "message"} where a Stop with a message ended it."""
    shared = shared_search()
    outcomes, crashes = [], [0]

    def attempt(batch):
        try:
            outcome = fits(batch)
        except Stop as stop:
            raise shared.Stop(stop.status, stop.message) from None
        outcomes.append(outcome)
        if outcome == "fits":
            return True
        if outcome in ("crash", "cuda_error"):
            crashes[0] += 1
            if crashes[0] > MAX_CRASHES:
                raise shared.Stop("crashes", f"{crashes[0]} tries crashed the worker")
        elif outcome == "hang":
            raise shared.Stop("hang")
        elif outcome not in NOT_FITTING:
            raise shared.Stop("error", f"a try ended in {outcome!r}")
        return False

    found = shared.largest_batch(attempt, floor, max(floor, ceiling), strategy="bracket",
                                 start=guess, up=(growth, 2.0), down=(growth, 2.0),
                                 precision=precision)
    tries, answered = [], iter(outcomes)
    for record in found.tries:
        if "stopped" not in record:
            tries.append({"batch": record["batch"], "outcome": next(answered)})
            continue
        outcome = next(answered, None)  # the worker answered before the outcome stopped it
        if outcome is not None:
            tries.append({"batch": record["batch"], "outcome": outcome})
        if record["message"]:
            tries.append({"stopped": record["stopped"], "message": record["message"]})
    return {"max_batch": found.batch, "max_batch_upper": found.upper, "status": found.status,
            "tries": tries}


def allowance(remaining_seconds, weight, weights_left):
    """A job's share of the time that is left: its weight among those of its tier not yet run."""
    if weights_left <= 0:
        return max(0.0, remaining_seconds)
    return max(0.0, remaining_seconds) * weight / weights_left


def round_stats(values):
    """Median, min, max and the quartiles of a list (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "q1": quartiles[0], "q3": quartiles[2], "n": len(ordered)}


def steps_of(events, prefix="gpu_training.step."):
    """Per step, the count of each CUDA API call inside it: `events` are (name, start, end)
    triples from torch.profiler; the steps are the ranges named prefix + index."""
    first_seen = {}
    for name, start, end in events:
        if name.startswith(prefix):
            first_seen.setdefault(int(name[len(prefix):]), (start, end))
    ranges = sorted((index, start, end) for index, (start, end) in first_seen.items())
    counts = [collections.Counter() for _ in ranges]
    for name, start, _ in events:
        if name.startswith(prefix) or not is_api_call(name):
            continue
        for k, (_, first, last) in enumerate(ranges):
            if first <= start <= last:
                counts[k][name] += 1
                break
    return [{"step": index, "calls": dict(c),
             "waits": sum(n for call, n in c.items() if call in WAITS),
             "allocations": sum(n for call, n in c.items() if call in ALLOCATIONS)}
            for (index, _, _), c in zip(ranges, counts)]


def is_api_call(name):
    """Whether a profiler event is a call of the CUDA runtime (cuda...) or driver (cu...)."""
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


# ----------------------------------------------------------------------- the worker side ----

def run_worker(args):
    """A worker process: reads one JSON request a line from stdin, answers on stdout with a
    PROTOCOL line. `args.worker` is its allocator: "torch" or "actpack"."""
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver's "where are you"
    try:  # a worker ends with its driver, even one killed at a stage's limit (Linux)
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.environ.pop("ACTPACK_CONF", None)
    if args.simulate:
        worker = Simulated(args)
    else:
        sys.path.insert(0, HERE)  # benchmarks/models.py, benchmarks/suite.py
        import actpack
        if args.device == "cuda" and args.worker == "actpack":
            actpack.install_allocator()  # before CUDA starts; budgets cap it
        worker = Worker(args)
    reply({"hello": worker.hello()})
    for line in sys.stdin:
        request = json.loads(line)
        command = request.pop("command")
        if command == "quit":
            break
        try:
            answer = getattr(worker, command)(**request)
        except Exception as error:  # noqa: BLE001  a bug here is an answer, not a dead worker
            answer = {"outcome": "error", "message": f"{type(error).__name__}: {error}"[:2000]}
            worker.cleanup()
        reply(answer)
        if worker.poisoned:
            break  # a CUDA error sticks to the context: the driver starts a fresh worker


def reply(answer):
    sys.stdout.write(PROTOCOL + json.dumps(answer) + "\n")
    sys.stdout.flush()


class Worker:
    def __init__(self, args):
        import torch
        import actpack
        import models

        self.torch, self.actpack, self.models = torch, actpack, models
        self.kind, self.device, self.size = args.worker, args.device, args.size
        self.cuda = self.device == "cuda"
        self.poisoned = False
        if self.cuda and args.matmul_precision:
            torch.set_float32_matmul_precision(args.matmul_precision)
        if not self.cuda:
            torch.set_num_threads(1)  # a dry run: two workers share the CPU
        self.tasks = {t.name: t for t in models.tasks(args.size)}
        self.budget_bytes = {name: actpack.parse_budget(b)["bytes"]
                             for name, b in json.loads(args.budgets).items()}
        self.models_built = {}
        self.stash = {}
        self.timing = None
        if self.kind == "torch" and not self.cuda:
            # A dry run: torch has no cap of its own on the CPU; actpack's host pool stands in.
            actpack.install_cpu_allocator()
        self.warm_up()

    def warm_up(self):
        """The process's one-time costs before its first request, while the other worker starts
        too: torch.optim's first optimizer imports torch._dynamo (seconds), and on the GPU the
        first matrix product and convolution create cuBLAS's and cuDNN's handles."""
        torch = self.torch
        weight = torch.nn.Parameter(torch.randn(64, 64, device=self.device))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        conv = torch.nn.Conv2d(3, 8, 3).to(self.device)
        x = torch.randn(2, 3, 16, 16, device=self.device)
        (conv(x).sum() + (weight @ weight).sum()).backward()
        optimizer.step()
        self.sync()
        del weight, optimizer, conv, x
        self.cleanup()

    # ---- info ----

    def hello(self):
        torch = self.torch
        info = {"kind": self.kind, "torch": torch.__version__, "python": platform.python_version(),
                "actpack": self.actpack.__version__, "device": self.device, "pid": os.getpid()}
        if self.cuda:
            props = torch.cuda.get_device_properties(0)
            info.update(name=props.name, total_memory=props.total_memory,
                        capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                        multiprocessors=props.multi_processor_count,
                        actpack_allocator=self.actpack.cuda_allocator_installed(),
                        matmul_precision=torch.get_float32_matmul_precision())
        else:
            info.update(name=platform.processor() or platform.machine(), threads=torch.get_num_threads())
        return info

    # ---- the model, its data and its step ----

    def model(self, name):
        """The model at its initial weights (built once; loaded afresh for every use)."""
        if name not in self.models_built:
            task = self.tasks[name]
            model = task.model(self.device)
            initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            self.models_built[name] = (model, initial)
        model, initial = self.models_built[name]
        model.load_state_dict(initial)
        for p in model.parameters():
            p.grad = None
        return model

    def batch(self, task, size, index):
        """Batch `index` of `size` samples: the suite's text windows for the GPT; for the image
        models the suite's synthetic task, drawn on the device (a seeded generator per index)."""
        torch = self.torch
        if task.kind == "gpt":
            return task.batch(size, index, self.device)
        g = torch.Generator(device=self.device).manual_seed(1000 + index)
        x = torch.randn(size, 3, task.image, task.image, generator=g, device=self.device)
        half = task.image // 2
        quadrants = torch.stack([x[:, :, :half, :half].mean((1, 2, 3)),
                                 x[:, :, :half, half:].mean((1, 2, 3)),
                                 x[:, :, half:, :half].mean((1, 2, 3)),
                                 x[:, :, half:, half:].mean((1, 2, 3))], 1)
        label = quadrants.argmax(1) * 3 + x.mean((2, 3)).argmax(1)
        return x, label % task.classes

    def step_fn(self, task, model, optimizer, offload=False):
        torch = self.torch

        def step(size, index, update=True):
            x, y = self.batch(task, size, index)
            context = (torch.autograd.graph.save_on_cpu(pin_memory=True) if offload
                       else contextlib.nullcontext())
            with context:
                loss = task.loss(model(x), y)
            loss.backward()
            if update:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            return loss  # never read: reading it would make the host wait
        return step

    def fresh(self, model_name, method):
        """Model, optimizer and step for `method`, the optimizer's state made by a step at
        batch 2 (uncapped), as the suite's tries and a user's first step do."""
        config = METHODS.get(method, {})
        task = self.tasks[model_name]
        model = self.model(model_name)
        model.checkpointed = config.get("checkpointed", False)
        optimizer = task.make_optimizer(model)
        step = self.step_fn(task, model, optimizer, config.get("offload", False))
        self.cap(False)
        step(2, 0)
        self.sync()
        return task, model, optimizer, step

    # ---- the cap ----

    def cap(self, on, model_name=None):
        """PyTorch's methods: torch's allocator capped at the budget (on the CPU, actpack's host
        pool in its place). actpack's methods are capped by actpack.budget itself."""
        if self.kind != "torch":
            return
        torch = self.torch
        budget = self.budget_bytes.get(model_name) if on else None
        if self.cuda:
            self.cleanup()
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total) if budget else 1.0)
        else:
            self.actpack.set_cpu_budget(budget)

    def reset_peak(self):
        if self.kind == "torch" and self.cuda:
            self.torch.cuda.reset_peak_memory_stats()
        else:
            self.actpack.reset_peak_memory_stats("cuda" if self.cuda else "cpu")

    def peak_reserved(self):
        if self.kind == "torch" and self.cuda:
            return self.torch.cuda.max_memory_reserved()
        return self.actpack.max_memory_reserved("cuda" if self.cuda else "cpu")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def cleanup(self):
        gc.collect()
        if self.cuda:
            if self.kind == "torch":
                self.torch.cuda.empty_cache()
            else:
                self.actpack.empty_cache("cuda")
        elif self.kind == "torch":
            self.actpack.empty_cache("cpu")

    def classify(self, error):
        """An exception of a try as an outcome; a CUDA error poisons this worker."""
        torch = self.torch
        if isinstance(error, torch.OutOfMemoryError):
            return "oom"
        text = str(error)
        if isinstance(error, RuntimeError) and "out of memory" in text.lower():
            outcome = "oom_as_runtime_error"  # the type users and frameworks catch it is not
        elif "CUDA error" in text or "illegal" in text.lower():
            outcome = "cuda_error"
        else:
            outcome = "error"
        if self.cuda:
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001  the context is gone
                self.poisoned = True
                outcome = "cuda_error" if outcome != "oom_as_runtime_error" else outcome
        if outcome == "cuda_error":
            self.poisoned = True
        return outcome

    # ---- commands ----

    def estimate(self, model, method, batches):
        """Peaks at two small batches under no cap, for a first guess of the largest batch:
        {"points": [[batch, peak reserved bytes], ...]}; for save_on_cpu also "saved_bytes",
        what autograd saves at each batch (counted in a plain step: the host memory it takes)."""
        torch = self.torch
        points, saved = [], []
        for b in batches:
            task, net, optimizer, step = self.fresh(model, method)
            self.cleanup()
            self.reset_peak()
            step(b, 1)
            self.sync()
            points.append([b, self.peak_reserved()])
            if method == "save_on_cpu":
                counted = [0]

                def pack(t):
                    counted[0] += t.numel() * t.element_size()
                    return t

                plain = self.step_fn(task, net, optimizer)
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    plain(b, 1, update=False)
                for p in net.parameters():
                    p.grad = None
                saved.append([b, counted[0]])
            del task, net, optimizer, step
            self.cleanup()
        return {"points": points, "saved_bytes": saved, "host_available": host_available()}

    def trial(self, model, method, batch, steps):
        """Real steps at `batch` under the cap: {"outcome", "seconds", "step_peaks"}. On "fits"
        the last step's gradients (no update after it) are kept for `cosine` when this is the
        largest batch of the method that fitted."""
        config = METHODS[method]
        start = time.perf_counter()
        answer = {"batch": batch, "steps": steps}
        error = None
        report = None
        task = net = optimizer = step = None
        try:
            task, net, optimizer, step = self.fresh(model, method)
            if config["kind"] == "actpack":
                with self.actpack.budget(self.budget_bytes[model], codec=config["codec"],
                                         recompute=config["recompute"]) as run:
                    for i in range(steps):
                        step(batch, i + 1, update=i < steps - 1)
                report = run.report
            else:
                self.cap(True, model)
                for i in range(steps):
                    if i == steps - 1:
                        self.sync()
                        self.reset_peak()
                    step(batch, i + 1, update=i < steps - 1)
                self.sync()
                answer["step_peaks"] = [self.peak_reserved()]
        except Exception as caught:  # noqa: BLE001  classified below, outside the except clause
            error = caught
        if error is not None:
            answer["outcome"] = self.classify(error)
            answer["message"] = str(error).splitlines()[0][:500] if str(error) else type(error).__name__
            error = None
        else:
            answer["outcome"] = "fits"
        if report is not None:
            answer["step_peaks"] = [s.get("peak_reserved_bytes") for s in report["activations"]["steps"]]
            # The steps before may go over the cap to measure themselves (the run's own rule).
            answer["capped_from"] = report["run"]["capped_from_step"]
            answer["warnings"] = report["run"].get("warnings", [])[:3]
            totals = report["activations"]["totals"]
            answer["packed"] = {k: totals.get(k) for k in ("packed_raw_bytes", "packed_stored_bytes",
                                                           "kept_bytes", "ratio")}
        if answer["outcome"] == "fits" and not self.poisoned:
            best = self.stash.get((model, method))
            if best is None or best["batch"] < batch:
                self.stash[(model, method)] = {
                    "batch": batch, "index": steps,
                    "state": {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()},
                    "grads": {n: p.grad.detach().to("cpu", copy=True)
                              for n, p in net.named_parameters() if p.grad is not None}}
        if net is not None:
            for p in net.parameters():
                p.grad = None
        del task, net, optimizer, step, report
        self.cap(False)
        if not self.poisoned:
            self.cleanup()
        answer["seconds"] = time.perf_counter() - start
        return answer

    def cosine(self, model, method):
        """Per parameter group, the cosine between the kept gradients (the largest batch of
        `method` that fitted) and the exact ones at the same weights and batch, uncapped, each
        block recomputed by torch.utils.checkpoint (exact arithmetic at any batch)."""
        kept = self.stash.pop((model, method), None)
        if kept is None:
            return {"outcome": "error", "message": f"no gradients kept for {model} {method}"}
        start = time.perf_counter()
        sys.path.insert(0, HERE)
        from suite import gradient_error
        task = self.tasks[model]
        net = self.model(model)
        net.load_state_dict(kept["state"])
        net.checkpointed = True
        optimizer = task.make_optimizer(net)
        self.cap(False)
        self.step_fn(task, net, optimizer)(kept["batch"], kept["index"], update=False)
        exact = {n: p.grad.detach().to("cpu") for n, p in net.named_parameters() if p.grad is not None}
        groups = gradient_error(kept["grads"], exact, self.models.parameter_groups(net))
        for p in net.parameters():
            p.grad = None
        net.checkpointed = False
        del optimizer, exact
        self.cleanup()
        worst = min(groups, key=lambda g: groups[g]["cosine"]) if groups else None
        return {"outcome": "done", "batch": kept["batch"], "groups": groups, "worst_group": worst,
                "worst_cosine": groups[worst]["cosine"] if worst else None,
                "seconds": time.perf_counter() - start}

    def time_begin(self, model, method, batch, warm):
        """Opens a timed run: `method` is "plain" (uncapped, torch's allocator), "auto" (under
        the cap) or "none" (actpack.budget with nothing packed, uncapped)."""
        task, net, optimizer, step = self.fresh(model, "plain")
        stack = contextlib.ExitStack()
        run = None
        if method == "auto":
            run = stack.enter_context(self.actpack.budget(self.budget_bytes[model], codec="auto"))
        elif method == "none":
            run = stack.enter_context(self.actpack.budget("100%", codec="none"))
        self.timing = {"stack": stack, "step": step, "batch": batch, "index": 0, "run": run,
                       "keep": (task, net, optimizer)}
        try:
            for _ in range(warm):
                self.time_round()
        except Exception:
            self.time_end()
            raise
        return {"outcome": "done"}

    def time_round(self):
        t = self.timing
        self.sync()
        start = time.perf_counter()
        t["step"](t["batch"], 1 + t["index"] % 8)
        self.sync()
        t["index"] += 1
        return {"seconds": time.perf_counter() - start}

    def time_end(self):
        t, self.timing = self.timing, None
        if t is None:
            return {"outcome": "done"}
        try:
            t["stack"].close()
        finally:
            answer = {"outcome": "done"}
            if t["run"] is not None and t["run"].report is not None:
                totals = t["run"].report["activations"]["totals"]
                answer["packed"] = {k: totals.get(k) for k in ("packed_raw_bytes",
                                                               "packed_stored_bytes",
                                                               "kept_bytes", "ratio")}
            del t
            self.cleanup()
        return answer

    def profile(self, model, method, batch, steps):
        """torch.profiler's CUDA API trace over `steps` steps of `method` at `batch` under the
        cap, each step a range of its own, from the first step of the run (auto's profile steps
        and first plan included)."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile, record_function
        config = METHODS[method]
        start = time.perf_counter()
        task, net, optimizer, step = self.fresh(model, method)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        stack = contextlib.ExitStack()
        error = None
        run = None
        try:
            with stack:
                if config["kind"] == "actpack":
                    run = stack.enter_context(self.actpack.budget(self.budget_bytes[model],
                                                                  codec=config["codec"],
                                                                  recompute=config["recompute"]))
                else:
                    self.cap(True, model)
                self.sync()
                with profile(activities=activities) as prof:
                    for i in range(steps):
                        with record_function(f"gpu_training.step.{i}"):
                            step(batch, i + 1)
                    self.sync()
        except Exception as caught:  # noqa: BLE001
            error = caught
        self.cap(False)
        if error is not None:
            outcome = self.classify(error)
            message = str(error).splitlines()[0][:500] if str(error) else type(error).__name__
            error = None
            del task, net, optimizer, step
            if not self.poisoned:
                self.cleanup()
            return {"outcome": outcome, "message": message}
        # The host's side only: the steps' ranges and the API calls (a range also appears as a
        # GPU-side annotation, which steps_of would take for the step).
        cpu = torch.autograd.DeviceType.CPU
        events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == cpu]
        del prof, task, net, optimizer, step
        self.cleanup()
        # The first step held to the cap: the budget's own rule (its first steps may go over it
        # to measure); PyTorch's methods from their second (the first fills the cache).
        capped_from = run.report["run"]["capped_from_step"] if run is not None else 1
        return {"outcome": "done", "batch": batch, "steps": steps_of(events),
                "capped_from": capped_from, "seconds": time.perf_counter() - start}


class Simulated:
    """A worker without torch, for the driver's own test (tests/test_gpu_training.py): a
    method trains up to spec["limits"][model][method] samples and runs out above; a
    "model method" in spec["hang"] never answers its tries, one in spec["crash"] exits on its
    tries above the limit."""
    poisoned = False

    def __init__(self, args):
        self.spec = json.loads(args.simulate)
        self.kind, self.device = args.worker, args.device
        self.budgets = {m: parse_bytes(b) for m, b in json.loads(args.budgets).items()}
        self.kept = {}

    def hello(self):
        return {"kind": self.kind, "name": "simulated", "device": self.device,
                "total_memory": 80 * GiB, "torch": None, "actpack": None, "pid": os.getpid()}

    def cleanup(self):
        pass

    def limit(self, model, method):
        return self.spec["limits"][model][method]

    def estimate(self, model, method, batches):
        per_sample = self.budgets[model] / self.limit(model, method)
        return {"points": [[b, int(per_sample * b)] for b in batches],
                "saved_bytes": [[b, 1000 * b] for b in batches], "host_available": 10 ** 12}

    def trial(self, model, method, batch, steps):
        name = f"{model} {method}"
        if name in self.spec.get("hang", []):
            time.sleep(3600)
        fits = batch <= self.limit(model, method)
        if not fits and name in self.spec.get("crash", []):
            os._exit(3)
        if fits:
            best = self.kept.get((model, method), 0)
            self.kept[(model, method)] = max(best, batch)
        return {"batch": batch, "steps": steps, "outcome": "fits" if fits else "oom",
                "seconds": 0.001, "step_peaks": [batch]}

    def cosine(self, model, method):
        batch = self.kept.pop((model, method), None)
        if batch is None:
            return {"outcome": "error", "message": f"no gradients kept for {model} {method}"}
        cosine = 1.0 if METHODS[method]["kind"] == "torch" else 0.99
        return {"outcome": "done", "batch": batch, "worst_group": "blocks.0",
                "worst_cosine": cosine, "groups": {"blocks.0": {"cosine": cosine,
                                                                "relative_norm": 0.01}}}

    def time_begin(self, model, method, batch, warm):
        self.timed = {"plain": 0.100, "auto": 0.110, "none": 0.101}[method]
        return {"outcome": "done"}

    def time_round(self):
        return {"seconds": self.timed}

    def time_end(self):
        return {"outcome": "done"}

    def profile(self, model, method, batch, steps):
        return {"outcome": "done", "batch": batch, "capped_from": 1, "steps": [
            {"step": i, "calls": {"cudaStreamSynchronize": 1}, "waits": 1, "allocations": 0}
            for i in range(steps)]}


def parse_bytes(text):
    """Bytes of "8GiB", "10MiB", "512KiB" or a plain number (the driver does not import
    actpack)."""
    text = str(text).strip()
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * scale)
    return int(float(text))


def host_available():
    """Bytes of memory the host has available (MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ----------------------------------------------------------------------- the driver side ----

class WorkerGone(Exception):
    def __init__(self, outcome, message):
        super().__init__(message)
        self.outcome, self.message = outcome, message


class WorkerProcess:
    """A worker process and its request channel; restarted when it dies or hangs."""

    def __init__(self, kind, argv):
        self.kind, self.argv = kind, argv
        self.process = None
        self.buffer = b""
        self.hello = None
        self.starts = 0

    def start(self):
        env = dict(os.environ)
        env.pop("ACTPACK_CONF", None)
        env["PYTHONUNBUFFERED"] = "1"
        self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, start_new_session=True)
        self.buffer = b""
        self.hello = None
        self.starts += 1

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def ensure(self, timeout):
        if not self.alive():
            self.start()
        if self.hello is None:
            self.hello = self.read(timeout)["hello"]
        return self.hello

    def request(self, timeout, startup_timeout=120.0, **request):
        self.ensure(startup_timeout)
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.stop()
            raise WorkerGone("crash", f"the {self.kind} worker had exited")
        return self.read(timeout)

    def read(self, timeout):
        """The next PROTOCOL line (other output goes to this process's stdout), or WorkerGone."""
        deadline = time.monotonic() + max(1.0, timeout)
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        try:
            while True:
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    if text.startswith(PROTOCOL):
                        return json.loads(text[len(PROTOCOL):])
                    print(f"  [{self.kind}] {text}", flush=True)
                left = deadline - time.monotonic()
                if left <= 0:
                    self.dump_and_stop()
                    raise WorkerGone("hang", f"no answer from the {self.kind} worker in "
                                             f"{timeout:.0f} s (its stacks are above)")
                if not selector.select(left):
                    continue
                chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                if not chunk:
                    code = self.process.wait()
                    self.process = None
                    raise WorkerGone("crash", f"the {self.kind} worker exited with code {code}")
                self.buffer += chunk
        finally:
            selector.close()

    def dump_and_stop(self):
        if self.alive():
            try:
                self.process.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack
                time.sleep(1.0)
                os.killpg(self.process.pid, signal.SIGKILL)  # it does not read its requests
            except OSError:
                pass
        self.stop()

    def stop(self):
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                self.process.stdin.write(b'{"command": "quit"}\n')
                self.process.stdin.flush()
                self.process.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait()
        self.process = None


class Driver:
    def __init__(self, args):
        self.args = args
        self.start = time.monotonic()
        self.end = self.start + args.time_limit
        size = SIZES[args.size]
        self.budgets = {m: (args.budget or size["budget"][m]) for m in args.models}
        base = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--size",
                args.size, "--budgets", json.dumps(self.budgets), "--matmul-precision",
                args.matmul_precision or ""] + (
                    ["--simulate", args.simulate] if args.simulate else [])
        self.workers = {kind: WorkerProcess(kind, base + ["--worker", kind])
                        for kind in ("torch", "actpack")}
        # How long a request may go past its job's time before it counts as hung (its stacks
        # dumped, the worker restarted); shorter for a worker kind that has hung once.
        hang = args.hang_seconds or (30.0 if args.device == "cuda" else 120.0)
        self.hang_floor = {kind: hang for kind in self.workers}
        methods = set(args.methods)
        if args.device != "cuda":
            methods.discard("save_on_cpu")  # it offloads device memory
        self.jobs = [j for j in JOBS if j[1] in args.models and (j[2] is None or j[2] in methods)]
        self.methods = methods
        self.result = {
            "command": "python3 benchmarks/gpu_training.py " + " ".join(sys.argv[1:]),
            "commit": git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "size": args.size, "budgets": self.budgets,
            "settings": {"precision": args.precision, "rounds": args.rounds,
                         "try_steps": TRY_STEPS, "time_limit_s": args.time_limit,
                         "matmul_precision": args.matmul_precision,
                         "fidelity_floor": "actpack.budget's default max_rel_rms",
                         "exact_reference": "uncapped, per-block torch.utils.checkpoint, same "
                                            "weights and batch"},
            "device": None, "workers": {}, "models": {m: {"methods": {}} for m in args.models},
            "jobs": [], "status": "running"}

    def left(self):
        return self.end - time.monotonic()

    def save(self):
        if self.args.json:
            self.result["wall_seconds"] = time.monotonic() - self.start
            os.makedirs(os.path.dirname(os.path.abspath(self.args.json)), exist_ok=True)
            with open(self.args.json + ".tmp", "w") as f:
                json.dump(self.result, f, indent=1)
            os.replace(self.args.json + ".tmp", self.args.json)

    def ask(self, kind, timeout, **request):
        """A request to a worker, given `timeout` seconds or its kind's hang floor, whichever is
        longer, within the run's limit; a hang or crash comes back as {"outcome": ...}."""
        worker = self.workers[kind]
        timeout = max(1.0, min(max(timeout, self.hang_floor[kind]), self.left()))
        try:
            answer = worker.request(timeout, startup_timeout=max(1.0, min(120.0, self.left())),
                                    **request)
        except WorkerGone as gone:
            print(f"gpu_training: {gone.message}", flush=True)
            if gone.outcome == "hang":
                self.hang_floor[kind] = min(self.hang_floor[kind], 15.0)
            return {"outcome": gone.outcome, "message": gone.message}
        if not worker.alive():
            worker.stop()  # it exited after a CUDA error: the next request starts a fresh one
        return answer

    def run(self):
        for worker in self.workers.values():
            worker.start()  # both start at once: their imports overlap
        for kind, worker in self.workers.items():
            try:
                hello = worker.ensure(min(120.0, self.left()))
            except WorkerGone as gone:
                self.result["workers"][kind] = {"error": gone.message}
                print(f"gpu_training: the {kind} worker did not start ({gone.message}; its "
                      "error is above; without a GPU: --device cpu --size smoke)", flush=True)
                continue
            self.result["workers"][kind] = hello
            self.result["device"] = self.result["device"] or {
                k: hello.get(k) for k in ("name", "total_memory", "capability", "cuda", "torch",
                                          "actpack", "python", "multiprocessors",
                                          "matmul_precision", "device")}
        self.save()
        weights_left = collections.Counter()
        for job in self.jobs:
            weights_left[job[4]] += job[3]
        for job in self.jobs:
            what, model, method, weight, tier = job
            budget = allowance(self.left() - 2.0, weight, weights_left[tier])
            weights_left[tier] -= weight
            label = f"{what} {model}" + (f" {method}" if method else "")
            record = {"job": label, "tier": tier, "allowance_s": round(budget, 1)}
            started = time.monotonic()
            if budget < 1.0:
                record["status"] = "skipped: no time left"
                print(f"gpu_training: {label} skipped (no time left)", flush=True)
            else:
                print(f"gpu_training: {label} ({budget:.0f} s, {self.left():.0f} s left)",
                      flush=True)
                record["status"] = getattr(self, "job_" + what)(model, method,
                                                                 started + budget)
            record["seconds"] = round(time.monotonic() - started, 1)
            self.result["jobs"].append(record)
            self.save()
        self.result["status"] = "done"
        self.result["summary"] = summary(self.result)
        self.save()
        print(table(self.result), flush=True)

    def close(self):
        for worker in self.workers.values():
            worker.stop()

    # ---- jobs ----

    def guess(self, model, method, until):
        """A first batch to try: PyTorch's methods from the line through two small batches'
        peaks; actpack's from the answers before (auto: 4.5x plain's, the CPU suite's ratio;
        auto+recompute: 1.8x per-block checkpointing's, at least auto's)."""
        methods = self.result["models"][model]["methods"]
        done = {m: r.get("max_batch") for m, r in methods.items() if r.get("max_batch")}
        config = METHODS[method]
        ceiling = SIZES[self.args.size]["ceiling"]
        if config["kind"] == "actpack":
            if method == "auto+recompute":
                base = max(done.get("auto", 0), int(1.8 * done.get("checkpoint", 0)))
                return (base or int(4.5 * done.get("plain", 8))), ceiling, None
            return int(4.5 * done.get("plain", 8)) or 8, ceiling, None
        probes = SIZES[self.args.size]["probes"][model]
        answer = self.ask("torch", until - time.monotonic(), command="estimate", model=model,
                          method=method, batches=list(probes))
        if "points" not in answer:
            return probes[1], ceiling, answer
        (b1, p1), (b2, p2) = answer["points"]
        budget = self.budget_bytes_of(model)
        if p2 - p1 <= 0.01 * p1:
            guess = 4 * b2  # no growth the pool's granularity shows: a guess, the search corrects
        else:
            per_sample = (p2 - p1) / (b2 - b1)
            fixed = p1 - per_sample * b1
            guess = int(0.95 * (budget - fixed) / per_sample) if budget > fixed else b1
        if method == "save_on_cpu" and answer.get("host_available") and answer.get("saved_bytes"):
            (s1, h1), (s2, h2) = answer["saved_bytes"]
            host_per_sample = max(1.0, (h2 - h1) / (s2 - s1))
            # Pinned host memory for what autograd saves: a third of what the host has free.
            ceiling = min(ceiling, max(2, int(answer["host_available"] / 3 / host_per_sample)))
        return max(2, guess), ceiling, answer

    def budget_bytes_of(self, model):
        return parse_bytes(self.budgets[model])

    def job_search(self, model, method, until):
        entry = {"allocator": "actpack" if METHODS[method]["kind"] == "actpack" else "torch",
                 "steps_per_try": TRY_STEPS[method]}
        self.result["models"][model]["methods"][method] = entry
        guess, ceiling, estimate = self.guess(model, method, until)
        entry.update(guess=guess, ceiling=ceiling)
        if estimate is not None:
            entry["estimate"] = estimate
        kind = METHODS[method]["kind"]
        rates = []  # seconds per sample-step of the tries (those that ran out stopped early)
        steps = TRY_STEPS[method]
        cosine_share = 0.15  # of the job, kept for the gradient comparison at the end

        def fits(batch):
            left = until - time.monotonic()
            reserve = cosine_share * (until - started)
            expected = (max(rates) * batch * (steps + 2)) if rates else 0.0
            if left - reserve < max(1.0, expected):
                raise Stop("time", f"{left:.0f} s left of the job, a try at {batch} takes "
                                   f"about {expected:.0f} s")
            answer = self.ask(kind, max(left, 3 * expected), command="trial", model=model,
                              method=method, batch=batch, steps=steps)
            details.append(answer)
            outcome = answer.get("outcome", "error")
            if answer.get("seconds"):
                rates.append(answer["seconds"] / (batch * (steps + 1)))
            print(f"  {model} {method} batch {batch}: {outcome} "
                  f"({answer.get('seconds', 0):.1f} s)"
                  + (f" {answer.get('message', '')[:160]}" if outcome != "fits" else ""),
                  flush=True)
            return outcome

        started = time.monotonic()
        details = []
        found = search(fits, guess, ceiling, self.args.precision)
        # Each try's record: the search's outcome with the worker's details beside it.
        tries = []
        for record in found["tries"]:
            if "batch" in record and details:
                detail = details.pop(0)
                record = dict(detail, **record)
            tries.append(record)
        entry.update(max_batch=found["max_batch"], max_batch_upper=found["max_batch_upper"],
                     status=found["status"], tries=tries)
        if found["max_batch"]:
            answer = self.ask(kind, max(5.0, until - time.monotonic() + 10.0), command="cosine",
                              model=model, method=method)
            if "no gradients kept" in answer.get("message", "") and until > time.monotonic():
                # The worker that kept them was restarted (a later try crashed it): the
                # largest batch once more, which also verifies it a second time.
                again = self.ask(kind, max(5.0, until - time.monotonic() + 10.0),
                                 command="trial", model=model, method=method,
                                 batch=found["max_batch"], steps=steps)
                entry["verified_again"] = {k: again.get(k) for k in ("outcome", "message",
                                                                     "seconds", "step_peaks")}
                if again.get("outcome") == "fits":
                    answer = self.ask(kind, max(5.0, until - time.monotonic() + 10.0),
                                      command="cosine", model=model, method=method)
            if answer.get("outcome") == "done":
                entry["gradients"] = answer
            else:
                entry["gradients_error"] = answer.get("message", answer.get("outcome"))
        print(f"  {model} {method}: largest batch {found['max_batch']} (not above "
              f"{found['max_batch_upper']}), {found['status']}"
              + (f", worst group's gradient cosine {entry['gradients']['worst_cosine']:.4f} "
                 f"({entry['gradients']['worst_group']})" if entry.get("gradients") else ""),
              flush=True)
        return found["status"]

    def job_timing(self, model, _method, until):
        """plain (uncapped) and auto (capped) step by step for --rounds rounds, then none."""
        methods = self.result["models"][model]["methods"]
        auto = methods.get("auto", {}).get("max_batch")
        checkpoint = methods.get("checkpoint", {}).get("max_batch")
        plain = methods.get("plain", {}).get("max_batch")
        if not auto:
            return "skipped: auto has no largest batch"
        batch = min(b for b in (auto, checkpoint or plain) if b)
        timing = {"batch": batch, "rule": "the smaller of auto's and per-block checkpointing's "
                                          "largest batch (plain's where checkpointing has none)",
                  "plain": "torch's allocator, uncapped", "auto": "actpack.budget(cap, 'auto')",
                  "none": "actpack.budget(no cap, 'none') on actpack's allocator",
                  "rounds": []}
        self.result["models"][model]["timing"] = timing
        rounds = self.args.rounds
        warm = {"plain": 2, "auto": 3, "none": 2}

        def timeout():
            return until - time.monotonic() + 10.0

        # plain first, then auto: a budget counts the device's memory above its value at its
        # start, so the other process is at its steady size before the budget opens.
        begun = []
        for method, kind in (("plain", "torch"), ("auto", "actpack")):
            answer = self.ask(kind, timeout(), command="time_begin", model=model, method=method,
                              batch=batch, warm=warm[method])
            if answer.get("outcome") != "done":
                timing[f"{method}_error"] = answer.get("message", answer.get("outcome"))
                break
            begun.append((method, kind))
        if len(begun) == 2:
            for r in range(rounds):
                if until - time.monotonic() < 2.0:
                    timing["cut"] = f"after {r} rounds: the job's time ran out"
                    break
                row = {}
                for method, kind in begun:
                    answer = self.ask(kind, timeout(), command="time_round")
                    if "seconds" not in answer:
                        timing[f"{method}_error"] = answer.get("message", answer.get("outcome"))
                        break
                    row[method] = answer["seconds"]
                if len(row) < 2:
                    break
                row["ratio"] = row["auto"] / row["plain"]
                timing["rounds"].append(row)
        for method, kind in begun:
            answer = self.ask(kind, timeout(), command="time_end")
            if answer.get("packed"):
                timing[f"{method}_packed"] = answer["packed"]
        # none: as many rounds on actpack's allocator, nothing packed.
        none = []
        if timing["rounds"] and until - time.monotonic() > 3.0:
            answer = self.ask("actpack", timeout(), command="time_begin", model=model,
                              method="none", batch=batch, warm=warm["none"])
            if answer.get("outcome") == "done":
                for _ in range(len(timing["rounds"])):
                    if until - time.monotonic() < 1.0:
                        break
                    answer = self.ask("actpack", timeout(), command="time_round")
                    if "seconds" not in answer:
                        break
                    none.append(answer["seconds"])
            self.ask("actpack", timeout(), command="time_end")
        timing["none_rounds"] = none
        timing["summary"] = timing_summary(timing)
        s = timing["summary"]
        if s.get("auto_over_plain"):
            print(f"  {model} at batch {batch}: auto / plain median "
                  f"{s['auto_over_plain']['median']:.2f}x (range "
                  f"{s['auto_over_plain']['min']:.2f}-{s['auto_over_plain']['max']:.2f}, upper "
                  f"quartile {s['auto_over_plain']['q3']:.2f}) over {s['auto_over_plain']['n']} "
                  "rounds" + (f"; auto / none {s['auto_over_none']:.2f}x"
                              if s.get("auto_over_none") else ""), flush=True)
        return "done" if timing["rounds"] else "failed"

    def job_profile(self, model, _method, until):
        """Per step, the CUDA API calls at the cap: auto at its largest batch (from its first
        step: the profile steps and the first plan too), and plain at its own."""
        methods = self.result["models"][model]["methods"]
        runs = []
        if methods.get("auto", {}).get("max_batch"):
            runs.append(("auto", methods["auto"]["max_batch"], TRY_STEPS["auto"] + 1))
        if methods.get("plain", {}).get("max_batch"):
            runs.append(("plain", methods["plain"]["max_batch"], 4))
        if not runs:
            return "skipped: no largest batch to profile at"
        profiles = {}
        self.result["models"][model]["profile"] = profiles
        for method, batch, steps in runs:
            left = until - time.monotonic()
            if left < 2.0:
                profiles[method] = {"outcome": "skipped: no time left"}
                continue
            answer = self.ask(METHODS[method]["kind"], left + 10.0, command="profile",
                              model=model, method=method, batch=batch, steps=steps)
            profiles[method] = answer
            if answer.get("outcome") == "done":
                capped = answer["steps"][answer["capped_from"]:]
                answer["at_the_cap"] = {
                    "steps": len(capped),
                    "waits_per_step": (sum(s["waits"] for s in capped) / len(capped)
                                       if capped else None),
                    "allocations_per_step": (sum(s["allocations"] for s in capped) / len(capped)
                                             if capped else None)}
                print(f"  {model} {method} at {batch}: per step from step "
                      f"{answer['capped_from']}: waits "
                      + ", ".join(str(s["waits"]) for s in capped) + "; device allocations "
                      + ", ".join(str(s["allocations"]) for s in capped), flush=True)
        return "done"


def timing_summary(timing):
    ratios = [r["ratio"] for r in timing["rounds"]]
    out = {"plain_seconds": round_stats([r["plain"] for r in timing["rounds"]]),
           "auto_seconds": round_stats([r["auto"] for r in timing["rounds"]]),
           "none_seconds": round_stats(timing.get("none_rounds") or []),
           "auto_over_plain": round_stats(ratios)}
    if ratios:
        out["rounds_within_1.2x"] = sum(r <= 1.2 for r in ratios)
    if out["none_seconds"] and out["auto_seconds"]:
        out["auto_over_none"] = out["auto_seconds"]["median"] / out["none_seconds"]["median"]
    return out


def summary(result):
    """The figures the issue's checks read, per model."""
    out = {}
    for model, entry in result["models"].items():
        methods = entry["methods"]
        batch = {m: r.get("max_batch") for m, r in methods.items()}
        native = {m: b for m, b in batch.items() if METHODS[m]["kind"] == "torch" and b}
        s = {"max_batch": batch,
             "worst_cosine": {m: r["gradients"]["worst_cosine"] for m, r in methods.items()
                              if r.get("gradients")}}
        for name in ("auto", "auto+recompute"):
            if batch.get(name):
                if batch.get("plain"):
                    s[f"{name}_over_plain"] = batch[name] / batch["plain"]
                if batch.get("checkpoint"):
                    s[f"{name}_over_checkpoint"] = batch[name] / batch["checkpoint"]
                best = {m: b for m, b in native.items() if m != "save_on_cpu"}
                if best:
                    top = max(best, key=best.get)
                    s[f"{name}_over_best_native_on_device"] = {"method": top,
                                                               "ratio": batch[name] / best[top]}
                if native:
                    top = max(native, key=native.get)
                    s[f"{name}_over_best_native"] = {"method": top,
                                                     "ratio": batch[name] / native[top]}
        if entry.get("timing", {}).get("summary"):
            s["timing"] = entry["timing"]["summary"]
        if entry.get("profile"):
            s["at_the_cap"] = {m: p.get("at_the_cap") for m, p in entry["profile"].items()}
        out[model] = s
    return out


def table(result):
    lines = [f"\ngpu_training: {result['device'] and result['device'].get('name')}, "
             f"budgets {result['budgets']}, {result.get('wall_seconds', 0):.0f} s"]
    for model, entry in result["models"].items():
        lines.append(f"\n{model}")
        lines.append(f"  {'method':<16}{'allocator':>10}{'max batch':>11}{'upper':>7}"
                     f"{'x plain':>9}{'worst cos':>11}{'tries':>7}  status")
        plain = entry["methods"].get("plain", {}).get("max_batch")
        for method, r in entry["methods"].items():
            b = r.get("max_batch")
            cos = r.get("gradients", {}).get("worst_cosine")
            tries = sum(1 for t in r.get("tries", []) if "batch" in t)
            lines.append(f"  {method:<16}{r.get('allocator', ''):>10}{b if b is not None else '-':>11}"
                         f"{r.get('max_batch_upper', '-'):>7}"
                         f"{(f'{b / plain:.2f}' if b and plain else '-'):>9}"
                         f"{(f'{cos:.4f}' if cos is not None else '-'):>11}{tries:>7}  "
                         f"{r.get('status', '-')}")
        t = entry.get("timing", {}).get("summary", {})
        if t.get("auto_over_plain"):
            a = t["auto_over_plain"]
            lines.append(f"  step time at {entry['timing']['batch']}: auto / plain median "
                         f"{a['median']:.2f}x, range {a['min']:.2f}-{a['max']:.2f}, upper "
                         f"quartile {a['q3']:.2f}, {t['rounds_within_1.2x']} of {a['n']} rounds "
                         "within 1.2x"
                         + (f"; auto / none {t['auto_over_none']:.2f}x" if t.get("auto_over_none")
                            else ""))
        for method, p in entry.get("profile", {}).items():
            cap = p.get("at_the_cap")
            if cap and cap.get("steps"):
                lines.append(f"  at the cap, {method} at {p['batch']}: {cap['waits_per_step']:.2f} "
                             f"host waits, {cap['allocations_per_step']:.2f} device allocations "
                             f"and frees per step ({cap['steps']} steps)")
    return "\n".join(lines)


def git_commit():
    """The commit the run is of: tools/gpu_benchmark.py's rule, one home for the GPU scripts."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import gpu_benchmark
    return gpu_benchmark.git_commit()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="full (the GPU sizes; default on cuda) or smoke (tiny; default on cpu)")
    parser.add_argument("--budget", help="one budget for every model (default: 8GiB at full "
                                         "size, the suite's smoke budgets at smoke size)")
    parser.add_argument("--models", nargs="+", default=["resnet50", "gpt2-small"],
                        choices=["resnet50", "gpt2-small"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--time-limit", type=float, default=150.0,
                        help="seconds for the whole run, start-up included (default 150)")
    parser.add_argument("--precision", type=float, default=0.05,
                        help="the search stops when the bracket is within this share of its "
                             "lower end (default 0.05)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (default 10)")
    parser.add_argument("--matmul-precision", default="high",
                        help="torch.set_float32_matmul_precision on the GPU ('high': TF32; "
                             "'highest': full float32)")
    parser.add_argument("--hang-seconds", type=float, default=None,
                        help="a request unanswered this long, and past its job's time, is "
                             "stopped as hung, its stacks dumped (default 30 on cuda, 120 on "
                             "cpu; 15 for a worker kind that hung once)")
    parser.add_argument("--json", help="write the results here (after every job)")
    parser.add_argument("--worker", choices=["torch", "actpack"], help=argparse.SUPPRESS)
    parser.add_argument("--budgets", help=argparse.SUPPRESS)
    parser.add_argument("--simulate", help=argparse.SUPPRESS)  # workers without torch (tests)
    args = parser.parse_args(argv)
    if args.size is None:
        args.size = "full" if args.device == "cuda" else "smoke"
    if args.worker:
        run_worker(args)
        return 0
    driver = Driver(args)
    interrupted = False
    try:
        driver.run()
    except KeyboardInterrupt:
        interrupted = True
        driver.result["status"] = "interrupted"
        driver.result["summary"] = summary(driver.result)
        print("gpu_training: interrupted; the results so far are kept", flush=True)
    finally:
        driver.close()
        driver.save()
    if args.json:
        print(f"gpu_training: wrote {args.json}", flush=True)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
