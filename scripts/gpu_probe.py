"""Run chapters' benchmarks on the GPU and print one compact table each (no notebooks).

    python scripts/gpu_probe.py flash_attn gla mla

Meant for tuning: the full tables land in results/ as usual; this prints the
pivot of each table (case rows x provider columns) for the metric that matters.
"""
import importlib
import sys
import time

import pandas as pd

import kernels  # noqa: F401

BENCHMARKS = {
    "flash_attn": ["forward_benchmark", "backward_benchmark", "fa3_benchmark", "memory_benchmark"],
    "gla": ["decode_benchmark", "prefill_benchmark", "decode_context_benchmark"],
    "mla": ["decode_benchmark", "plain_call_benchmark"],
}
META = {"name", "provider", "ms", "tflops", "gbps", "roofline_ms", "pct_roofline", "note"}


def show(df):
    cases = [c for c in df.columns if c not in META and df[c].nunique() > 1 and c not in ("peak_gib", "extra_gib", "inputs_gib")]
    metric = "ms" if df["ms"].notna().any() else "peak_gib"
    table = df.pivot_table(index=cases or ["name"], columns="provider", values=metric, sort=False)
    print(f"--- {df['name'].iloc[0]}  ({metric})")
    print(table.to_string(float_format=lambda x: f"{x:.4g}"))
    if "pct_roofline" in df and df["pct_roofline"].notna().any():
        print(df.pivot_table(index=cases or ["name"], columns="provider", values="pct_roofline", sort=False)
              .to_string(float_format=lambda x: f"{x:.0f}%"))
    notes = df[df["note"].astype("string").fillna("").str.startswith("error")]
    if len(notes):
        print(notes[["provider", "note"]].drop_duplicates().to_string())


if __name__ == "__main__":
    pd.set_option("display.width", 200)
    for family in sys.argv[1:]:
        module = importlib.import_module(f"kernels.{family}.bench")
        for fn in BENCHMARKS[family]:
            if not hasattr(module, fn):
                continue
            start = time.time()
            kwargs_list = [{"graph": False}, {"graph": True}] if fn == "decode_benchmark" and family == "gla" else [{}]
            for kwargs in kwargs_list:
                show(getattr(module, fn)(**kwargs))
            print(f"({family}.{fn}: {time.time() - start:.0f} s)", flush=True)
