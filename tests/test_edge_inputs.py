"""Inputs at the edges (issue 31): every public entry point takes a value or refuses it with one
line that names the value and what is expected, never pybind's multi-line TypeError listing the
overloads of a binding.

The property tests throw generated values (huge and negative ints, NaN, infinities, random text,
sizes with units, scientific notation, values of the wrong type) at parse_size/parse_budget,
the actpack.budget constructor (not entered: no step runs), actpack.plan's argument checks (its
step raises if called, and the planning itself is replaced: an accepted call stops there), the
ACTPACK_CONF parser and actpack.recompute. Hypothesis runs derandomized with fixed settings: the
same examples every run, and no deadline on a slow machine.
"""
import math
import re
from unittest import mock

import numpy as np
import pytest
import torch

# A machine without it (tools/setup_env.sh installs it) skips this file, not the whole run.
pytest.importorskip("hypothesis", reason="the property tests need hypothesis (pip install "
                    "hypothesis; tools/setup_env.sh installs it)")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import actpack
from actpack import _args, _env, _planner, _units

SETTINGS = settings(derandomize=True, max_examples=200, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# "actpack: ..." or "actpack.budget: ..." (the entry point that refused).
PREFIX = re.compile(r"actpack(\.[a-z_]+)?: ")
WHITESPACE = " \t\n\v\f\r"


def names(value):
    """How a message may name `value`: its repr, its one-line repr, its text (an int also as
    the float it is to a float option); for a mapping (a codec per module pattern), also how it
    names one of its keys or values."""
    found = [repr(value), _args.show(value)]
    if isinstance(value, str):
        found += [value, value.strip(WHITESPACE)]
    elif _args.is_int(value):
        found.append(str(int(value)))
        if abs(value) < 2**1023:  # a float option's range check names it as a float
            found.append(repr(float(value)))
    elif isinstance(value, dict):
        found += [n for item in value.items() for part in item for n in names(part)]
    return [n for n in found if n]


def check_refusal(error, *values):
    """The property's refusal half: one line, actpack's prefix, naming one of `values`."""
    message = str(error)
    assert "\n" not in message and "\r" not in message, message
    assert len(message.splitlines()) == 1, message
    assert PREFIX.match(message), message
    assert "incompatible function arguments" not in message, message
    assert "incompatible constructor arguments" not in message, message
    if values:
        assert any(n in message for v in values for n in names(v)), (message, values)


def refused(error, *values):
    """check_refusal, counted in hypothesis' statistics (--hypothesis-show-statistics)."""
    check_refusal(error, *values)
    event(f"refused: {type(error).__name__}")


# ---- strategies ----

SPECIAL_INTS = [0, 1, -1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30,
                _units.MAX_BYTES, _units.MAX_BYTES + 1, -(2**63), -(2**64)]
ints = st.one_of(st.integers(), st.integers(min_value=2**60, max_value=2**200),
                 st.integers(max_value=-1), st.sampled_from(SPECIAL_INTS))
floats = st.one_of(st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.5,
                                                 0.15, 1e30, -1.0, 1.0]))
UNITS = ["", "B", "b", "k", "KiB", "kb", "M", "MiB", "MB", "g", "GiB", "GB", "T", "TiB", "TB",
         "%", " GiB", "e30", "EiB", "apples", "iB", "GiB%"]
mantissas = st.one_of(st.integers(min_value=-10**20, max_value=10**20).map(str),
                      st.floats(allow_nan=True, allow_infinity=True).map(repr),
                      st.sampled_from(["1.", ".5", "0", "-0", "+1", "1.5.5", "nan", "inf"]))
scientific = st.builds(lambda m, e, big: f"{m}{big}{e}", mantissas,
                       st.integers(min_value=-400, max_value=400), st.sampled_from(["e", "E"]))
sizes = st.builds(lambda n, u, pad: f"{pad}{n}{u}{pad}", st.one_of(mantissas, scientific),
                  st.sampled_from(UNITS), st.sampled_from(["", " ", "\t", "\n"]))
texts = st.text(max_size=40)
WRONG_TYPES = [None, [], [1], (8, 16), {}, {"a": 1}, b"6GiB", 1j, True, False, set(),
               bytearray(b"1"), object(), np.int64(6 << 30), np.float64(0.1), np.bool_(True),
               torch.tensor([[1.0, 2.0], [3.0, 4.0]])]
wrong_types = st.sampled_from(WRONG_TYPES)
values = st.one_of(ints, floats, sizes, scientific, texts, wrong_types)
# Sizes that parse: a positive number (plain or scientific) and a unit.
good_sizes = st.builds(lambda n, u: f"{n}{u}",
                       st.one_of(st.integers(min_value=1, max_value=10**6).map(str),
                                 st.floats(min_value=1.0, max_value=1e6).map(repr),
                                 st.sampled_from(["1e9", "1.5e9", "2E3", ".5e1"])),
                       st.sampled_from(["", "B", "KiB", "MB", "MiB", "GiB", "gb", "T"]))


# ---- the three cases the issue names ----

def test_a_budget_of_10_to_the_30_is_out_of_range():
    with pytest.raises(ValueError) as error:
        actpack.budget(10**30)
    check_refusal(error.value, 10**30)
    assert "out of range" in str(error.value) and "9.2e18 bytes" in str(error.value)


def test_a_negative_seed_names_the_seed_and_its_range():
    with pytest.raises(ValueError) as error:
        actpack.budget("6GiB", seed=-1)
    check_refusal(error.value)
    assert "seed=-1" in str(error.value) and "from 0 to 2**64-1" in str(error.value)
    actpack.budget("6GiB", seed=2**64 - 1)  # the session's uint64 takes it


def test_scientific_notation_is_a_number_of_bytes():
    assert actpack.parse_size("1e9") == 10**9
    assert actpack.parse_size("1.5e9B") == 1_500_000_000
    assert actpack.parse_size(" 2E3 MiB ") == 2000 << 20
    assert actpack.parse_budget("1e9")["bytes"] == 10**9
    assert actpack.parse_budget("1e1%")["fraction"] == pytest.approx(0.1)
    for text in ("1e30", "1e400", "1e-400"):
        with pytest.raises(ValueError, match=f"'{text}': out of range; expected 1 byte"):
            actpack.budget(text)
    with pytest.raises(ValueError, match="'-1e9': the size must be positive"):
        actpack.parse_size("-1e9")


def test_wrong_types_name_the_value():
    cases = [
        (lambda: actpack.budget([1]), "[1] (list)"),
        (lambda: actpack.budget("1GiB", seed=1.5), "seed must be an int"),
        (lambda: actpack.budget("1GiB", seed=True), "seed must be an int"),
        (lambda: actpack.budget("1GiB", enabled="false"), "'false' (str)"),
        (lambda: actpack.budget("1GiB", headroom=math.nan), "headroom=nan is not finite"),
        (lambda: actpack.budget("1GiB", profile_every=10**30), "profile_every=1000"),
        (lambda: actpack.budget("1GiB", min_bytes=10**30), "min_bytes '1000"),
        (lambda: actpack.budget("1GiB", report=5), "report must be a path"),
        (lambda: actpack.budget("1GiB", allowed_loss_increase=math.inf), "got inf"),
        (lambda: actpack.plan(_never, "1GiB", batch_sizes=(8.5, 16)), "8.5 (float)"),
        (lambda: actpack.plan(_never, "1GiB", batch_sizes=(-8, 16)), "(-8, 16)"),
        (lambda: actpack.plan(_never, "1GiB", codecs="quant2"), "'quant2' (str)"),
        (lambda: actpack.plan(None, "1GiB"), "step must be a function"),
        (lambda: actpack.recompute(5), "fn must be a function"),
        (lambda: actpack.format_bytes(10**30), "2**64-1"),
        (lambda: actpack.encode(torch.ones(4), codec=5), "codec must be a str"),
        (lambda: actpack.memory_stats(2**40), "device index 1099511627776"),
    ]
    for call, words in cases:
        with pytest.raises((ValueError, TypeError)) as error:
            call()
        check_refusal(error.value)
        assert words in str(error.value), (str(error.value), words)


def test_the_command_line_refuses_an_argument_it_cannot_pass_on(capsys):
    from actpack import cli
    for argument in ("\udcff.json", 5):
        with pytest.raises(SystemExit) as exit:
            cli.main(["report", argument])
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("actpack: argument "), err


# ---- the properties ----

@SETTINGS
@given(value=st.one_of(values, good_sizes),
       which=st.sampled_from(["parse_size", "parse_budget"]))
def test_sizes_and_budgets_are_taken_or_refused_in_one_line(value, which):
    try:
        if which == "parse_size":
            n = actpack.parse_size(value)
            assert isinstance(n, int) and 1 <= n <= _units.MAX_BYTES
        else:
            parsed = actpack.parse_budget(value)
            assert (1 <= parsed["bytes"] <= _units.MAX_BYTES) != (0 < parsed["fraction"] <= 1)
        event("accepted")
    except (ValueError, TypeError) as error:
        refused(error, value)


CODECS = ["auto", "quant2", "quant:bits=4,group=128", "identity", "none", "eb", "division",
          "quant:bits=99", "zstd", "", {"layer1.*": "quant2"}, {"*": "zz"}, {1: "quant2"}]
BUDGET_ARGUMENTS = {
    "limit": st.one_of(values, good_sizes, st.sampled_from(["6GiB", "80%", 1 << 30])),
    "codec": st.one_of(st.sampled_from(CODECS), values),
    "report": st.one_of(texts, values, st.sampled_from(["run.json", "run-{rank}.json", "",
                                                         "a\0b"])),
    "min_bytes": st.one_of(values, st.sampled_from([0, "64KiB", 1])),
    "seed": st.one_of(ints, values),
    "enabled": st.one_of(st.sampled_from([True, False, 0, 1, 2, "false"]), values),
    "headroom": st.one_of(floats, values, st.sampled_from([0, 0.0, 0.49, 0.5, 1])),
    "profile_every": st.one_of(ints, values),
    "snapshot": st.one_of(st.sampled_from([True, False]), values),
    "allowed_loss_increase": st.one_of(floats, values, st.sampled_from([None, 0.01, 1])),
    "recompute": st.one_of(st.sampled_from([True, False, "auto", "yes", 1]), values),
}


@SETTINGS
@given(data=st.data(), which=st.sampled_from(sorted(BUDGET_ARGUMENTS)))
def test_budget_arguments_are_taken_or_refused_in_one_line(data, which):
    value = data.draw(BUDGET_ARGUMENTS[which], label=which)
    limit, options = "1GiB", {}
    if which == "limit":
        limit = value
    else:
        options[which] = value
    if which == "allowed_loss_increase":
        options["codec"] = "eb"  # the codec the bound applies to
    try:
        actpack.budget(limit, **options)  # constructed only: nothing is packed or installed
        event("accepted")
    except (ValueError, TypeError) as error:
        refused(error, value)


class _Accepted(Exception):
    """plan() checked its arguments and went on to plan."""


def _never(batch):
    raise AssertionError(f"actpack.plan ran step({batch}) before checking its arguments")


def _stop(*args, **kwargs):
    raise _Accepted


PLAN_ARGUMENTS = {
    "budget": st.one_of(values, good_sizes, st.sampled_from(["6GiB", "80%", 1 << 30])),
    "batch_sizes": st.one_of(
        st.lists(st.one_of(ints, st.integers(min_value=1, max_value=64), floats,
                           wrong_types), max_size=4),
        st.lists(st.integers(min_value=1, max_value=64), min_size=2, max_size=4).map(tuple),
        values),
    "codecs": st.one_of(st.lists(st.sampled_from(["none", "quant2", "eb", "auto", "auto+recompute",
                                                  "quant4", 1, None]),
                                 max_size=3), values, st.none()),
    "verify": st.one_of(st.booleans(), values),
    "report": st.one_of(values, st.none(), st.just("plan.json")),
    "progress": st.one_of(st.booleans(), values),
    "restore": st.one_of(st.just(False), values),
    "step": st.one_of(st.just(_never), values),
}


@SETTINGS
@given(data=st.data(), which=st.sampled_from(sorted(PLAN_ARGUMENTS)))
def test_plan_checks_its_arguments_before_any_step(data, which):
    value = data.draw(PLAN_ARGUMENTS[which], label=which)
    arguments = {"step": _never, "budget": "1GiB", "progress": False, "restore": False}
    arguments[which] = value
    step = arguments.pop("step")
    with mock.patch.object(_planner, "_plan", _stop):
        try:
            actpack.plan(step, **arguments)
        except _Accepted:
            event("accepted")
        except (ValueError, TypeError) as error:
            refused(error, value, *(value if isinstance(value, list) else ()))


def test_plan_takes_any_codec_the_registry_holds():
    """plan()'s choices are its own names or any codec spec budget() takes; a spec the registry
    refuses is refused with the registry's reason."""
    for codecs in (["quant4"], ["none", "division_dct:keep=4", "auto"], ["mask", "eb:rel=1e-3"]):
        with mock.patch.object(_planner, "_plan", _stop), pytest.raises(_Accepted):
            actpack.plan(_never, "1GiB", codecs=codecs, progress=False, restore=False)
    with pytest.raises(ValueError, match=r"'quant5'.*bits must be 1, 2, 4 or 8"):
        actpack.plan(_never, "1GiB", codecs=["quant5"], progress=False, restore=False)


conf_values = st.one_of(
    sizes, scientific, st.text(alphabet=st.characters(exclude_characters=","), max_size=20),
    ints.map(str), floats.map(repr),
    st.sampled_from(["6GiB", "quant2", "eb", "auto", "true", "false", "0", "1", "yes", "cpu",
                     "none", "gpu", "0.01", "nan", "run.json", ""]))
conf_keys = st.one_of(st.sampled_from(_env.KEYS), st.text(max_size=10))
# Values each key takes, so that some whole texts are accepted.
GOOD_CONF = {"budget": ["6GiB", "80%", "1e9", "512MiB"], "codec": ["quant2", "auto", "none"],
             "report": ["run.json"], "min_bytes": ["0", "64KiB"], "seed": ["0", "7"],
             "enabled": ["true", "false", "0", "1"], "allocator": ["auto", "cpu", "none"],
             "allowed_loss_increase": ["0.01"], "recompute": ["true", "auto", "0"]}
good_pairs = st.sampled_from([(k, v) for k, vs in GOOD_CONF.items() for v in vs if k != "budget"])
conf_pairs = st.one_of(good_pairs, st.tuples(conf_keys, conf_values))


@SETTINGS
@given(pairs=st.lists(conf_pairs, max_size=4, unique_by=lambda pair: pair[0]),
       budget=st.one_of(st.none(), st.sampled_from(GOOD_CONF["budget"]), conf_values))
def test_actpack_conf_is_taken_or_refused_in_one_line(pairs, budget):
    if budget is not None:
        pairs = [("budget", budget)] + [pair for pair in pairs if pair[0] != "budget"]
    text = ",".join(f"{k}={v}" for k, v in pairs)
    try:
        options = _env.parse(text)
        options.pop("allocator", None)
        # What activate() does next, short of installing an allocator and entering.
        actpack.budget(options.pop("budget"), **options)
        event("accepted")
    except (ValueError, TypeError) as error:
        # The message names a pair, a key or a value (a missing budget: the key).
        items = [f"{k}={v}".strip(WHITESPACE) for k, v in pairs]
        refused(error, text, "budget", *items, *[k for k, _ in pairs], *[v for _, v in pairs])


@SETTINGS
@given(micro_batch=st.one_of(st.none(), ints, floats, wrong_types, texts),
       fn=st.one_of(st.just(torch.relu), wrong_types, ints))
def test_recompute_is_taken_or_refused_in_one_line(micro_batch, fn):
    x = torch.ones(4, 3)
    try:
        actpack.recompute(fn, x, micro_batch=micro_batch)
        event("accepted")
    except (ValueError, TypeError) as error:
        refused(error, fn, micro_batch)
