"""The book's benchmark harness. A family declares its benchmarks (`Benchmark`: cases, providers,
counted work) in its `bench.py`; `run` times them on the GPU, or loads the committed H200 tables on a
machine without one.

Every row carries explicitly counted FLOPs and bytes, so each time becomes TFLOP/s, GB/s and a
percentage of the roofline: max(FLOPs / matmul rate, bytes / copy rate), with both ceilings
re-measured in the same process that does the timing.

    >>> PREFILL = Benchmark("gla_prefill", cases, providers, flops=prefill_flops, bytes_moved=prefill_bytes,
    ...                     timer="flushed", module=__name__)
    >>> df = run(PREFILL)          # writes (GPU) or reads (CPU) results/gla_prefill.csv and .json
    >>> summary(df, index=["T"], over=["fla"])

Cases use the same column names in every family: B (batch), T (sequence or context length),
H (heads), D (head dim), then whatever a family needs besides (causal, pass, s_q, ...).
"""
from __future__ import annotations

import dataclasses
import importlib
import datetime as _dt
import json
import math
import os
import pkgutil
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd
import torch
from tqdm import tqdm

from . import peers
from .common import INTERPRET, ON_GPU


def _default_results_dir() -> Path:
    """The repository's results/ when the package runs from a checkout; results/ in the working
    directory when it was installed (a wheel has no results folder of its own)."""
    root = Path(__file__).resolve().parent.parent
    return root / "results" if (root / "pyproject.toml").exists() else Path.cwd() / "results"


RESULTS_DIR = Path(os.environ.get("KERNELS_RESULTS_DIR") or _default_results_dir())
# do_bench settings (milliseconds of warm-up and of timed repeats), recorded with every table.
WARMUP_MS, REP_MS = 50, 200
_CHILD = "KERNELS_FRESH_PROCESS"  # set in the process that `run` starts from a Jupyter kernel
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
    """GPU, driver, versions, commit and date: recorded with every results table (`sweep` adds the timer
    and the peers the table ran, each with its version)."""
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


def time_loop_ms(fn: Callable[[], object], calls: int = 100, repeats: int = 25) -> float:
    """Time of one `fn()` in ms, as a decode loop sees it: the median over `repeats` runs of `calls`
    calls in a row, with no synchronisation between them and no flush of L2, so a call costs whichever
    is longer, its host work or its GPU work. (do_bench empties L2 between calls: that GPU work can
    hide a call's host time, or not, from one run to the next.)"""
    for _ in range(10):  # warm up (and compile)
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(times)


def peak_memory(fn: Callable[[], object]) -> dict:
    """Peak GPU memory of one call of `fn`, in GiB: peak_gib (by torch.cuda.max_memory_allocated, what was
    allocated before the call included), extra_gib (beyond that) and inputs_gib (what was allocated before:
    the inputs, and whatever else the provider holds, such as a training step's upstream gradient). For a
    training step (`linear.costs.train_step`) the call is the forward and the backward: the peak includes
    what the forward saves for the backward and the gradients returned, and the backward frees the graph
    before the call returns. A first call, outside the measurement, compiles (and autotunes)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return {"peak_gib": peak / 2**30, "extra_gib": (peak - base) / 2**30, "inputs_gib": base / 2**30}


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One results table: every provider on every case, with the work each case must do.

    name: the table, results/<name>.csv and .json.
    cases: dicts of shape parameters (they become columns): B, T, H, D, and whatever else the family needs.
    providers: label -> factory; factory(case) builds the inputs and returns a zero-argument callable to
        time, or None where the provider does not apply (a peer that is not installed, a shape too big).
        The book's own kernels are labelled "book" or "book: <variant>".
    flops, bytes_moved: counted for a case, the same for every provider (the work the operation must do,
        not what a given implementation happens to do).
    timer: one per kind of table. "graph": replayed from a CUDA graph (`time_graph_ms`: GPU time, no launch
        overhead); "plain": Python calls back to back, as a decode loop makes them (`time_loop_ms`: host time
        included); "flushed": do_bench's single calls with L2 emptied between them (`time_ms`). A table named
        `*_graph` or `*_plain` gets that timer (naming another is refused); any other table names its timer.
    measure: instead of timing, measure(fn) -> dict of extra columns (`peak_memory`, say); ms stays empty and no
        timer is named.
    module: the module that declares it (pass `__name__`), so that a fresh process can find it again.
    """
    name: str
    cases: Sequence[Mapping]
    providers: Mapping[str, Callable[[Mapping], Callable[[], object] | None]]
    flops: Callable[[Mapping], float]
    bytes_moved: Callable[[Mapping], float]
    timer: str | None = None
    measure: Callable[[Callable[[], object]], Mapping] | None = None
    module: str | None = None

    def __post_init__(self):
        if self.timer is not None and self.timer not in TIMERS:
            raise ValueError(f"{self.name}: timer must be one of {sorted(TIMERS)}, got {self.timer!r}")
        implied = next((t for t in ("graph", "plain") if self.name.endswith(f"_{t}")), None)
        if implied and self.timer not in (None, implied):
            raise ValueError(f"{self.name}: a *_{implied} table is timed by {implied!r}, not {self.timer!r}")
        if self.measure is not None and self.timer is not None:
            raise ValueError(f"{self.name}: a table that measures (measure=...) is not timed: name no timer")
        if not implied and self.measure is None and self.timer is None:
            raise ValueError(f"{self.name}: name its timer ({', '.join(sorted(TIMERS))}), or end the name in "
                             "_graph or _plain")
        object.__setattr__(self, "timer", self.timer or implied)

    def replayed(self, providers: Sequence[str], max_T: int = 4096) -> Benchmark:
        """The table `<name>_graph`: this one's cases at B = 1 up to max_T tokens, for the named providers, replayed
        from a CUDA graph. A short prompt is a few launches of little work each; a single call's time there can
        hold the host's share, the replay's is the GPU's alone."""
        cases = [c for c in self.cases if c["B"] == 1 and c["T"] <= max_T]
        if not cases:
            raise ValueError(f"{self.name} has no case at B = 1 up to T = {max_T} to replay")
        return dataclasses.replace(self, name=f"{self.name}_graph", timer="graph", cases=cases,
                                   providers={p: self.providers[p] for p in providers})


TIMERS = {"graph": time_graph_ms, "plain": time_loop_ms, "flushed": time_ms}


def _error_note(e: Exception) -> str:
    first = str(e).splitlines()[0][:120] if str(e) else ""
    return f"error: {type(e).__name__}: {first}"


def sweep(benchmark: Benchmark) -> pd.DataFrame:
    """Time (or measure) every provider on every case, on this GPU, and return the tidy table.

    Running out of GPU memory is recorded as a row with ms empty and note "OOM"; a provider that
    does not apply, "n/a"; any other failure, "error: ..." (a broken peer must not sink the sweep).
    The table's attrs["run"] holds its timer and {peer: version} of the peers its providers handed out
    (`save` writes both into the metadata). Progress is a bar on stderr (a sweep started from a notebook
    runs in a fresh process whose stderr goes to the terminal that started Jupyter, not into the notebook);
    with KERNELS_BENCH_TRACE set, one line per job as it starts instead.
    """
    if not ON_GPU or INTERPRET:
        raise RuntimeError("sweep() times kernels and needs a CUDA GPU; on a CPU use run(), which loads")
    ceil = measure_ceilings()
    rows = []
    jobs = [(case, label, factory) for case in benchmark.cases for label, factory in benchmark.providers.items()]
    trace = bool(os.environ.get("KERNELS_BENCH_TRACE"))
    started = time.perf_counter()
    with peers.recording() as used:  # the peers the providers hand out, with their versions
        for i, (case, label, factory) in enumerate(tqdm(jobs, desc=benchmark.name, file=sys.stderr,
                                                        mininterval=2.0, disable=trace)):
            if trace:  # one line as each job starts: a job that never ends is the last one named; the seconds
                # since the sweep began say which jobs (a peer's compile or autotune) take its time
                print(f"[{benchmark.name} {i + 1}/{len(jobs)} at {time.perf_counter() - started:.0f} s] {label} "
                      f"{dict(case)}", file=sys.stderr, flush=True)
            row = {"name": benchmark.name, "provider": label, **case}
            f, b = float(benchmark.flops(case)), float(benchmark.bytes_moved(case))
            roof_ms = max(f / (ceil["peak_tflops"] * 1e9), b / (ceil["peak_gbps"] * 1e6))
            ms, note, extra = math.nan, "", {}
            try:
                fn = factory(case)
                if fn is None:
                    note = "n/a"
                elif benchmark.measure is not None:
                    extra = dict(benchmark.measure(fn))
                else:
                    ms = TIMERS[benchmark.timer](fn)
            except torch.OutOfMemoryError:
                note = "OOM"
            except Exception as e:  # noqa: BLE001 (the table says why)
                note = _error_note(e)
                print(f"[{benchmark.name}] {label} {dict(case)}: {note}", file=sys.stderr)
            finally:
                fn = None
                torch.cuda.empty_cache()
            timed = ms == ms
            row.update(ms=ms, tflops=f / ms / 1e9 if timed else math.nan, gbps=b / ms / 1e6 if timed else math.nan,
                       roofline_ms=roof_ms, pct_roofline=100 * roof_ms / ms if timed else math.nan, note=note, **extra)
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["run"] = {"timer": benchmark.timer, "peers": dict(sorted(used.items()))}
    return df


def save(df: pd.DataFrame, name: str, meta: dict | None = None) -> None:
    """Write results/<name>.csv and results/<name>.json (metadata, ceilings, and the timer and peers of the
    sweep that made `df`)."""
    RESULTS_DIR.mkdir(exist_ok=True)
    meta = {**(meta or metadata()), **df.attrs.get("run", {})}
    if ON_GPU:
        meta.update(measure_ceilings())
    df.to_csv(RESULTS_DIR / f"{name}.csv", index=False, float_format="%.6g")
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")


def load(name: str) -> pd.DataFrame:
    """Read a committed results table; raise FileNotFoundError if there is none (`run` shows such a
    table as not measured yet instead), ValueError saying what is wrong with a broken one.

    The metadata is attached as `df.attrs["meta"]`.
    """
    csv, js = RESULTS_DIR / f"{name}.csv", RESULTS_DIR / f"{name}.json"
    if not csv.exists() or not js.exists():
        raise FileNotFoundError(
            f"no results for '{name}' in {RESULTS_DIR} (need {csv.name} and {js.name}); "
            f"they come from a GPU run: {measure_command([name])}")
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


def run(*benchmarks: Benchmark) -> pd.DataFrame:
    """Time the benchmarks on a CUDA GPU and save their tables; elsewhere (or with KERNELS_BENCH=load)
    load the committed ones. Returns the tables concatenated, with the first one's metadata, and every
    table's in attrs["parts"] (`provenance` names a table measured on another card).

    Inside a Jupyter kernel the timing happens in a fresh Python process (its progress bar goes to the
    terminal that started Jupyter), then the tables it saved are loaded. Why: a Jupyter kernel runs seven threads besides
    the one that runs the cell. A Python autograd backward hands work to autograd's thread and back
    through the GIL, and measured up to 40 % slower inside a kernel than in a plain process (the
    FlashAttention-2 backward at causal 1K on the H200: 0.19 against 0.14 ms). Programs that train
    or serve do not run inside a Jupyter kernel, so neither do the book's timings.
    """
    if will_time():
        if "ipykernel" in sys.modules and not os.environ.get(_CHILD):
            _time_in_fresh_process(benchmarks)
        else:
            for b in benchmarks:
                save(sweep(b), b.name)
    measured = [load(b.name) for b in benchmarks if is_measured(b.name)]
    missing = [b for b in benchmarks if not is_measured(b.name)]
    if not measured:
        return not_measured(*missing)
    df = pd.concat(measured, ignore_index=True) if len(measured) > 1 else measured[0]
    df.attrs["meta"] = measured[0].attrs["meta"]
    df.attrs["parts"] = {b.name: part.attrs["meta"] for b, part in
                         zip((b for b in benchmarks if is_measured(b.name)), measured)}
    if missing:
        df.attrs["unmeasured"] = [b.name for b in missing]
    return df


def is_measured(name: str) -> bool:
    """Whether results/<name>.csv and .json are there (a GPU run wrote them)."""
    return (RESULTS_DIR / f"{name}.csv").exists() and (RESULTS_DIR / f"{name}.json").exists()


def not_measured(*benchmarks: Benchmark) -> pd.DataFrame:
    """What `run` returns for tables no GPU run has written yet: no rows, the columns a measured table
    would have (so `select` and `.assign` work), and the names in attrs["unmeasured"]. `provenance`
    turns it into one line that says how to measure it; `summary` and `plot_results` show nothing."""
    columns = list(dict.fromkeys(["name", "provider", *(c for b in benchmarks for case in b.cases for c in case),
                                  *REQUIRED_COLUMNS]))
    df = pd.DataFrame(columns=columns)
    df.attrs["unmeasured"] = [b.name for b in benchmarks]
    return df


def measure_command(names: Sequence[str]) -> str:
    """The command that times these tables on a GPU and writes them into results/."""
    return "python3 scripts/gpu_probe.py " + " ".join(names)


def script_tables() -> dict[str, str]:
    """The tables a page shows that a script of their own writes, not gpu_probe.py (every family's bench.py may
    declare them in SCRIPT_TABLES): name -> the command that measures them on a GPU."""
    return {name: command for family in families()
            for name, command in getattr(importlib.import_module(f"attention_kernels.{family}.bench"),
                                         "SCRIPT_TABLES", {}).items()}


def measure_commands(names: Sequence[str]) -> list[str]:
    """The commands that measure these tables on a GPU: one gpu_probe.py call for the benchmark tables
    (`measure_command`), then each script table's own (`script_tables`), once each."""
    scripts = script_tables()
    probed = [name for name in names if name not in scripts]
    own = list(dict.fromkeys(scripts[name] for name in names if name in scripts))
    return ([measure_command(probed)] if probed else []) + own


def unmeasured() -> list[str]:
    """The declared tables (every family's BENCHMARKS, then its SCRIPT_TABLES) that have no committed results."""
    declared = [b.name for found in discover().values() for b in found] + list(script_tables())
    return [name for name in declared if not is_measured(name)]


def _time_in_fresh_process(benchmarks) -> None:
    unfound = [b.name for b in benchmarks if not b.module]
    if unfound:
        raise ValueError(f"benchmark(s) {unfound} declare no module (module=__name__): a fresh process cannot find "
                         "them to time them")
    targets = [(b.module, b.name) for b in benchmarks]
    code = f"from attention_kernels.bench import _child_main; _child_main({targets!r})"
    root = str(Path(__file__).resolve().parent.parent)  # so the child imports this package
    env = {**os.environ, _CHILD: "1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    terminal, tail = _terminal_fd(), b""
    for chunk in iter(lambda: child.stderr.read1(4096), b""):
        os.write(terminal, chunk)  # the progress bar, for whoever started Jupyter; never into the notebook
        tail = (tail + chunk)[-4000:]
    if child.wait():
        names = ", ".join(b.name for b in benchmarks)
        raise RuntimeError(f"benchmark {names} failed in its own process (exit {child.returncode}):\n"
                           + tail.decode(errors="replace"))


def _terminal_fd() -> int:
    """The terminal that started this process. Inside a Jupyter kernel sys.stderr is the notebook's output
    stream, and its fileno() is ipykernel's copy of the kernel's original stderr, which writes past the
    notebook; where it has none (a kernel that does not capture file descriptors), fd 2 is that terminal."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return sys.__stderr__.fileno()


def _child_main(targets) -> None:
    """In the fresh process: find each benchmark in the module that declared it, time it, save it."""
    for module, name in targets:
        found = [b for b in vars(importlib.import_module(module)).values()
                 if isinstance(b, Benchmark) and b.name == name]
        if not found:
            raise SystemExit(f"no Benchmark named {name!r} in {module}")
        save(sweep(found[0]), name)


def families() -> list[str]:
    """The families of the package: every sub-package of `attention_kernels` that has a bench.py."""
    root = Path(__file__).resolve().parent
    return sorted(m.name for m in pkgutil.iter_modules([str(root)])
                  if m.ispkg and (root / m.name / "bench.py").exists())


def discover(family: str | None = None) -> dict[str, list[Benchmark]]:
    """family -> the Benchmarks its bench.py declares in BENCHMARKS (all families, or one)."""
    names = [family] if family else families()
    return {f: list(getattr(importlib.import_module(f"attention_kernels.{f}.bench"), "BENCHMARKS", [])) for f in names}


# ------------------------------------------------------------------ reading the tables
def select(df: pd.DataFrame, **where) -> pd.DataFrame:
    """The rows where every column equals its value (or is in it, for a list or tuple); the metadata
    stays attached, so a figure drawn from the subset still names its GPU.

    >>> select(df, B=128, provider=["book", "PyTorch absorbed"])
    """
    keep = pd.Series(True, index=df.index)
    for col, value in where.items():
        if col not in df.columns:
            raise ValueError(f"select: no column {col!r}; columns are {list(df.columns)}")
        keep &= df[col].isin(value) if isinstance(value, (list, tuple, set)) else df[col] == value
    part = df[keep].copy()
    part.attrs = dict(df.attrs)
    return part


UNITS = {"ms": "time (ms)", "us": "time (µs)", "tflops": "TFLOP/s", "gbps": "GB/s", "pct_roofline": "% of roofline",
         "peak_gib": "peak memory (GiB)"}


SPEEDUP = "speed-up over"  # X's time / the book kernel's time: > 1 means the book's kernel is faster
NOT_RUN, OOM_TEXT = "—", "out of memory"


def summary(df: pd.DataFrame, index, *, values: str = "ms", book: str = "book", over=(), scale: float = 1.0,
            roofline: bool = False, digits: int = 3) -> pd.DataFrame | None:
    """One table per figure, with a unit in every header (two header rows):

    - ("time (ms)" or the unit of `values`, provider): `values` per provider, times `scale`
      (scale=1000 turns ms into "time (µs)");
    - ("speed-up over", X) for each X in `over`: X's time / the `book` kernel's time, so > 1 means the
      book is faster; an item (K, X) of `over` gives ("K's speed-up over", X), K's time against X's;
    - with roofline=True, ("% of roofline", book).
    Shapes a provider did not run read "—" (never NaN), or "out of memory" where that is what happened.
    A table with no rows (not measured yet) gives None, which a notebook shows as nothing.
    Cells are text with a fixed number of decimals per column: `values` `digits`, speed-ups two,
    percentages one.

    >>> summary(df, index=["causal", "T"], values="tflops", over=["SDPA flash", "SDPA cuDNN"])
    >>> summary(df, index=["B", "T"], over=["PyTorch absorbed", ("book: Triton", "book: no split")])
    """
    if df.empty:  # a table not measured yet: its provenance line says so
        return None
    index = [index] if isinstance(index, str) else list(index)
    order = list(dict.fromkeys(df["provider"]))
    unit = "time (µs)" if values == "ms" and scale == 1000 else UNITS.get(values, values)
    raw = df.pivot_table(index=index, columns="provider", values=values, dropna=False, sort=True) * scale
    # dropna=False crosses every index level with every other: keep only the cases the table holds
    ran = pd.MultiIndex.from_frame(df[index]) if len(index) > 1 else pd.Index(df[index[0]])
    keep = raw.index.isin(ran)
    columns = {(unit, p): raw.loc[keep, p] for p in order if p in raw.columns}
    times = df.pivot_table(index=index, columns="provider", values="ms", dropna=False, sort=True)[keep]
    for item in over:
        kernel, peer = item if isinstance(item, (tuple, list)) else (book, item)
        if kernel in times and peer in times:
            group = SPEEDUP if kernel == book else f"{kernel}'s {SPEEDUP}"
            columns[(group, peer)] = times[peer] / times[kernel]
    if roofline:
        pct = df[df["provider"] == book].pivot_table(index=index, values="pct_roofline", sort=True)["pct_roofline"]
        columns[(UNITS["pct_roofline"], book)] = pct.reindex(times.index)
    table = pd.DataFrame(columns)
    table.columns = pd.MultiIndex.from_tuples(table.columns)
    # numbers as text with a fixed number of decimals per column, so a column reads 1.30, 1.21, not 1.3, 1.21
    decimals = {c: digits if c[0] == unit else (1 if c[0] == UNITS["pct_roofline"] else 2) for c in table.columns}
    shown = pd.DataFrame({c: [NOT_RUN if v != v else f"{v:.{decimals[c]}f}" for v in table[c]] for c in table.columns},
                         index=table.index)
    shown.columns = table.columns
    oom = df[df["note"].astype("string").fillna("") == "OOM"]
    for _, row in oom.iterrows():
        key = tuple(row[c] for c in index) if len(index) > 1 else row[index[0]]
        if (unit, row["provider"]) in shown.columns and key in shown.index:
            shown.loc[key, (unit, row["provider"])] = OOM_TEXT
    return shown


@dataclasses.dataclass(frozen=True)
class Panel:
    """A family's panel in the book's headline figure: its book kernel against its strongest peers.

    benchmark: the table's name; where: rows to keep (as `select`); x: the length axis; y: "tflops" or "ms".
    """
    benchmark: str
    where: Mapping
    x: str
    y: str
    providers: Sequence[str]
    title: str
    xlabel: str = "sequence length T"


# Characters of code or printed text that fit the book's text column at a 1280 px window (14 px monospace).
TEXT_WIDTH = 77


def provenance(df: pd.DataFrame) -> str:
    """Where and when a results table was measured (the commit that measured it included), in lines that
    fit the book's text column; for a table not measured yet, one line naming it and the command that
    measures it."""
    missing = df.attrs.get("unmeasured", [])
    note = (f"Not measured yet: {', '.join(missing)} (on a GPU: {measure_command(missing)})."
            if missing else "")
    if "meta" not in df.attrs:
        return textwrap.fill(note or "Not measured yet.", TEXT_WIDTH, break_on_hyphens=False)
    m = df.attrs["meta"]
    # "peers": what the table ran, with versions; tables measured before that was recorded name fla alone
    ran = m.get("peers") or ({"fla": m["fla"]} if "fla" in m else {})
    versions = "".join(f", {peer} {version}" for peer, version in ran.items())
    where = {"fresh": " in a fresh process", "jupyter kernel": " inside the Jupyter kernel"}.get(m.get("process"), "")
    timed = {"graph": " Timed by CUDA-graph replays.", "plain": " Timed by calls back to back.",
             "flushed": " Timed by single calls, L2 flushed between them."}.get(m.get("timer"), "")
    text = (f"{m['gpu']} (driver {m.get('driver', '?')}, CUDA {m.get('cuda', '?')}), torch {m['torch']}, "
            f"triton {m['triton']}{versions}; commit {m['commit']}, {m['date']}{where}.{timed} Ceilings measured in "
            f"the same run: {m['peak_tflops']:.0f} TFLOP/s bf16 matmul, {m['peak_gbps'] / 1000:.2f} TB/s copy.")
    # a table timed on another card: the reader must know which rows are whose before taking a ratio
    elsewhere = [f"The rows of {name} were measured on another card: {other['gpu']}, commit {other['commit']}, "
                 f"{other['date']}."
                 for name, other in df.attrs.get("parts", {}).items() if other["gpu"] != m["gpu"]]
    return "\n".join(textwrap.fill(t, TEXT_WIDTH, break_on_hyphens=False) for t in (text, *elsewhere, note) if t)
