#!/usr/bin/env python3
"""Renders the README's measured tables from the committed result files.

Each table sits between `<!-- table NAME (benchmarks/readme_tables.py) -->` and
`<!-- end table -->` in README.md and is made here from its result file (benchmarks/results/),
which the command named beside the table wrote:

  python3 benchmarks/readme_tables.py           # rewrite the tables in README.md
  python3 benchmarks/readme_tables.py --check   # exit 1, naming them, if any differ

tests/test_readme_tables.py runs the check, so a README figure cannot drift from its file.
"""
import argparse
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) \(benchmarks/readme_tables\.py\) -->\n)"
                   r"(?P<body>.*?)(<!-- end table -->)", re.S)


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def convergence():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from convergence import markdown
    return markdown(load("convergence.json"))


def diverging_lm():
    data = load("diverging_lm.json")
    lines = ["| run | ended | steps | last loss | largest gradient norm | steps dropped |",
             "|---|---|---|---|---|---|"]
    for name, r in data["rows"].items():
        norm = r["largest_grad_norm"]
        shown = "-" if norm is None else ("inf" if math.isinf(norm) else f"{norm:.3g}")
        lines.append(f"| `{name}` | {r['ended']} | {r['steps']} | {r['last_loss']:.3f} | "
                     f"{shown} | {r.get('steps_dropped', 0)} |")
    return "\n".join(lines)


def planner():
    data = load("planner.json")
    lines = ["| model, budget, choice | planner | truth | planner / truth | steps | tries "
             "| its measured headroom |",
             "|---|---|---|---|---|---|---|"]
    for r in (r for r in data["rows"] if "truth" in r):
        lines.append(f"| {r['model']}, {r['budget']}, `{r['codec']}` | {r['estimate']} | "
                     f"{r['truth']} | {r['estimate'] / r['truth']:.2f} | {r['steps_run']} | "
                     f"{r['calibration_tries']} | {r['headroom']:.1%} |")
    return "\n".join(lines)


def planner_steps():
    """The default plans' cost (every choice, no verify): the rows without a truth."""
    data = load("planner.json")
    lines = ["| model, budget | steps run | max batch per choice (its measured headroom, "
             "its tries under the cap) |", "|---|---|---|"]
    for r in (r for r in data["rows"] if "truth" not in r):
        headroom, tries = r.get("headroom", {}), r.get("calibration_tries", {})
        batches = ", ".join(f"`{c}` {b}" + (f" ({headroom[c]:.1%}, {tries[c]})"
                                            if c in headroom else "")
                            for c, b in r["max_batch_size"].items())
        lines.append(f"| {r['model']}, {r['budget']} | {r['steps_run']} | {batches} |")
    return "\n".join(lines)


def overhead():
    """benchmarks/overhead.py's rows, one line per model (every row in actpack's pool)."""
    names = {"gpt2-small": "GPT-2-small-like", "resnet50": "ResNet-50"}
    lines = ["| model, batch, budget | plain | `none` | `auto` | `auto` per round "
             "| plain accumulating micro-batches | auto: codecs "
             "| hooks (no codecs) | end of step | the model's own work "
             "| page faults a step (plain / auto) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in names:
        d = load(f"overhead_{model}.json")
        plain, none, auto = d["plain_seconds"], d["none"], d["auto"]
        rounds = ", ".join(f"{r:.2f}x" for r in d["auto_over_plain_per_round"])
        acc = d.get("accumulate")
        accumulated = (f"{acc['wall'] / plain:.2f}x ({acc['micro_steps']} of "
                       f"{acc['micro_batch']})" if acc else "-")
        lines.append(f"| {names[model]}, {d['batch']}, {d['budget'].replace('MiB', ' MiB')} "
                     f"| {plain:.3f} s | {none['wall'] / plain:.2f}x | {auto['wall'] / plain:.2f}x "
                     f"| {rounds} | {accumulated} | {auto['codec']:.3f} s | {auto['hooks']:.3f} s "
                     f"| {auto['end_of_step']:.3f} s | {auto['model']:.3f} s "
                     f"| {d['plain_minor_faults']:,.0f} / {auto['minor_faults']:,.0f} |")
    return "\n".join(lines)


SUITE_MODELS = {"resnet50": "ResNet-50", "gpt2-small": "GPT-2-small-like",
                "vit-b16": "ViT-B/16-like", "unet": "UNet"}
SUITE_METHODS = {
    "plain": "plain PyTorch",
    "checkpoint": "per-block checkpointing",
    "selective_checkpoint": "selective checkpointing (per block)",
    "actpack:none": "actpack `none` (plain under the cap)",
    "actpack:quant2": "actpack `quant2`",
    "actpack:division": "actpack `division`",
    "actpack:eb": "actpack `eb`",
    "actpack:auto": "actpack `auto`",
    "actpack:auto,no floor": "actpack `auto`, `max_rel_rms=None` (any codec)",
    "actpack:auto+checkpoint": "actpack `auto` + checkpointing",
    "actpack:auto+recompute": "actpack `auto`, `recompute=\"auto\"`",
    "bf16_autocast": "bf16 autocast",
    "actpack:auto+bf16": "actpack `auto` + bf16 autocast",
    "compile": "`torch.compile`",
    "compile:budget=0.5": "`torch.compile`, `activation_memory_budget=0.5`",
    "compile:budget=0": "`torch.compile`, `activation_memory_budget=0`",
    "actpack:auto+compile": "actpack `auto` inside `torch.compile`",
}
# What a PyTorch user would reach for instead of actpack to fit a larger batch.
NATIVE = ("checkpoint", "selective_checkpoint", "compile", "compile:budget=0.5",
          "compile:budget=0")


def _mib(n):
    return f"{n / 2**20:.0f} MiB"


def suite_table(model, suffix=""):
    """benchmarks/results/suite_cpu_<model><suffix>.json (benchmarks/suite.py --models
    <model>; suffix _compile: the run of the torch.compile methods, with its own plain and
    checkpointing rows as the time's and the ratios' references)."""
    data = load(f"suite_cpu_{model}{suffix}.json")
    entry = data["models"][model]
    rows = {r["method"]: r for r in data["rows"] if r["model"] == model}

    def f(value, spec):
        return "-" if value is None else format(value, spec)

    lines = [f"| {SUITE_MODELS[model]}, {_mib(entry['budget_bytes'])} | largest batch "
             f"(first failing - 1) | × plain | × checkpointing | time at batch "
             f"{entry['time_batch']} | grad cosine at batch {entry['time_batch']} (worst group) "
             f"| grad cosine at its own largest batch | loss after "
             f"{len(entry['methods']['plain']['losses'])} steps |",
             "|---|---|---|---|---|---|---|---|"]
    # A run without the no-floor row predates auto's fidelity floor (max_rel_rms): its auto
    # packed as auto with max_rel_rms=None does now, and ReLU's outputs by value.
    floored = "actpack:auto,no floor" in rows or suffix == "_compile"  # that run came after
    for method, name in SUITE_METHODS.items():
        if method not in rows:
            continue
        if not floored and method.startswith("actpack:auto"):
            name += " (measured before the fidelity floor: as `max_rel_rms=None`)"
        r, m = rows[method], entry["methods"][method]
        low, high = m["max_batch"], m["max_batch_upper"]
        batch = f"{low}" if high == low else f"{low} ({high})"
        own = r.get("min_cosine_at_max_batch")
        if own is None and method in ("plain", "checkpoint", "selective_checkpoint",
                                      "actpack:none"):
            own = r.get("min_cosine")  # exact methods: the same gradients at any batch
        time = f(r.get("time_vs_plain"), ".2f") if not r.get("error") else "out of memory"
        lines.append(f"| {name} | {batch} | {f(r.get('vs_plain'), '.2f')} | "
                     f"{f(r.get('vs_checkpoint'), '.2f')} | {time} | "
                     f"{f(r.get('min_cosine'), '.4f')} | {f(own, '.4f')} | "
                     f"{f(r.get('final_loss'), '.3f')} |")
    return "\n".join(lines)


def suite_versus_native():
    """Per model, the largest batch of the best PyTorch-native method (of both suite runs)
    against actpack's auto, with and without recomputation."""
    lines = ["| model, budget | best PyTorch-native method: largest batch | native methods "
             "measured | actpack `auto` | `auto`, `recompute=\"auto\"` | best `auto` / best "
             "native |", "|---|---|---|---|---|---|"]
    for model, name in SUITE_MODELS.items():
        files = [f for f in (f"suite_cpu_{model}.json", f"suite_cpu_{model}_compile.json")
                 if os.path.exists(os.path.join(RESULTS, f))]
        if not files:
            continue
        methods, budgets = {}, set()
        for f in files:
            entry = load(f)["models"][model]
            budgets.add(entry["budget_bytes"])
            for method, m in entry["methods"].items():
                methods.setdefault(method, m["max_batch"])  # the compile run took the others'
        if len(budgets) != 1:
            raise SystemExit(f"readme_tables: {' and '.join(files)} ran {model} under different "
                             f"budgets ({', '.join(map(_mib, sorted(budgets)))}); expected one")
        budget = budgets.pop()
        native = {m: methods[m] for m in NATIVE if m in methods}
        if not native or "actpack:auto" not in methods:
            continue
        best = max(native, key=native.get)
        auto = max(methods[m] for m in ("actpack:auto", "actpack:auto+recompute") if m in methods)
        lines.append(
            f"| {name}, {_mib(budget)} | {SUITE_METHODS[best]}: {native[best]} | "
            f"{', '.join(f'{SUITE_METHODS[m]} {b}' for m, b in native.items())} | "
            f"{methods['actpack:auto']} | {methods.get('actpack:auto+recompute', '-')} | "
            f"{auto / native[best]:.2f}x |")
    return "\n".join(lines)


def suite_limits():
    """The limits of packing alone, per model, from the same result files."""
    lines = ["| model | limit | × plain | set by | packed + working set a sample | `auto` reaches "
             "| with `recompute=\"auto\"` | planner `auto` (verified) / `auto+recompute` |",
             "|---|---|---|---|---|---|---|---|"]
    for model, name in SUITE_MODELS.items():
        path = os.path.join(RESULTS, f"suite_cpu_{model}.json")
        if not os.path.exists(path):
            continue
        entry = load(f"suite_cpu_{model}.json")["models"][model]
        limit, worst, methods = entry["limit"], entry["limit"]["worst"], entry["methods"]
        part = (f"block {worst['block']}" if isinstance(worst["block"], int) else worst["block"])
        plain = methods["plain"]["max_batch"]
        auto = methods["actpack:auto"]["max_batch"]
        recomputed = methods.get("actpack:auto+recompute", {}).get("max_batch")
        plan = entry["plan"]
        lines.append(
            f"| {name} | {limit['batch']} | {limit['batch'] / plain:.1f} | {part}, {worst['pass']} "
            f"| {worst['packed_per_sample_bytes'] / 1024:.0f} KiB + "
            f"{worst['working_set_per_sample_bytes'] / 1024:.0f} KiB | "
            f"{auto / limit['batch']:.0%} | "
            + (f"{recomputed / limit['batch']:.0%}" if recomputed else "-")
            + f" | {plan['estimate'].get('auto')} ({plan['verified_auto']}) / "
            f"{plan['estimate'].get('auto+recompute', '-')} |")
    return "\n".join(lines)


TABLES = {"convergence": convergence, "diverging-lm": diverging_lm, "planner": planner,
          "planner-steps": planner_steps, "overhead": overhead,
          "suite-limits": suite_limits}
# A model's suite table once its result file is committed (the ViT's and UNet's are not yet).
TABLES.update({f"suite-{model}{suffix.replace('_', '-')}":
               (lambda model=model, suffix=suffix: suite_table(model, suffix))
               for model in SUITE_MODELS for suffix in ("", "_compile")
               if os.path.exists(os.path.join(RESULTS, f"suite_cpu_{model}{suffix}.json"))})
TABLES["suite-versus-native"] = suite_versus_native


def rendered(text):
    """README text with every table block made from its result file; the names that changed."""
    changed = []

    def replace(match):
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"readme_tables: README.md has a table block {name!r}; expected one "
                             f"of {', '.join(TABLES)}")
        body = TABLES[name]() + "\n"
        if body != match.group("body"):
            changed.append(name)
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(replace, text), changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a table differs from its result file")
    args = parser.parse_args(argv)
    with open(README) as f:
        text = f.read()
    new, changed = rendered(text)
    found = [m.group("name") for m in BLOCK.finditer(text)]
    missing = sorted(set(TABLES) - set(found))
    if missing:
        print(f"readme_tables: README.md has no block for {', '.join(missing)}", file=sys.stderr)
        return 1
    if args.check:
        if changed:
            print("readme_tables: README.md's tables differ from their result files: "
                  f"{', '.join(changed)} (python3 benchmarks/readme_tables.py rewrites them)",
                  file=sys.stderr)
            return 1
        print(f"readme_tables: {len(found)} tables match their result files")
        return 0
    if changed:
        with open(README, "w") as f:
            f.write(new)
    print(f"readme_tables: {', '.join(changed) or 'nothing'} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
