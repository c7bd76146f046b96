"""Soak: many steps of a small transformer LM under a budget, for every codec (identity among
them), with memory flat after the warm-up: the pool's reserved bytes, the process's resident
set, and the packed tensors alive between steps (none). The report's step count adds up.

The test command runs ACTPACK_SOAK_STEPS (default 60) steps per codec; a soak of 2,000 is
`ACTPACK_SOAK_STEPS=2000 pytest tests/test_soak.py`. A generous budget ("1GiB") for the fixed
codecs, whose cache must not grow into it (under `identity` a 2-layer LM once grew its resident
set by 48 MiB a step: the pool refused to reuse its own merged segments); a tight one for
`auto`, which then packs under pressure (plain training of this model peaks at 21 MiB)."""
import os

import pytest
import torch
import torch.nn as nn

import actpack

STEPS = max(60, int(os.environ.get("ACTPACK_SOAK_STEPS", "60")))
WARMUP = 6  # the policy's profile steps and first plans; the pool's growth
V, D, T, B = 128, 64, 64, 16


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        layer = nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(D, V)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.encoder(self.embed(x), mask=mask, is_causal=True))


# auto under 14 MiB runs out at step 51 (measured): after the profile step at 50 it plans a
# lighter mix projected at 11.85 MiB allocated, within the budget less its 15% headroom, but the
# pool, full to the cap in every step, reserves 1.24x what it allocates (11.29 MiB in 14): a
# 1 MiB request finds 4.58 MiB cached in pieces. The policy learns fragmentation only from a
# step whose pressure callbacks ran, and here the pool's own cache release always sufficed
# until then. Open (issue 31): measure the reserved bytes left after a cap-bound release.
# (Strict: a soak shorter than 52 steps would pass it.)
AUTO_RUNS_OUT = pytest.mark.xfail(strict=True, raises=torch.OutOfMemoryError,
                                  reason="fragmentation the policy does not measure (step 51)")


@pytest.mark.usefixtures("cpu_allocator")
@pytest.mark.parametrize("codec, limit", [("identity", "1GiB"), ("quant2", "1GiB"),
                                          ("division", "1GiB"), ("eb", "1GiB"),
                                          pytest.param("auto", "14MiB", marks=AUTO_RUNS_OUT)])
def test_memory_is_flat_after_the_warm_up(codec, limit, tmp_path):
    torch.manual_seed(0)
    model = LM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reserved, resident, live = [], [], []
    with actpack.budget(limit, codec=codec, min_bytes="4KiB",
                        report=tmp_path / "run.json") as run:
        for _ in range(STEPS):
            x = torch.randint(0, V, (B, T))
            out = model(x)
            nn.functional.cross_entropy(out.reshape(-1, V), x.reshape(-1)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            reserved.append(actpack.memory_reserved("cpu"))
            resident.append(resident_mib())
            live.append(run.totals()["live_stored_bytes"])
    after = slice(WARMUP, None)
    # The pool reserves nothing new once the steps repeat.
    assert max(reserved[after]) == reserved[WARMUP], (codec, reserved)
    # The resident set: glibc's own heap may move by a few pages.
    assert max(resident[after]) - resident[WARMUP] < 8, (codec, resident)
    # Every packed tensor is released with its step.
    assert all(v == 0 for v in live), (codec, live)
    assert len(run.report["activations"]["steps"]) == STEPS
