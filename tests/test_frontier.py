"""benchmarks/frontier.py's smoke run: error per byte and gradient cosine of the codecs on the
suite models' saved activations (the full run is outside the test command)."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from benchmarks import frontier

    out = tmp_path_factory.mktemp("frontier") / "frontier.json"
    assert frontier.main(["--smoke", "--models", "vit-b16", "gpt2-small", "--out", str(out),
                          "--codecs", "quant2", "quant8", "division_dct:keep=4,bits=2", "sim:dct:keep=4",
                          "sim:dft:keep=1", "--draws", "2"]) == 0
    with open(out) as f:
        document = json.load(f)
    assert os.path.exists(str(out)[:-len(".json")] + ".svg")
    return document


def _row(results, model, codec):
    return next(r for r in results["rows"] if r["model"] == model and r["codec"] == codec)


def test_the_file_says_how_it_was_made(results):
    assert results["command"].startswith("python3 ")
    assert results["machine"]["cpus"] >= 1
    assert {r["model"] for r in results["rows"]} == {"vit-b16", "gpt2-small"}


def test_more_bits_less_error_and_better_gradients(results):
    for model in ("vit-b16", "gpt2-small"):
        q2, q8 = _row(results, model, "quant2"), _row(results, model, "quant8")
        assert q2["stored_bytes"] < q8["stored_bytes"] < q8["raw_bytes"]
        # quant8's step is 1/255 of a group's range: its error is far below quant2's (1/3).
        assert q8["rel_error"] < q2["rel_error"] / 20
        assert q8["grad_cosine"] > 0.999 and q8["grad_cosine"] > q2["grad_cosine"]
        assert q8["grad_rel_error"] < q2["grad_rel_error"]
        assert q2["draws"] == 2
        assert q2["grad_cosine_min"] <= q2["grad_cosine"] <= q2["grad_cosine_max"]
        assert q2["grad_cosine_min"] < q2["grad_cosine_max"]  # two seeds, two draws


def test_the_simulated_low_part_matches_the_codec(results):
    # sim:dct:keep=4 is division_dct:keep=4 computed in float64 by torch: the same bytes up
    # to the LFC's word padding, and an error within the residual's draws of the codec's.
    for model in ("vit-b16", "gpt2-small"):
        real = _row(results, model, "division_dct:keep=4,bits=2")
        sim = _row(results, model, "sim:dct:keep=4")
        assert real["tensors"] == sim["tensors"] > 0
        assert abs(real["stored_bytes"] - sim["stored_bytes"]) <= 4 * real["tensors"]
        assert abs(real["rel_error"] - sim["rel_error"]) < 0.05 * real["rel_error"]
