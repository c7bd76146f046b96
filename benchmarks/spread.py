"""The spread of per-round values: what a benchmark that runs its rows in rounds reports, and
what the docs' tables are made from (benchmarks/overhead.py, benchmarks/readme_tables.py)."""
import statistics


def spread(values):
    """{"min", "q1", "median", "q3", "max", "n"} of per-round values: the quartiles by
    linear interpolation between the sorted values (statistics.quantiles' inclusive method,
    numpy.percentile's default), so within [min, max]; one value is its own quartiles."""
    ordered = sorted(values)
    q1, _, q3 = (statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1
                 else [ordered[0]] * 3)
    return {"min": ordered[0], "q1": q1, "median": statistics.median(ordered), "q3": q3,
            "max": ordered[-1], "n": len(ordered)}
