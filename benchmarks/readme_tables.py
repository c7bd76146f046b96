#!/usr/bin/env python3
"""Renders the measured tables of the docs from the committed result files.

docs/results.md is made whole here, from the files in benchmarks/results/ (and the emulator's
tables under codecs/ and runtime/): every table, the command that wrote its file, and the date
and machine as the file records them ("not recorded in the file" where it records none). Other
pages (README.md, docs/gpu.md, any docs/*.md) may show a table between
`<!-- table NAME (benchmarks/readme_tables.py) -->` and `<!-- end table -->`; it is rendered in
place by the same functions.

  python3 benchmarks/readme_tables.py           # write docs/results.md and the pages' tables
  python3 benchmarks/readme_tables.py --check   # exit 1, naming them, if any differ

tests/test_readme_tables.py runs the check, so a figure in the docs cannot drift from its file.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
RESULTS_DOC = os.path.join(DOCS, "results.md")
BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) \(benchmarks/readme_tables\.py\) -->\n)"
                   r"(?P<body>.*?)(<!-- end table -->)", re.S)
NOT_RECORDED = "not recorded in the file"


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def read_lines(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read().splitlines()


def _rel(path):
    """A repository path as docs/results.md links it."""
    return os.path.relpath(os.path.join(ROOT, path), DOCS)


def _machine(m):
    """A result file's machine record, in words."""
    if not m:
        return NOT_RECORDED
    parts = []
    if m.get("device"):
        parts.append(m["device"])
    if m.get("cpu"):
        parts.append(m["cpu"])
    elif m.get("processor"):
        parts.append(m["processor"])
    if m.get("cpus"):
        parts.append(f"{m['cpus']} CPUs")
    if m.get("threads"):
        parts.append(f"{m['threads']} threads")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    return ", ".join(parts) or NOT_RECORDED


def _commit(d):
    """A result file's commit record (benchmarks/provenance.py), in words."""
    if not d.get("commit"):
        return NOT_RECORDED
    return f"`{d['commit'][:10]}`" + (" with uncommitted changes in the tree" if d.get("dirty")
                                       else "")


def provenance(path, command=None, date=None, machine=None, commit=None):
    """One line: the file, its command, commit, when and where it was measured (as the file
    says)."""
    return (f"File [`{path}`]({_rel(path)}); command: "
            + (f"`{command}`" if command else NOT_RECORDED)
            + f"; commit: {commit or NOT_RECORDED}"
            + f"; measured: {date or NOT_RECORDED}; machine: {machine or NOT_RECORDED}.")


def _measured(d):
    """(date, machine record) of a result file or row: benchmarks/provenance.py's "date" and
    "machine", or an older file's "measured" (a date, or a dict with the date and the
    machine's fields)."""
    if d.get("date") or isinstance(d.get("machine"), dict):
        return d.get("date"), d.get("machine")
    measured = d.get("measured")
    if isinstance(measured, dict):
        return measured.get("date"), measured
    return measured, d.get("machine")


# ---------------------------------------------------------------------------------------------
# The CPU result files.

def convergence():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from convergence import markdown
    return markdown(load("convergence.json"))


def convergence_source():
    d = load("convergence.json")
    date, machine = _measured(d)
    machine = _machine(machine or {"torch": d.get("torch"), "threads": d.get("threads")})
    return provenance("benchmarks/results/convergence.json", d.get("command"), date, machine,
                      _commit(d))


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


def diverging_lm_source():
    d = load("diverging_lm.json")
    date, machine = _measured(d)
    return provenance("benchmarks/results/diverging_lm.json", d.get("command"), date,
                      _machine(machine or {"torch": d.get("torch")}), _commit(d))


FRONTIER_MODELS = {"resnet50": "ResNet-50", "vit-b16": "ViT", "gpt2-small": "GPT",
                   "unet": "UNet"}


def frontier():
    """benchmarks/frontier.py's rows: per codec and model, bits stored per value, the saved
    activations' relative RMS error and the gradient's cosine against the exact step's."""
    d = load("frontier.json")
    models = list(dict.fromkeys(r["model"] for r in d["rows"]))
    codecs = list(dict.fromkeys(r["codec"] for r in d["rows"]))
    by = {(r["model"], r["codec"]): r for r in d["rows"]}
    lines = ["| codec | " + " | ".join(f"{FRONTIER_MODELS.get(m, m)}: bits, error, cosine"
                                      for m in models) + " |",
             "|---|" + "---|" * len(models)]
    for codec in codecs:
        cells = []
        for m in models:
            r = by.get((m, codec))
            spread = (f" ({r['grad_cosine_min']:.2f}-{r['grad_cosine_max']:.2f})"
                      if r is not None and "grad_cosine_min" in r else "")
            cells.append("-" if r is None else f"{r['bits_per_value']:.2f}, {r['rel_error']:.3f}, "
                                               f"{r['grad_cosine']:.4f}{spread}")
        lines.append(f"| `{codec}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def frontier_draws():
    """What the file's gradient cosines are: one encode's, or a mean over several."""
    draws = load("frontier.json").get("draws", 1)
    if draws == 1:
        return ("Each row is one encode: near a relative error of 0.4 two encodes of equal error "
                "(a `sim:dct` row and its codec's) differ by up to 0.12 in the cosine, so only "
                "wider gaps mean something (`--draws` averages several).")
    return (f"Error and cosine are means over {draws} encodes with different seeds, the "
            "cosines' range in brackets: only gaps wider than the ranges mean something.")


def frontier_source():
    d = load("frontier.json")
    date, machine = _measured(d)
    return provenance("benchmarks/results/frontier.json", d.get("command"), date,
                      _machine(machine), _commit(d))


def _truth_search(r):
    """How a planner row's truth was found, in words."""
    search = r.get("truth_search")
    if not search:
        return "searched from the planner's answer (bisection)"
    tries = r["truth_tries"]
    return (f"{search['strategy']} of [{search['low']}, {search['high']}]: {len(tries)} tries, "
            f"{r['truth_seconds'] / 60:.0f} min")


def planner():
    data = load("planner.json")
    lines = ["| model, budget, choice | planner | truth | planner / truth | how the truth was "
             "found | planner's steps | its tries | its measured headroom |",
             "|---|---|---|---|---|---|---|---|"]
    for r in (r for r in data["rows"] if "truth" in r):
        lines.append(f"| {r['model']}, {r['budget']}, `{r['codec']}` | {r['estimate']} | "
                     f"{r['truth']} | {r['estimate'] / r['truth']:.2f} | {_truth_search(r)} | "
                     f"{r['steps_run']} | {r['calibration_tries']} | {r['headroom']:.1%} |")
    return "\n".join(lines)


def planner_tries():
    """Each scanned truth's tries: the batches that did not train, and the cost."""
    data = load("planner.json")
    lines = ["| model, budget, choice | truth | batches tried that did not train (step it ran "
             "out in) | above the planner's answer, tried and trained | "
             "seconds: all tries (largest try) |",
             "|---|---|---|---|---|"]
    scanned = [r for r in data["rows"] if r.get("truth_search")]
    if not scanned:
        return "No row's truth has been scanned yet: every truth above was searched from the " \
               "planner's answer."
    for r in scanned:
        tries = r["truth_tries"]
        failed = ", ".join(f"{t['batch']}" + (f" ({t['ran_out_in_step']})"
                                              if t.get("ran_out_in_step") else "")
                           for t in sorted(tries, key=lambda t: t["batch"])
                           if not t.get("fits") and t["batch"] <= 2 * r["truth"])
        beyond = [t["batch"] for t in tries if not t.get("fits") and t["batch"] > 2 * r["truth"]]
        if beyond:
            failed += f"; and {len(beyond)} more from {min(beyond)} to {max(beyond)}"
        above = [t["batch"] for t in tries if t.get("fits") and t["batch"] > r["estimate"]]
        lines.append(f"| {r['model']}, {r['budget']}, `{r['codec']}` | {r['truth']} | {failed} | "
                     f"{', '.join(map(str, sorted(above))) or '-'} | {r['truth_seconds']:.0f} "
                     f"({max(t['seconds'] for t in tries):.0f}) |")
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


def planner_source():
    rows = load("planner.json")["rows"]
    dates = sorted({_measured(r)[0] or NOT_RECORDED for r in rows})
    machines = sorted({_machine(_measured(r)[1]) for r in rows})
    commands = "\n".join(f"    {r.get('command') or NOT_RECORDED}  # {_measured(r)[0]}, "
                         f"commit {r['commit'][:10] if r.get('commit') else NOT_RECORDED}" for r in rows)
    return (f"File [`benchmarks/results/planner.json`]({_rel('benchmarks/results/planner.json')}), "
            f"one command per row; measured: {', '.join(dates)}; machine: "
            f"{'; '.join(machines)}. The rows' commands, dates and commits:\n\n{commands}")


def _ratio_spread(ratios):
    """'1.12x (0.87-1.31x)': the median over rounds and their range; a file that kept one
    ratio (of the medians over all rounds) says so."""
    if ratios["n"] == 1:
        return f"{ratios['median']:.2f}x (medians over all rounds; no per-round record)"
    return f"{ratios['median']:.2f}x ({ratios['min']:.2f}-{ratios['max']:.2f}x)"


def _over_plain(d):
    """Each row's step time over plain's as a spread over rounds: the file's "over_plain", or
    from a file written before it, which kept auto's per-round ratios and only the overall
    medians of the others."""
    if "over_plain" in d:
        return d["over_plain"]
    sys.path.insert(0, ROOT)
    from benchmarks.spread import spread
    plain = d["plain_seconds"]
    ratios = {"auto": spread(d["auto_over_plain_per_round"]),
              "none": spread([d["none"]["wall"] / plain])}
    if d.get("accumulate"):
        ratios["accumulate"] = spread([d["accumulate"]["wall"] / plain])
    return ratios


def overhead():
    """benchmarks/overhead.py's rows, one line per model (every row in actpack's pool): each
    ratio to plain per round, as the rounds' median and range; the upper quartile is what a
    claim "at most" uses."""
    names = {"gpt2-small": "GPT-2-small-like", "resnet50": "ResNet-50"}
    lines = ["| model, batch, budget | plain | `none` / plain | `auto` / plain "
             "| `auto` / plain, upper quartile of rounds "
             "| plain accumulating micro-batches / plain | auto: codecs "
             "| hooks (no codecs) | end of step | the model's own work "
             "| page faults a step (plain / auto) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in names:
        d = load(f"overhead_{model}.json")
        plain, auto, ratios = d["plain_seconds"], d["auto"], _over_plain(d)
        acc = d.get("accumulate")
        accumulated = (f"{_ratio_spread(ratios['accumulate'])} ({acc['micro_steps']} of "
                       f"{acc['micro_batch']})" if acc else "-")
        lines.append(f"| {names[model]}, {d['batch']}, {d['budget'].replace('MiB', ' MiB')} "
                     f"| {plain:.3f} s | {_ratio_spread(ratios['none'])} "
                     f"| {_ratio_spread(ratios['auto'])} | {ratios['auto']['q3']:.2f}x "
                     f"({ratios['auto']['n']} rounds) | {accumulated} | {auto['codec']:.3f} s "
                     f"| {auto['hooks']:.3f} s | {auto['end_of_step']:.3f} s "
                     f"| {auto['model']:.3f} s "
                     f"| {d['plain_minor_faults']:,.0f} / {auto['minor_faults']:,.0f} |")
    return "\n".join(lines)


def overhead_source():
    lines = []
    for model in ("gpt2-small", "resnet50"):
        d = load(f"overhead_{model}.json")
        date, machine = _measured(d)
        lines.append("- " + provenance(f"benchmarks/results/overhead_{model}.json", d.get("command"),
                                       date, _machine(machine), _commit(d)))
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


def _suite_files(suffixes=("", "_compile")):
    """(model, suffix) of every committed suite result file, in SUITE_MODELS' order."""
    return [(model, suffix) for model in SUITE_MODELS for suffix in suffixes
            if os.path.exists(os.path.join(RESULTS, f"suite_cpu_{model}{suffix}.json"))]


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
        if r.get("time_vs_plain_range") and not r.get("error"):
            time += " ({:.2f}-{:.2f})".format(*r["time_vs_plain_range"])
        lines.append(f"| {name} | {batch} | {f(r.get('vs_plain'), '.2f')} | "
                     f"{f(r.get('vs_checkpoint'), '.2f')} | {time} | "
                     f"{f(r.get('min_cosine'), '.4f')} | {f(own, '.4f')} | "
                     f"{f(r.get('final_loss'), '.3f')} |")
    return "\n".join(lines)


def suite_source(model, suffix=""):
    d = load(f"suite_cpu_{model}{suffix}.json")
    date, _ = _measured(d)
    searched = ("each largest batch by `actpack.search`'s scan of the whole range"
                if d.get("search") == "scan" else
                "each largest batch bracketed from the planner's answer and bisected to 4% "
                "(no scan: a batch above a failing one was not tried)")
    return provenance(f"benchmarks/results/suite_cpu_{model}{suffix}.json", d.get("command"),
                      date, _machine(d.get("machine")), _commit(d)) + f" Search: {searched}."


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


SOAK = re.compile(r"soak (?P<codec>\S+) at (?P<budget>\S+), (?P<steps>\d+) steps: reserved peak "
                  r"(?P<warm>[\d.]+) MiB in the warm-up, (?P<after>[\d.]+) MiB after; resident "
                  r"set (?P<rss_warm>[\d.]+) MiB, then (?P<rss_max>[\d.]+) MiB at most and "
                  r"(?P<rss_end>[\d.]+) MiB at the end; packed tensors alive between steps: "
                  r"(?P<alive>\d+)")


def _soak_run():
    """The first run in soak_2000.txt (a later `# ...` header starts an older one)."""
    lines = read_lines("benchmarks/results/soak_2000.txt")
    header, rows = lines[0].lstrip("# "), []
    for line in lines[1:]:
        if line.startswith("#"):
            break
        match = SOAK.match(line)
        if match:
            rows.append(match.groupdict())
    return header, rows


def soak():
    lines = ["| codec, budget | steps | reserved peak: warm-up / after | resident set: warm-up / "
             "most after / end | packed tensors alive between steps |", "|---|---|---|---|---|"]
    for r in _soak_run()[1]:
        lines.append(f"| `{r['codec']}`, {r['budget']} | {int(r['steps']):,} | {r['warm']} / "
                     f"{r['after']} MiB | {r['rss_warm']} / {r['rss_max']} / {r['rss_end']} MiB "
                     f"| {r['alive']} |")
    return "\n".join(lines)


def soak_source():
    header = _soak_run()[0]
    return (f"File [`benchmarks/results/soak_2000.txt`]({_rel('benchmarks/results/soak_2000.txt')}),"
            f" whose first line says: \"{header}\".")


STAGE = re.compile(r"^\s*(?P<seconds>\d+) s\s+(?P<stage>.+)$")


def _ci_runs():
    """benchmarks/results/ci_time_*.txt: (file, header lines, {stage: s}, total, summary)."""
    runs = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "ci_time_*.txt"))):
        lines = read_lines(os.path.relpath(path, ROOT))
        header = [l.lstrip("# ") for l in lines if l.startswith("#")]
        stages = {m.group("stage"): int(m.group("seconds"))
                  for m in map(STAGE.match, lines) if m}
        total = next((int(m.group(1)) for m in (re.search(r"total (\d+) s", l) for l in lines)
                      if m), None)
        summary = next((l for l in reversed(lines) if re.search(r"\d+ passed", l)), "")
        runs.append((os.path.basename(path), header, stages, total, summary))
    return runs


def ci_time():
    runs = _ci_runs()
    lines = ["| stage of `bash tools/test.sh` | " + " | ".join(f"`{r[0]}`" for r in runs) + " |",
             "|---|" + "---|" * len(runs)]
    stages = []
    for run in runs:
        stages += [s for s in run[2] if s not in stages]
    for stage in stages:
        lines.append(f"| {stage} | " + " | ".join(
            f"{run[2][stage]:,} s" if stage in run[2] else "-" for run in runs) + " |")
    lines.append("| **total** | " + " | ".join(
        f"**{run[3]:,} s**" if run[3] is not None else "-" for run in runs) + " |")
    lines.append("| pytest's summary | " + " | ".join(
        re.sub(r" in [\d.]+s.*", "", run[4]) or "-" for run in runs) + " |")
    return "\n".join(lines)


def ci_time_source():
    return "\n".join(f"- [`{name}`]({_rel('benchmarks/results/' + name)}): " + "; ".join(header)
                     for name, header, *_ in _ci_runs())


# ---------------------------------------------------------------------------------------------
# The GPU runs (benchmarks/results/gpu_*/, each one session's unedited output) and what the
# CUDA emulator predicts (codecs/cuda/traffic_16MiB.tsv, runtime/testdata/host_waits.txt).

def _gpu_runs():
    """Each run's folder: a gpu_* folder, or the folders in it that hold a tools/gpu_check.sh
    manifest (one session's several calls)."""
    runs = []
    for folder in sorted(glob.glob(os.path.join(RESULTS, "gpu_*"))):
        if not os.path.isdir(folder):
            continue
        calls = sorted(os.path.dirname(p)
                       for p in glob.glob(os.path.join(folder, "*", "manifest.json")))
        runs += [os.path.relpath(p, ROOT) for p in calls or [folder]]
    return runs


def _gpu_manifest(run):
    path = os.path.join(ROOT, run, "manifest.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _gpu_file(run, name):
    path = os.path.join(run, name)
    return read_lines(path) if os.path.exists(os.path.join(ROOT, path)) else None


def _gpu_date(run):
    """The date a run's README.md gives in its title, "... (2026-11-26)"."""
    title = (_gpu_file(run, "README.md") or [""])[0]
    match = re.search(r"\((\d{4}-\d\d-\d\d)\)", title)
    return match.group(1) if match else NOT_RECORDED


def _gpu_device(run):
    """device.txt: nvidia-smi's CSV line and torch's versions."""
    lines = _gpu_file(run, "device.txt") or []
    device = lines[1].split(",") if len(lines) > 1 else []
    name = device[0].strip() if device else NOT_RECORDED
    driver = f", driver {device[2].strip()}" if len(device) > 2 else ""
    torch_line = f", {lines[2].strip()}" if len(lines) > 2 else ""
    return f"{name}{driver}{torch_line}"


def _table_rows(lines, first_column):
    """The whitespace-separated rows of a tool's printed table whose first cell is in
    `first_column` (warnings interleaved by the profiler are skipped)."""
    return [l.split() for l in lines if l.split() and l.split()[0] in first_column]


def gpu_runs():
    lines = ["| run | measured | device | GPU tests (`pytest -m gpu`; a GPU check's stages) "
             "| the demo on the GPU |",
             "|---|---|---|---|---|"]
    for run in _gpu_runs():
        manifest = _gpu_manifest(run)
        if manifest is not None:  # tools/gpu_check.sh: its stages and their tests
            meta = manifest.get("meta", {})
            stages = "; ".join(
                f"{st['name']} {st['outcome']}" + (
                    " ({})".format(", ".join(f"{n} {k}" for k, n in st["tests"]["counts"].items()
                                             if n))
                    if st.get("tests") else "")
                for st in manifest.get("stages", []))
            lines.append(f"| [`{os.path.relpath(os.path.join(ROOT, run), RESULTS)}`]({_rel(run)}) | "
                         f"{meta.get('started', NOT_RECORDED)[:10]} | "
                         f"{meta.get('device', NOT_RECORDED)}, torch {meta.get('torch', '?')} | "
                         f"{stages} | - |")
            continue
        tests = _gpu_file(run, "gpu_tests.txt") or []
        summary = next((re.sub(r" in [\d.]+s.*", "", l.strip("= "))
                        for l in reversed(tests) if re.search(r"\d+ (passed|failed)", l)), "-")
        demo = _gpu_file(run, "demo.txt") or []
        final = next((l for l in demo if l.startswith("final loss:")), None)
        error = next((l for l in reversed(demo) if re.match(r"\w+Error:", l)), None)
        shown = final or (f"failed: {error.split('. ')[0]}" if error else "-")
        lines.append(f"| [`{os.path.basename(run)}`]({_rel(run)}) | {_gpu_date(run)} | "
                     f"{_gpu_device(run)} | {summary} | {shown} |")
    return "\n".join(lines)


def gpu_sync():
    """Host waits per steady training step, per run (tools/gpu_sync_check.py)."""
    columns = []
    for run in _gpu_runs():
        for name in ("sync_check.txt", "sync_check_after_fix.txt"):
            lines = _gpu_file(run, name)
            if lines:
                columns.append((f"`{os.path.basename(run)}/{name}`",
                                {(r[0], r[1]): (r[2], r[3] if r[3] != "<=" else "<= " + r[4])
                                 for r in _table_rows(lines, ("cnn", "gpt"))}))
    keys = []
    for _, rows in columns:
        keys += [k for k in rows if k not in keys]
    lines = ["| model | codec | predicted (emulator) | "
             + " | ".join(name for name, _ in columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for key in keys:
        predicted = next((rows[key][1] for _, rows in reversed(columns) if key in rows), "-")
        lines.append(f"| {key[0]} | {key[1]} | {predicted} | "
                     + " | ".join(rows[key][0] if key in rows else "-" for _, rows in columns)
                     + " |")
    return "\n".join(lines)


def gpu_codecs():
    """Codec throughput as a fraction of a device-to-device copy (tools/gpu_benchmark.py)."""
    lines = ["| run | codec | size | copy GB/s | encode / copy | decode / copy | device time "
             "only: encode / copy, decode / copy | emulator's estimate: encode, decode |",
             "|---|---|---|---|---|---|---|---|"]
    for run in _gpu_runs():
        table = _gpu_file(run, "benchmark.txt")
        if not table:
            continue
        header = next(l for l in table if l.startswith("codec"))
        # "kern enc", "kern dec": the device's own time, in the files that have those columns.
        names = (["codec", "size", "copy", "enc", "dec", "enc/copy", "dec/copy", "e+d/copy",
                  "ratio"] + (["kern_enc", "kern_dec"] if "kern enc" in header else [])
                 + ["pred_enc", "pred_dec"])
        for cells in (l.split() for l in table):
            if len(cells) != len(names) or not re.match(r"\d+MiB$", cells[1]):
                continue
            r = dict(zip(names, cells))
            kernel = f"{r['kern_enc']}, {r['kern_dec']}" if "kern_enc" in r else "-"
            lines.append(f"| {os.path.basename(run)} | {r['codec']} | {r['size']} | {r['copy']} | "
                         f"{r['enc/copy']} | {r['dec/copy']} | {kernel} | "
                         f"{r['pred_enc']}, {r['pred_dec']} |")
    return "\n".join(lines)


def gpu_allocator():
    """Recorded training steps replayed on each allocator (tools/gpu_allocator_benchmark.py)."""
    lines = ["| run | trace | allocator | C++ ns per malloc/free | × torch's | reserved at the peak "
             "| requested |", "|---|---|---|---|---|---|---|"]
    for run in _gpu_runs():
        table = _gpu_file(run, "allocator_benchmark.txt")
        if not table:
            continue
        for r in (l.split() for l in table if l.split() and l.split()[0].endswith(".trace")):
            lines.append(f"| {os.path.basename(run)} | {r[0]} | {r[1]} | {r[3]} | {r[4]} | "
                         f"{r[8]} MiB | {r[6]} MiB |")
    return "\n".join(lines)


def gpu_demo():
    """The demo's summary lines on the GPU, as it printed them."""
    picked = []
    for run in _gpu_runs():
        demo = _gpu_file(run, "demo.txt") or []
        keep = [l for l in demo if l.startswith(("actpack demo:", "plain PyTorch peaked",
                                                 "peak memory per step", "wall time",
                                                 "final loss", "verified:"))]
        if any(l.startswith("final loss") for l in keep):
            picked.append(f"# {os.path.basename(run)}/demo.txt")
            picked += keep
    return "```\n" + "\n".join(picked) + "\n```"


WAITS = re.compile(r"^(?P<when>before|after):\s+host waits per step, (?P<codec>\S+) "
                   r"(?P<model>\S+): (?P<steps>.*)$")


def emulated_waits():
    """runtime/testdata/host_waits.txt: blocking calls per step on the CUDA emulator."""
    counts = {}
    for line in read_lines("runtime/testdata/host_waits.txt"):
        match = WAITS.match(line)
        if not match:
            continue
        steps = [tuple(int(n) for n in s) for s in
                 re.findall(r"\[pack (\d+), unpack (\d+), end (\d+)\]", match.group("steps"))]
        counts.setdefault((match.group("model"), match.group("codec")), {})[
            match.group("when")] = steps
    lines = ["| step pattern | codec | before: blocking calls per step (pack + unpack) | now: per "
             "step, packs + unpacks + step end | now: profile steps (0-2) |",
             "|---|---|---|---|---|"]
    names = {"resnet": "ResNet-shaped", "gpt": "GPT-shaped"}
    for (model, codec), runs in sorted(counts.items(), key=lambda kv: (kv[0][0] != "resnet",
                                                                      kv[0])):
        before, after = runs.get("before"), runs.get("after")
        b = f"{sum(before[-1])} ({before[-1][0]} + {before[-1][1]})" if before else "-"
        a = (f"{sum(after[-1])} ({after[-1][0]} + {after[-1][1]} + {after[-1][2]})"
             if after else "-")
        profile = ", ".join(str(sum(s)) for s in after[:3]) if after else "-"
        lines.append(f"| {names.get(model, model)} | {codec} | {b} | {a} | {profile} |")
    return "\n".join(lines)


def roofline():
    """codecs/cuda/traffic_16MiB.tsv's per-codec rows: launches, DRAM bytes, and the roofline
    estimate as a fraction of a device-to-device copy."""
    lines = [l for l in read_lines("codecs/cuda/traffic_16MiB.tsv")
             if l.strip() and not l.startswith("#")]
    header = lines[0].split("\t")
    summary = {}
    for line in lines[1:]:
        r = dict(zip(header, line.split("\t")))
        if r["kernel"] == "(all)":
            summary[(r["codec"], r["dtype"], r["phase"])] = r
    out = ["| codec | dtype | encode: launches, DRAM bytes per input byte | H100 | A100 | "
           "decode: launches, DRAM bytes per input byte | H100 | A100 |",
           "|---|---|---|---|---|---|---|---|"]
    for (codec, dtype, phase), e in summary.items():
        if phase != "encode":
            continue
        d = summary[(codec, dtype, "decode")]
        out.append(f"| {codec} | {dtype} | {e['launches']}, "
                   f"{float(e['dram_per_input_byte']):.2f} | {e['h100_fraction_of_copy']} | "
                   f"{e['a100_fraction_of_copy']} | {d['launches']}, "
                   f"{float(d['dram_per_input_byte']):.2f} | {d['h100_fraction_of_copy']} | "
                   f"{d['a100_fraction_of_copy']} |")
    return "\n".join(out)


def roofline_source():
    first = read_lines("codecs/cuda/traffic_16MiB.tsv")[0].lstrip("# ")
    return (f"File [`codecs/cuda/traffic_16MiB.tsv`]({_rel('codecs/cuda/traffic_16MiB.tsv')}), "
            f"whose first line says: \"{first}\"; machine: the CUDA emulator (no GPU).")


TABLES = {"convergence": convergence, "diverging-lm": diverging_lm, "planner": planner,
          "planner-tries": planner_tries, "planner-steps": planner_steps, "overhead": overhead,
          "suite-limits": suite_limits, "soak": soak, "ci-time": ci_time,
          "gpu-runs": gpu_runs, "gpu-sync": gpu_sync, "gpu-codecs": gpu_codecs,
          "gpu-allocator": gpu_allocator, "gpu-demo": gpu_demo,
          "emulated-waits": emulated_waits, "roofline": roofline, "frontier": frontier}
# A model's suite table once its result file is committed (the ViT's and UNet's are not yet).
TABLES.update({f"suite-{model}{suffix.replace('_', '-')}":
               (lambda model=model, suffix=suffix: suite_table(model, suffix))
               for model, suffix in _suite_files()})
TABLES["suite-versus-native"] = suite_versus_native


# ---------------------------------------------------------------------------------------------
# docs/results.md, whole.

def _section(title, text, source, *tables):
    parts = [f"## {title}", text.strip()]
    if source:
        parts.append(source)
    parts += list(tables)
    return "\n\n".join(parts)


def _suite_sections():
    parts = []
    for model, suffix in _suite_files():
        name = f"suite-{model}{suffix.replace('_', '-')}"
        what = ("the `torch.compile` methods, run on their own with plain and checkpointing "
                "timed again beside them and the other methods' largest batches taken from the "
                "main run" if suffix else "the main run")
        parts.append(f"**{SUITE_MODELS[model]}**, {what}. {suite_source(model, suffix)}\n\n"
                     f"{TABLES[name]()}")
    return "\n\n".join(parts)


# What the docs describe without a committed result file (see the last section of results.md).
UNRECORDED = [
    ("the demo's two runs side by side", "bash tools/demo.sh"),
    ("the training loops of the integrations under a budget",
     "cd tests && python3 -m pytest -s test_transformers.py test_lightning.py test_fsdp.py; "
     "bazel test //torch_plugin:budget_test --test_output=all"),
    ("the resident set against the budget, in a fresh process",
     "python3 tools/budget_check.py rss --model M --batch B --budget X --codec auto --steps 6"),
    ("codec ratio and error on the demo models' activations",
     "python3 tools/measure_codecs.py --model cnn --steps 20"),
    ("CPU codec throughput beside memcpy",
     "bazel run -c opt //codecs:codecs_benchmark -- --sizes=16777216 --rounds=11"),
    ("codec throughput through the package", "python3 tools/package_speed.py"),
    ("the saved-tensor hooks' cost per tensor", "python3 tools/hook_overhead.py"),
]


def results_doc():
    """docs/results.md, made from the result files alone."""
    sections = [
        "# Measured results\n\n"
        "<!-- Generated by `python3 benchmarks/readme_tables.py` from the committed result "
        "files; do not edit by hand (tests/test_readme_tables.py checks it). -->\n\n"
        "Every table here is rendered from a committed result file by `python3 "
        "benchmarks/readme_tables.py` (`--check` compares, and CI runs it through "
        "`tests/test_readme_tables.py`). Each section names its file, the command that wrote "
        "it, and the date and machine as the file records them. Runs on a GPU are in "
        "[gpu.md](gpu.md); what the options mean is in [guide.md](guide.md).",
        _section(
            "Largest batch against what PyTorch offers",
            "Per model, the largest batch that trains under the budget's cap (real steps, each "
            "try in a fresh process) for the best PyTorch-native way to save activation memory "
            "(per-block and selective activation checkpointing, `torch.compile`'s activation "
            "memory budget), and for actpack's `auto` with and without "
            "`recompute=\"auto\"`. From the suite's files below.",
            None, TABLES["suite-versus-native"]()),
        _section(
            "The model suite",
            "`benchmarks/suite.py` (or `bash benchmarks/run.sh`, which installs what it needs) "
            "trains each model of `benchmarks/models.py` plainly, with activation "
            "checkpointing, with bf16 autocast and under actpack's codecs, on the CPU here. "
            "Columns: the largest batch that trains under the budget (each try in a fresh "
            "process, searched as each file's line says; \"101 (103)\" means 101 trained and "
            "104 did not), that batch against plain PyTorch's and against per-block "
            "checkpointing's, the step time at checkpointing's largest batch relative to plain "
            "PyTorch's in the same host pool (the median of the method's timed steps over "
            "plain's, and where the file has each step's time their range against plain's "
            "median; the methods run one after another, not in rounds, so a drift of the "
            "machine moves them apart: the overhead table below is the measurement of time), "
            "the worst parameter group's gradient cosine "
            "against exact training at that batch and at the method's own largest batch, and "
            "the loss after 8 steps from the same start. The budget counts everything the step "
            "allocates but the weights.",
            None, _suite_sections(),
            "![largest batch under the budget relative to plain]"
            "(../benchmarks/results/benchmark.svg)\n\n"
            "(`python3 benchmarks/suite.py --picture benchmarks/results/suite_cpu_*.json --out "
            "benchmarks/results`.)",
            "**Limits of packing alone.** The largest batch whose allocated bytes would fit "
            "the budget at the harshest codecs `auto`'s fidelity floor allows, with nothing "
            "lost to fragmentation or to memory outside the pool, measured per block (and stem "
            "and head) of the model; the part that allows the fewest samples sets it. The last "
            "column is `actpack.plan` in the suite's process.\n\n" + TABLES["suite-limits"]()),
        _section(
            "Where `auto`'s time goes (CPU)",
            "`benchmarks/overhead.py` runs one suite model at checkpointing's largest batch, "
            "every row in actpack's host pool, the rows taking turns round by round so that "
            "the machine's drift slows each alike. Each ratio is taken per round (the median "
            "of the row's 4 steps over the median of plain's in that round) and shown as the "
            "median over the rounds with their range (min-max); the seconds are medians over "
            "every round's steps. A claim that `auto` costs at most some multiple of plain's "
            "step time is made on the upper quartile of the rounds, not their median. The "
            "`auto` step is split by actpack's own clocks; \"plain accumulating\" reaches "
            "the same batch with gradient accumulation over micro-batches of plain's largest "
            "batch under the budget.",
            overhead_source(), TABLES["overhead"]()),
        _section(
            "The planner against the truth",
            "The planner's answer is `actpack.plan(...)` for one choice without `verify`; the "
            "truth is the largest batch that trains the file's `steps` steps under the cap, "
            "each try in a fresh process (`tools/budget_check.py plan`), found independently "
            "of the planner's answer by `actpack.search`'s scan of the whole range (a grid, "
            "finer around the largest batch that trained, then every batch up to the next "
            "that did not; fits are not monotone in the batch, so no bisection). A row whose "
            "truth was \"searched from the planner's answer\" predates the scan and may sit "
            "nearer the answer than the largest batch that trains. \"planner's steps\" counts "
            "the plan's calls of `step`; \"its tries\" its tries under the cap; the headroom "
            "is the share of the budget its line leaves free at its answer. `gpt-d4w64` and "
            "`vit-d4w64` are the suite's GPT and ViT at depth 4 and width 64, their blocks "
            "`actpack.recompute` regions. The second table lists each scan's batches that did "
            "not train up to twice the truth (with the step each ran out in) and those above "
            "the planner's answer that did; the third is the default plan (every choice) and "
            "what it costs.",
            planner_source(), TABLES["planner"](), TABLES["planner-tries"](),
            TABLES["planner-steps"]()),
        _section(
            "Training to the end: convergence on real data",
            "Whole training runs from scratch on the CPU, mean ± standard deviation over seeds, "
            "the same batches and initial weights per seed for every method: a 6-layer CNN with "
            "batch norm on scikit-learn's handwritten digits (test accuracy, higher is better) "
            "and a byte-level GPT of 4 blocks on the Python standard library (validation loss, "
            "lower is better). `auto@50%` and `auto@30%` run under that share of plain "
            "training's reserved peak; \"did not fit\" means actpack raised "
            "`torch.OutOfMemoryError` with the smallest budget that would work. The table alone: "
            "`python3 benchmarks/convergence.py --render benchmarks/results/convergence.json`.",
            convergence_source(), TABLES["convergence"](),
            "![loss curves](../benchmarks/results/convergence.svg)"),
        _section(
            "Codecs on real activations: error per byte",
            "`benchmarks/frontier.py` trains each suite model on real data (the photographs "
            "scikit-image ships and scikit-learn's handwritten digits, cropped and resized; "
            "the standard library's text for the GPT), then runs one more step exactly and "
            "once per codec with every saved activation of at least 64 KiB replaced by its "
            "decoded copy (a ReLU's backward reading its own exact mask, as in actpack's "
            "session). Per model: bits stored per value (float32 is 32), the relative RMS "
            "error over those tensors, and the cosine of the parameters' gradient against the "
            "exact step's. `sim:dft` rows are DIVISION with a DFT low part (the retired "
            "`division_fft`), `sim:dct` the same computation for `division_dct`, which shows "
            "the simulation agrees with the codec. " + frontier_draws() + " "
            "Why `division_dct` keeps a cosine "
            "transform: [codecs/FORMAT.md](../codecs/FORMAT.md#division_dct-10).",
            frontier_source(), TABLES["frontier"](),
            "![error against bytes per model](../benchmarks/results/frontier.svg)"),
        _section(
            "A run that diverges under 2 bits",
            "A byte-level GPT (2 pre-norm blocks) trained with AdamW at a high learning rate, one "
            "seed; the rows at 72 MiB run where plain training does not fit. \"stopped by the "
            "guard\" is `actpack.GradientRunaway` (the gradient guard, "
            "[guide](guide.md#the-gradient-guard)).",
            diverging_lm_source(), TABLES["diverging-lm"]()),
        _section(
            "Memory over a long run (the soak)",
            "A 2-layer transformer LM trained for the given steps under each codec; the test "
            "(`tests/test_soak.py`, 200 steps in the test command) fails when a codec's "
            "reserved bytes grow past the warm-up by more than one segment or its resident set "
            "by 8 MiB.",
            soak_source(), TABLES["soak"]()),
        _section(
            "The test command's time per stage",
            "`bash tools/test.sh` (what `.ci/run` runs) on a clean clone; each file's first "
            "lines say which commit, machine and date.",
            ci_time_source(), TABLES["ci-time"]()),
        _section(
            "The demo's memory",
            "`actpack plot run.json -o benchmarks/results/demo_memory.svg` on a report of "
            "`bash tools/demo.sh`: per step, activations raw and stored, the reserved and "
            "allocated peak, and the budget.",
            None, "![memory of the demo run](../benchmarks/results/demo_memory.svg)"),
        _section(
            "Measurements with no result file",
            "These commands measure something the docs describe, but no output of theirs is "
            "committed under `benchmarks/results/`, so no figures of theirs are shown here. "
            "Committing an output (with its command, commit and machine) and a table function "
            "in `benchmarks/readme_tables.py` brings one in.",
            None, "\n".join(f"- {what}: `{command}`" for what, command in UNRECORDED)),
    ]
    return "\n\n".join(sections) + "\n"


# ---------------------------------------------------------------------------------------------

def pages():
    """The pages that may hold table blocks: README.md, CONTRIBUTING.md, codecs/FORMAT.md,
    docs/*.md but results.md (made whole)."""
    paths = [README, os.path.join(ROOT, "CONTRIBUTING.md"), os.path.join(ROOT, "codecs", "FORMAT.md")]
    paths += sorted(p for p in glob.glob(os.path.join(DOCS, "*.md")) if p != RESULTS_DOC)
    return [p for p in paths if os.path.exists(p)]


def rendered(text, where="README.md"):
    """A page's text with every table block made from its result file; the names that
    changed."""
    changed = []

    def replace(match):
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"readme_tables: {where} has a table block {name!r}; expected one "
                             f"of {', '.join(TABLES)}")
        body = TABLES[name]() + "\n"
        if body != match.group("body"):
            changed.append(name)
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(replace, text), changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page differs from its result files")
    args = parser.parse_args(argv)
    stale, writes = [], {}
    expected = results_doc()
    current = open(RESULTS_DOC).read() if os.path.exists(RESULTS_DOC) else None
    if current != expected:
        stale.append("docs/results.md")
        writes[RESULTS_DOC] = expected
    blocks = 0
    for path in pages():
        where = os.path.relpath(path, ROOT)
        with open(path) as f:
            text = f.read()
        new, changed = rendered(text, where)
        blocks += len(BLOCK.findall(text))
        if changed:
            stale.append(f"{where} ({', '.join(changed)})")
            writes[path] = new
    if args.check:
        if stale:
            print("readme_tables: these differ from their result files: "
                  f"{'; '.join(stale)} (python3 benchmarks/readme_tables.py rewrites them)",
                  file=sys.stderr)
            return 1
        print(f"readme_tables: docs/results.md and {blocks} tables in other pages match their "
              "result files")
        return 0
    for path, text in writes.items():
        with open(path, "w") as f:
            f.write(text)
    print(f"readme_tables: {'; '.join(stale) or 'nothing'} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
