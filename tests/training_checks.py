"""What the tests that train a loop plainly and then under a budget check in the budgeted run."""
import statistics


def check_budgeted_run(report, budget, plain, packed, plain_peak, last=5, label="run"):
    """Asserts that the run's report has a step per training step (losses in `packed`), every
    capped step under `budget`, packing that stored fewer bytes than it was given, and a final
    loss (the mean of the `last` ones) within 5% of plain training's; prints the numbers."""
    steps = report["activations"]["steps"]
    assert len(steps) == len(packed), (label, len(steps), len(packed))
    assert report["run"]["budget_bytes"] == budget
    # The steps before the run's capped_from_step may go over the cap to measure themselves.
    capped = max(s["peak_reserved_bytes"] for s in steps[report["run"]["capped_from_step"]:])
    assert capped <= budget, (label, budget, steps)
    totals = report["activations"]["totals"]
    assert totals["packs"] > 0 and totals["packed_stored_bytes"] < totals["packed_raw_bytes"]
    final_plain, final_packed = statistics.mean(plain[-last:]), statistics.mean(packed[-last:])
    assert abs(final_packed - final_plain) <= 0.05 * final_plain, (label, plain, packed)
    print(f"{label}: plain reserved peak {plain_peak}, budget {budget}, capped steps at most "
          f"{capped}; final loss (mean of the last {last}) plain {final_plain:.4f}, actpack "
          f"{final_packed:.4f}")
