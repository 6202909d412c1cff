"""Benchmark suites for ``structconv bench NAME``.

Each module ``structconv.bench.NAME`` defines ``add_arguments(parser)`` and ``run(args) -> int``,
prints a table, and writes JSON (atomically) into ``args.out``. Timings are medians over repeats,
always reported as ratios against the anchor measured in the same run.
"""

SUITES = ("routes", "grid", "graph", "attention", "lm", "kg", "scale", "graphs")
