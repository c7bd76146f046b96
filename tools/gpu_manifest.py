#!/usr/bin/env python3
"""The GPU check's manifest (tools/gpu_check.sh calls this last): from the run's notes (meta.tsv,
stages.tsv), each pytest stage's JUnit XML and the stages' result files, writes OUT/manifest.json
and OUT/manifest.md, a README for the results folder (device, driver, torch, commit, the command,
each stage's limit, time and outcome, the failed tests, the headline figures, what each file
holds), and prints the markdown: the end of the console log says how the run went.

    python3 tools/gpu_manifest.py --out OUT --work WORK [--status N]
"""
import argparse
import glob
import json
import os
import xml.etree.ElementTree as ElementTree

# What each stage writes beside the console log.
STAGE_FILES = {"training": "training.json", "kernels": "kernels.json",
               "counters": "counters.json", "triage": "triage.json"}
FILES = {
    "gpu_check_log.txt": "the whole console log (every stage's output, the build's tail)",
    "manifest.md": "this file",
    "manifest.json": "the same, with every test's outcome and the stages' figures",
    "training.json": "benchmarks/gpu_training.py: every batch tried per model and method, with "
                     "its outcome; gradient cosines; step-time rounds; API calls per step",
    "kernels.json": "tools/gpu_benchmark.py: each codec's encode and decode kernel time against "
                    "a copy, per size and dtype, beside the traffic table's and the model's "
                    "predictions",
    "counters.json": "tools/gpu_counters.py: each codec kernel's Nsight Compute counters at 256 "
                     "MiB float32 (DRAM bytes, throughput, occupancy, stalls), with ncu's raw CSV",
    "triage.json": "tools/gpu_triage.py: each codec's encode and decode alone per size, and "
                   "compute-sanitizer's report of the smallest failing case of each",
    "build.log": "the build's full output",
}


def read_tsv(path, columns):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                cells = line.rstrip("\n").split("\t")
                if len(cells) >= len(columns):
                    rows.append(dict(zip(columns, cells[:len(columns) - 1]
                                         + ["\t".join(cells[len(columns) - 1:])])))
    return rows


def junit(path):
    """{"counts": {...}, "tests": [{"name", "outcome", "seconds", "message"}]} of a JUnit XML."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    tests, counts = [], {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (found.get("message") or found.text or "").strip().splitlines()
                message = message[0][:300] if message else ""
                break
        counts[outcome] += 1
        tests.append({"name": name, "outcome": outcome, "seconds": float(case.get("time", 0)),
                      "message": message})
    return {"counts": counts, "tests": tests}


def counts_text(counts):
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no tests"


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def training_lines(data):
    lines = []
    for model, s in (data.get("summary") or {}).items():
        batches = ", ".join(f"{m} {b}" for m, b in s.get("max_batch", {}).items()
                            if b is not None)
        line = f"- {model}: largest batch {batches or '-'}"
        for key, words in (("auto_over_plain", "auto / plain"),
                           ("auto_over_checkpoint", "auto / checkpoint"),
                           ("auto+recompute_over_plain", "auto+recompute / plain")):
            if s.get(key):
                line += f"; {words} {s[key]:.2f}x"
        best = s.get("auto+recompute_over_best_native")
        if best:
            line += f"; auto+recompute / best PyTorch method ({best['method']}) {best['ratio']:.2f}x"
        cosines = s.get("worst_cosine") or {}
        if cosines:
            line += "; worst group's cosine " + ", ".join(f"{m} {c:.4f}"
                                                        for m, c in cosines.items())
        t = s.get("timing") or {}
        if t.get("auto_over_plain"):
            a = t["auto_over_plain"]
            line += (f"; auto's step {a['median']:.2f}x plain's (range {a['min']:.2f}-"
                     f"{a['max']:.2f}, {t.get('rounds_within_1.2x')} of {a['n']} rounds within "
                     "1.2x)")
        for method, cap in (s.get("at_the_cap") or {}).items():
            if cap and cap.get("steps"):
                line += (f"; at the cap {method}: {cap['waits_per_step']:.2f} host waits and "
                         f"{cap['allocations_per_step']:.2f} device allocations per step")
        lines.append(line)
    return lines


def kernel_lines(data):
    rows = [r for r in data.get("rows", []) if "error" not in r]
    if not rows:
        return []
    largest = max(r["mib"] for r in rows)
    picked = [r for r in rows if r["mib"] == largest and r["dtype"] in ("float32", "bool", "int64")]
    text = ", ".join(f"{r['codec']} {r['encode_fraction']:.2f}/{r['decode_fraction']:.2f}"
                     for r in picked if r.get("encode_fraction") and r.get("decode_fraction"))
    lines = [f"- {len(rows)} rows ({', '.join(sorted({str(r['mib']) + ' MiB' for r in rows}))}); "
             f"at {largest} MiB, encode/decode as fractions of a copy: {text}"]
    if data.get("skipped"):
        lines.append(f"- skipped for time: {', '.join(data['skipped'])}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--status", type=int, default=0)
    args = parser.parse_args(argv)
    meta = {r["key"]: r["value"] for r in read_tsv(os.path.join(args.work, "meta.tsv"),
                                                     ["key", "value"])}
    stages = read_tsv(os.path.join(args.work, "stages.tsv"),
                      ["name", "title", "limit", "given", "seconds", "rc", "outcome"])
    for stage in stages:
        results = junit(os.path.join(args.work, stage["name"] + ".xml"))
        if results is not None:
            stage["tests"] = results
        wrote = STAGE_FILES.get(stage["name"])
        if wrote and os.path.exists(os.path.join(args.out, wrote)):
            stage["wrote"] = wrote
    present = {f for f in os.listdir(args.out) if os.path.isfile(os.path.join(args.out, f))}
    present |= {"manifest.md", "manifest.json"}
    manifest = {"meta": meta, "stages": stages, "status": args.status,
                "files": {f: FILES.get(f, "") for f in sorted(present)}}
    training = load(os.path.join(args.out, "training.json"))
    kernels = load(os.path.join(args.out, "kernels.json"))
    if training:
        manifest["training_summary"] = training.get("summary")
    if kernels:
        manifest["kernel_sessions"] = kernels.get("sessions")

    date = meta.get("started", "")[:10]
    lines = [f"# GPU check of {date} (`tools/gpu_check.sh`)", ""]
    lines.append(f"{meta.get('device', 'unknown device')}; torch {meta.get('torch', '?')}; Python "
                 f"{meta.get('python', '?')}; commit `{meta.get('commit', '?')}` (sources "
                 f"{meta.get('source_digest', '?')}).")
    lines.append(f"Command: `{meta.get('command', '')}`. Build: {meta.get('build', '-')}"
                 + (f", {meta['build_seconds']} s" if meta.get("build_seconds") else "")
                 + (f", for {meta['arch']} only" if meta.get("arch") else "") + ". Stages: "
                 f"{meta.get('stages_seconds', '?')} s of {meta.get('stage_seconds', '?')} s; "
                 f"the whole run {meta.get('total_seconds', '?')} s (deadline "
                 f"{meta.get('deadline', '?')} s).")
    if meta.get("dry") == "1":
        lines.append("A dry run on the CPU: the plumbing, not GPU figures.")
    lines += ["", "| stage | limit | took | outcome | tests | wrote |",
              "| --- | --- | --- | --- | --- | --- |"]
    for s in stages:
        limit = s["limit"] + " s" + (f" (given {s['given']} s)" if s["given"] not in
                                     (s["limit"], "0") else "")
        tests = counts_text(s["tests"]["counts"]) if s.get("tests") else "-"
        lines.append(f"| {s['name']}: {s['title']} | {limit} | {s['seconds']} s | "
                     f"{s['outcome']} | {tests} | {s.get('wrote', '-')} |")
    failed = [(s["name"], t) for s in stages for t in (s.get("tests") or {}).get("tests", [])
              if t["outcome"] in ("failed", "error")]
    if failed:
        lines += ["", "Failed tests:"]
        lines += [f"- [{name}] `{t['name']}`: {t['message']}" for name, t in failed]
    if training:
        lines += ["", f"Training (training.json, {training.get('status')}, "
                      f"{training.get('wall_seconds', 0):.0f} s; budgets {training.get('budgets')}):"]
        lines += training_lines(training) or ["- no figures"]
        skipped = [j["job"] for j in training.get("jobs", [])
                   if str(j.get("status", "")).startswith("skipped")]
        if skipped:
            lines.append(f"- jobs skipped: {', '.join(skipped)}")
    if kernels:
        lines += ["", f"Kernels (kernels.json, {kernels.get('time', '')}):"]
        lines += kernel_lines(kernels) or ["- no rows"]
    lines += ["", "| file | what it holds |", "| --- | --- |"]
    lines += [f"| {f} | {d} |" for f, d in manifest["files"].items()]
    lines += ["", f"Exit status {args.status}."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "manifest.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(text)
    leftovers = sorted(glob.glob(os.path.join(args.out, "*", "*")))
    if leftovers:
        print(f"note: {len(leftovers)} files in subfolders of {args.out} do not come back from a "
              "lent machine's $OUT")


if __name__ == "__main__":
    main()
