"""Run families' benchmarks on the GPU and print one compact table each (no notebooks).

    python scripts/gpu_probe.py                     # every family's BENCHMARKS
    python scripts/gpu_probe.py gla mla             # just these families
    python scripts/gpu_probe.py mla_decode_paged    # just this table (a Benchmark's name)

Meant for tuning: the full tables land in results/ as usual; this prints, per table, the time of
each provider for each case and the % of the roofline. Families are found, not listed: every
`attention_kernels/<family>/bench.py` with a BENCHMARKS list.
"""
import os
import sys
import time

import pandas as pd

from attention_kernels.bench import REQUIRED_COLUMNS, discover, families, run


def show(df):
    """ms (or the measured column) and % of roofline, cases as rows, providers as columns."""
    cases = [c for c in df.columns if c not in REQUIRED_COLUMNS and df[c].nunique() > 1
             and not c.endswith("_gib")]
    metric = "ms" if df["ms"].notna().any() else "peak_gib"
    print(f"--- {df['name'].iloc[0]}  ({metric})")
    print(df.pivot_table(index=cases or ["name"], columns="provider", values=metric, sort=False)
          .to_string(float_format=lambda x: f"{x:.4g}"))
    if df["pct_roofline"].notna().any():
        print(df.pivot_table(index=cases or ["name"], columns="provider", values="pct_roofline", sort=False)
              .to_string(float_format=lambda x: f"{x:.0f}%"))
    errors = df[df["note"].astype("string").fillna("").str.startswith("error")]
    if len(errors):
        print(errors[["provider", "note"]].drop_duplicates().to_string())


def chosen(names):
    """The benchmarks the arguments name: a family gives all of its BENCHMARKS, a table's name that one."""
    every = discover()
    out = []
    for name in names:
        found = every.get(name) or [b for family in every.values() for b in family if b.name == name]
        if not found:
            raise SystemExit(f"{name!r} is neither a family ({', '.join(every)}) nor the name of a benchmark table")
        out += found
    return out


if __name__ == "__main__":
    pd.set_option("display.width", 200)
    os.environ.setdefault("KERNELS_BENCH_TRACE", "1")  # each job named as it starts: a hang names its job
    for benchmark in chosen(sys.argv[1:] or families()):
        start = time.time()
        show(run(benchmark))
        print(f"({benchmark.name}, {time.time() - start:.0f} s)", flush=True)
