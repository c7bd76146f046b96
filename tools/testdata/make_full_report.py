"""Writes run_quant2_full.json: the real run_quant2.json plus the report sections whose producer
(the runtime) lands separately, so that the CLI can be tested on them now.

    python3 tools/testdata/make_full_report.py      # from the repository root; needs actpack

What is added, and where it comes from:
  - activations.saved_tensors[i].module: the module of the demo's CausalConvNet (the model the
    report was recorded with, tools/demo.py at d0e59d3) that saved the tensor, by ordinal;
    functional ops in the model's own forward (relu, the loss) get none, so the CLI falls back
    to their producer.
  - activations.saved_tensors[i].error: quant2 through actpack.encode/decode on a seeded tensor
    of the record's shape (ReLU outputs non-negative), not the run's own activations.
  - planner: fixed + per-sample bytes built from this report's and run_quant4.json's measured
    bytes per step (batch 32), max_batch_size by the planner's formula at the run's budget.
  - allocator: stats and snapshot of actpack's real CPU allocator (install_cpu_allocator) over
    one training step of the same model, batch 32.
Once the runtime writes these sections, regenerate the fixture from a real run instead.
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 32


class CausalConvNet(nn.Module):
    """tools/demo.py's model when run_quant2.json was recorded."""

    def __init__(self, vocab=256, channels=128, layers=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, channels)
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size=3, dilation=2 ** (i % 4))
            for i in range(layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(channels) for _ in range(layers))
        self.head = nn.Conv1d(channels, vocab, kernel_size=1)

    def forward(self, tokens):
        x = self.embed(tokens).transpose(1, 2)
        for conv, norm in zip(self.convs, self.norms):
            pad = conv.dilation[0] * (conv.kernel_size[0] - 1)
            x = x + F.relu(norm(conv(F.pad(x, (pad, 0)))))
        return self.head(x).transpose(1, 2)


def module_of(ordinal):
    """The module that saved tensor `ordinal` in one step of CausalConvNet (6 layers)."""
    if ordinal == 0:
        return "embed"  # the token indices
    if 1 <= ordinal <= 54:
        layer, position = divmod(ordinal - 1, 9)
        if position <= 1:
            return f"convs.{layer}"  # padded input, weight
        if position <= 7:
            return f"norms.{layer}"  # conv output, weight, bias, running and saved statistics
        return None  # F.relu in the model's forward
    if ordinal in (55, 56):
        return "head"  # its input (the residual sum) and weight
    return None  # the loss's log-probabilities and targets, the scalar loss


def quant2_error(record, generator):
    shape = record["shape"]
    data = torch.randn(shape, generator=generator)
    if record["producer"] == "ReluBackward0":
        data = data.relu()
    decoded = actpack.decode(actpack.encode(data, "quant2", 0))
    difference = (decoded - data).double()
    rms = difference.pow(2).mean().sqrt().item()
    return {"rms": rms, "max_abs": difference.abs().max().item(),
            "rel_rms": rms / data.double().pow(2).mean().sqrt().item()}


def planner_section(report, quant4_report):
    def per_step(r, key):
        return max(step[key] for step in r["activations"]["steps"])

    transient = 2 * 128 * 256 * 4  # logits and their gradient, per sample
    per_sample = {
        "none": per_step(report, "saved_raw_bytes") // BATCH + transient,
        "quant2": per_step(report, "stored_bytes") // BATCH + transient,
        "quant4": per_step(quant4_report, "stored_bytes") // BATCH + transient,
    }
    per_sample["auto"] = (per_sample["quant2"] + per_sample["quant4"]) // 2
    fixed = 6 << 20  # parameters, gradients, Adam state, workspace
    budget = report["run"]["budget_bytes"]
    choices = {name: {"fixed_bytes": fixed, "per_sample_bytes": bytes_,
                      "max_batch_size": (budget - fixed) // bytes_}
               for name, bytes_ in per_sample.items()}
    batch = choices["quant2"]["max_batch_size"]
    return {"budget_bytes": budget, "batch_sizes": [8, 16, 32], "choices": choices,
            "verified": {"codec": "quant2", "batch_size": batch,
                         "peak_bytes": fixed + batch * per_sample["quant2"] * 97 // 100}}


def allocator_section(budget):
    actpack.install_cpu_allocator(budget=budget)
    torch.manual_seed(0)
    model = CausalConvNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 256, (BATCH, 128))
    targets = torch.randint(0, 256, (BATCH, 128))
    loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return {"backend": "cpu", "budget_bytes": budget, "stats": actpack.memory_stats("cpu"),
            "snapshot": actpack.memory_snapshot("cpu")}


def dumps(report):
    """Indented like the runtime's reports, except the snapshot: one segment or trace entry a
    line, so that the fixture stays small."""
    snapshot = report["allocator"]["snapshot"]
    report["allocator"]["snapshot"] = "@SNAPSHOT@"
    text = json.dumps(report, indent=2)
    lines = ['{"segments": [']
    lines += [json.dumps(s) + ("," if i + 1 < len(snapshot["segments"]) else "")
              for i, s in enumerate(snapshot["segments"])]
    lines.append('], "device_traces": [')
    for d, trace in enumerate(snapshot["device_traces"]):
        lines.append("[")
        lines += [json.dumps(e) + ("," if i + 1 < len(trace) else "") for i, e in enumerate(trace)]
        lines.append("]" + ("," if d + 1 < len(snapshot["device_traces"]) else ""))
    lines.append('], "allocator_settings": ' + json.dumps(snapshot["allocator_settings"]) + "}")
    report["allocator"]["snapshot"] = snapshot
    return text.replace('"@SNAPSHOT@"', "\n".join(lines)) + "\n"


def main():
    with open(os.path.join(HERE, "run_quant2.json")) as f:
        report = json.load(f)
    with open(os.path.join(HERE, "run_quant4.json")) as f:
        quant4_report = json.load(f)
    generator = torch.Generator().manual_seed(0)
    for record in report["activations"]["saved_tensors"]:
        module = module_of(record["ordinal"])
        if module is not None:
            record["module"] = module
        if record["codec"] == "quant2":
            record["error"] = quant2_error(record, generator)
    report["planner"] = planner_section(report, quant4_report)
    report["allocator"] = allocator_section(report["run"]["budget_bytes"])
    text = dumps(report)
    assert json.loads(text) == report
    with open(os.path.join(HERE, "run_quant2_full.json"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
