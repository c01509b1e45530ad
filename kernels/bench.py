"""The book's benchmark harness: time a sweep of shapes x providers on the GPU, or load
the committed H200 results on a machine without one.

Every row carries explicitly counted FLOPs and bytes, so each time becomes TFLOP/s,
GB/s and a percentage of the roofline: max(FLOPs / matmul rate, bytes / copy rate),
with both ceilings re-measured in the same process that does the timing.

    >>> df = run_or_load("gla_decode", cases, providers, flops=..., bytes=...)

writes (GPU) or reads (CPU) `results/gla_decode.csv` and `results/gla_decode.json`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd
import torch

from .common import INTERPRET, ON_GPU

RESULTS_DIR = Path(os.environ.get("KERNELS_RESULTS_DIR", Path(__file__).resolve().parent.parent / "results"))
# do_bench settings (milliseconds of warm-up and of timed repeats), recorded with every table.
WARMUP_MS, REP_MS = 50, 200
_CHILD = "KERNELS_FRESH_PROCESS"  # set in the process that `in_fresh_process` starts
REQUIRED_COLUMNS = ["name", "provider", "ms", "tflops", "gbps", "roofline_ms", "pct_roofline", "note"]

_ceilings: dict | None = None


def measure_ceilings() -> dict:
    """Measure the two roofline ceilings on this GPU (once per process).

    bandwidth: a 4 GiB device-to-device copy, bytes read + written;
    matmul: an 8192^3 bf16 product on random data. Both medians of `do_bench`.
    """
    global _ceilings
    if _ceilings is None:
        import triton.testing

        n = 1 << 29  # 2^29 fp64 elements = 4 GiB
        src = torch.randn(n, device="cuda", dtype=torch.float64)
        dst = torch.empty_like(src)
        ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
        gbps = 2 * src.numel() * src.element_size() / ms / 1e6
        del src, dst
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        ms = triton.testing.do_bench(lambda: a @ b, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
        tflops = 2 * 8192**3 / ms / 1e9
        del a, b
        torch.cuda.empty_cache()
        _ceilings = {"peak_gbps": round(gbps, 1), "peak_tflops": round(tflops, 1)}
    return _ceilings


def metadata() -> dict:
    """GPU, driver, versions, commit and date: recorded with every results table."""
    import triton

    def _cmd(args):
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    meta = {
        "gpu": torch.cuda.get_device_name() if ON_GPU else "cpu",
        "driver": (_cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
                   or ["unknown"])[0],
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        # a GPU box may get a copy of the tree without .git: refresh_gpu.sh passes the commit along
        "commit": os.environ.get("KERNELS_COMMIT")
        or _cmd(["git", "-C", str(RESULTS_DIR.parent), "rev-parse", "--short", "HEAD"]) or "unknown",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "do_bench": {"warmup_ms": WARMUP_MS, "rep_ms": REP_MS, "return_mode": "median"},
        "process": "fresh" if os.environ.get(_CHILD) else ("jupyter kernel" if "ipykernel" in sys.modules else "plain"),
    }
    try:
        import fla  # a peer, benchmarked only

        meta["fla"] = getattr(fla, "__version__", "unknown")
    except ImportError:
        pass
    return meta


def time_ms(fn: Callable[[], object]) -> float:
    """Median time of `fn()` in ms by `triton.testing.do_bench`, after warm-up."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")


def time_graph_ms(fn: Callable[[], object]) -> float:
    """Median time of one `fn()` replayed from a CUDA graph (launch overhead removed)."""
    import triton.testing

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up (and compile) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")


def sweep(
    name: str,
    cases: Sequence[Mapping],
    providers: Mapping[str, Callable[[Mapping], Callable[[], object] | None]],
    flops: Callable[[Mapping], float],
    bytes: Callable[[Mapping], float],
    timer: Callable[[Callable[[], object]], float] = time_ms,
) -> pd.DataFrame:
    """Time every provider on every case, on this GPU, and return the tidy table.

    cases: dicts of shape parameters (they become columns), e.g. {"B": 1, "N": 4096}.
    providers: label -> factory; factory(case) builds inputs and returns a zero-argument
        callable to time, or None where the provider does not apply to that case.
        Running out of GPU memory is recorded as a row with ms = NaN and note "OOM".
    flops, bytes: counted for the case, the same for every provider (the work the
        operation must do, not what a given implementation happens to do).
    """
    from tqdm import tqdm

    if not ON_GPU or INTERPRET:
        raise RuntimeError("sweep() times kernels and needs a CUDA GPU; on a CPU use run_or_load()")
    ceil = measure_ceilings()
    rows = []
    jobs = [(case, label, factory) for case in cases for label, factory in providers.items()]
    for case, label, factory in tqdm(jobs, desc=name, file=sys.stderr, mininterval=2.0):
        row = {"name": name, "provider": label, **case}
        f, b = float(flops(case)), float(bytes(case))
        roof_ms = max(f / (ceil["peak_tflops"] * 1e9), b / (ceil["peak_gbps"] * 1e6))
        ms, note = math.nan, ""
        try:
            fn = factory(case)
            if fn is None:
                note = "n/a"
            else:
                ms = timer(fn)
        except torch.OutOfMemoryError:
            note = "OOM"
        except Exception as e:  # a broken peer must not sink the whole sweep; the table says why
            note = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            print(f"[{name}] {label} {dict(case)}: {note}", file=sys.stderr)
        finally:
            fn = None
            torch.cuda.empty_cache()
        row.update(
            ms=ms,
            tflops=f / ms / 1e9 if ms == ms else math.nan,
            gbps=b / ms / 1e6 if ms == ms else math.nan,
            roofline_ms=roof_ms,
            pct_roofline=100 * roof_ms / ms if ms == ms else math.nan,
            note=note,
        )
        rows.append(row)
    return pd.DataFrame(rows)


def save(df: pd.DataFrame, name: str, meta: dict | None = None) -> None:
    """Write results/<name>.csv and results/<name>.json (metadata and ceilings)."""
    RESULTS_DIR.mkdir(exist_ok=True)
    meta = dict(meta or metadata())
    if ON_GPU:
        meta.update(measure_ceilings())
    df.to_csv(RESULTS_DIR / f"{name}.csv", index=False, float_format="%.6g")
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")


def load(name: str) -> pd.DataFrame:
    """Read a committed results table; raise ValueError saying what is wrong with it.

    The metadata is attached as `df.attrs["meta"]`.
    """
    csv, js = RESULTS_DIR / f"{name}.csv", RESULTS_DIR / f"{name}.json"
    if not csv.exists() or not js.exists():
        raise FileNotFoundError(
            f"no results for '{name}' in {RESULTS_DIR} (need {csv.name} and {js.name}); "
            "they come from a GPU run: scripts/refresh_gpu.sh")
    try:
        df = pd.read_csv(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{csv}: not a readable CSV table ({e})") from e
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{csv}: missing column(s) {missing}; expected at least {REQUIRED_COLUMNS}")
    if df.empty:
        raise ValueError(f"{csv}: has a header but no rows")
    bad = pd.to_numeric(df["ms"], errors="coerce").isna() & df["ms"].notna()
    if bad.any():
        raise ValueError(f"{csv}: column 'ms' has non-numeric values in row(s) {list(df.index[bad][:5])}")
    try:
        meta = json.loads(js.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{js}: not valid JSON ({e})") from e
    need = {"gpu", "torch", "triton", "date", "commit", "peak_tflops", "peak_gbps"}
    if not isinstance(meta, dict) or need - meta.keys():
        raise ValueError(f"{js}: metadata lacks {sorted(need - set(meta if isinstance(meta, dict) else []))}")
    df.attrs["meta"] = meta
    return df


def will_time() -> bool:
    """True on a CUDA GPU, unless KERNELS_BENCH=load asks to reuse the committed tables
    (re-executing a notebook for its prose or figures without re-timing everything)."""
    return ON_GPU and not INTERPRET and os.environ.get("KERNELS_BENCH", "run") != "load"


@contextlib.contextmanager
def _loading():
    """Within: run_or_load loads the saved tables instead of timing."""
    old = os.environ.get("KERNELS_BENCH")
    os.environ["KERNELS_BENCH"] = "load"
    try:
        yield
    finally:
        if old is None:
            del os.environ["KERNELS_BENCH"]
        else:
            os.environ["KERNELS_BENCH"] = old


def in_fresh_process(benchmark):
    """Decorator for a chapter's benchmark function: called where it would time inside a Jupyter kernel,
    it times in a fresh Python process instead (its progress is passed through), then loads the tables
    that process saved.

    Why: a Jupyter kernel runs seven threads besides the one that runs the cell. A Python autograd
    backward hands work to autograd's thread and back through the GIL, and measured up to 40 % slower
    inside a kernel than in a plain process (the FlashAttention-2 backward at causal 1K on the H200:
    0.19 against 0.14 ms), while PyTorch's C++ backward did not move. Programs that train or serve do
    not run inside a Jupyter kernel, so neither do the book's timings. Arguments must be literals."""
    @functools.wraps(benchmark)
    def run(*args, **kwargs):
        if will_time() and "ipykernel" in sys.modules and not os.environ.get(_CHILD):
            code = (f"from {benchmark.__module__} import {benchmark.__name__} as b; "
                    f"b(*{args!r}, **{kwargs!r})")
            root = str(Path(__file__).resolve().parent.parent)  # so the child imports this package
            env = {**os.environ, _CHILD: "1",
                   "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
            child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
            tail = b""
            for chunk in iter(lambda: child.stderr.read1(4096), b""):
                sys.stderr.write(chunk.decode(errors="replace"))
                tail = (tail + chunk)[-4000:]
            if child.wait():
                raise RuntimeError(f"{benchmark.__name__} failed in its own process (exit {child.returncode}):\n"
                                   + tail.decode(errors="replace"))
            with _loading():
                return benchmark(*args, **kwargs)
        return benchmark(*args, **kwargs)
    return run


def run_or_load(name, cases, providers, flops, bytes, timer=time_ms) -> pd.DataFrame:
    """On a CUDA GPU: run `sweep(...)`, save it, return it. Elsewhere: `load(name)`.

    So a notebook shows real GPU numbers everywhere: fresh ones on the GPU box,
    the committed H200 ones under the interpreter (or with KERNELS_BENCH=load).
    """
    if will_time():
        save(sweep(name, cases, providers, flops, bytes, timer), name)
    return load(name)


def provenance(df: pd.DataFrame) -> str:
    """One line naming where and when a results table was measured."""
    m = df.attrs["meta"]
    fla = f", fla {m['fla']}" if "fla" in m else ""
    where = {"fresh": " in a fresh process", "jupyter kernel": " inside the Jupyter kernel"}.get(m.get("process"), "")
    return (f"{m['gpu']} (driver {m.get('driver', '?')}, CUDA {m.get('cuda', '?')}), torch {m['torch']}, "
            f"triton {m['triton']}{fla}; commit {m['commit']}, {m['date']}{where}. Ceilings measured in the same run: "
            f"{m['peak_tflops']:.0f} TFLOP/s bf16 matmul, {m['peak_gbps'] / 1000:.2f} TB/s copy.")
