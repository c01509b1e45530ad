"""The shared helpers: the comparison every test relies on, the input checks, the benchmark harness and
its results loader, the figure, and the library's promise to import anywhere without side effects."""
import io
import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from attention_kernels import bench
from attention_kernels.checks import (check_kernel_device, check_no_grad, check_once_per_signature, check_same_device_and_dtype,
                            check_tensor, softmax_scale_or_default)
from attention_kernels.common import INTERPRET, assert_close, pick, rel_err


def test_rel_err_exact_and_scaled():
    ref = torch.randn(5, 7, dtype=torch.float64)
    assert rel_err(ref.clone(), ref) == 0.0
    assert rel_err(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_rel_err_fails_on_nonfinite(bad):
    ref = torch.randn(4, 4)
    out = ref.clone()
    out[2, 3] = bad
    assert rel_err(out, ref) == float("inf")
    with pytest.raises(AssertionError, match="relative error inf"):
        assert_close(out, ref, tol=1.0)


def test_assert_close_rejects_wrong_answer():
    ref = torch.randn(64)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_close(ref + 0.1 * torch.randn(64), ref, tol=1e-3, name="o")
    assert assert_close(ref.half().float(), ref, tol=1e-3) < 1e-3


def test_rel_err_refuses_broadcasting():
    with pytest.raises(ValueError, match="shape mismatch"):
        rel_err(torch.zeros(3, 1), torch.zeros(3, 4))


def test_check_tensor_messages():
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        check_tensor("q", [1, 2])
    with pytest.raises(ValueError, match="q must have 4 dims"):
        check_tensor("q", torch.zeros(2, 3), ndim=4)
    with pytest.raises(TypeError, match="q has dtype float64"):
        check_tensor("q", torch.zeros(2, dtype=torch.float64), dtypes=(torch.float32,))
    with pytest.raises(ValueError, match=r"k must have shape \[2, \*\], got \(3, 4\)"):
        check_tensor("k", torch.zeros(3, 4), shape=(2, None))


def test_same_device_and_dtype_names_every_argument():
    with pytest.raises(TypeError, match="q, k must share one dtype, got q float32, k float16"):
        check_same_device_and_dtype(q=torch.zeros(1), k=torch.zeros(1, dtype=torch.float16))
    with pytest.raises(ValueError, match="k on meta"):
        check_same_device_and_dtype(q=torch.zeros(1), k=torch.zeros(1, device="meta"))


def test_machine_rule():
    with pytest.raises(ValueError, match="v is on meta"):
        check_kernel_device(v=torch.zeros(1, device="meta"))
    if INTERPRET:
        with pytest.raises(TypeError, match="q is bfloat16"):
            check_kernel_device(q=torch.zeros(1, dtype=torch.bfloat16))
    else:
        with pytest.raises(ValueError, match="q is on cpu"):
            check_kernel_device(q=torch.zeros(1))


@pytest.mark.parametrize("scale, exc", [(True, TypeError), ("0.1", TypeError), (0.0, ValueError),
                                        (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError)],
                         ids=["bool", "str", "zero", "negative", "nan", "inf"])
def test_scale_rule(scale, exc):
    with pytest.raises(exc, match="softmax_scale"):
        softmax_scale_or_default(scale, 64)


def test_scale_default_and_required():
    assert softmax_scale_or_default(None, 64) == 0.125
    assert softmax_scale_or_default(2, 64) == 2.0
    with pytest.raises(TypeError, match="softmax_scale is required"):
        softmax_scale_or_default(None, None)


def test_check_no_grad_names_the_tensor_in_grad_mode_only():
    q, k = torch.zeros(2, requires_grad=True), torch.zeros(2)
    with pytest.raises(ValueError, match="q requires grad, and fused_recurrent_gla has no backward"):
        check_no_grad("fused_recurrent_gla", k=k, q=q)
    with torch.no_grad():
        check_no_grad("fused_recurrent_gla", k=k, q=q)


def _counted_check(**options):
    """A check that reads shapes, dtypes, requires_grad, the grad mode and a scalar (and strides where asked),
    wrapped in check_once_per_signature; and the list of the calls that reached it."""
    reached = []

    @check_once_per_signature(**options)
    def check(x, gates, scale=1.0, *, name="x"):
        reached.append(1)
        check_tensor(name, x, dtypes=(torch.float32,))
        if isinstance(scale, bool) or scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        return (tuple(x.shape), x.requires_grad and torch.is_grad_enabled(), scale,
                x.stride() if options.get("strides") else None, tuple(gates))
    return check, reached


def test_check_once_per_signature_keeps_the_verdict_of_a_signature():
    """The same signature again (new tensors, the same shapes, dtypes, devices, requires_grad, grad mode, scalar
    types and values, containers): the kept verdict, the check not run; anything of these changed: run again."""
    check, reached = _counted_check()
    x = torch.zeros(2, 3)
    first = check(x, {"g": (x, "B T")}, 1.0)
    assert check(torch.ones(2, 3), {"g": (torch.ones(2, 3), "B T")}, 1.0) == first and len(reached) == 1
    changed = {
        "shape": lambda: check(torch.zeros(3, 3), {"g": (x, "B T")}, 1.0),
        "dtype": lambda: pytest.raises(TypeError, check, x.double(), {"g": (x, "B T")}, 1.0),
        "requires_grad": lambda: check(x.clone().requires_grad_(), {"g": (x, "B T")}, 1.0),
        "grad mode": lambda: torch.no_grad()(check)(x, {"g": (x, "B T")}, 1.0),
        "scalar value": lambda: check(x, {"g": (x, "B T")}, 0.25),
        "scalar type": lambda: check(x, {"g": (x, "B T")}, 1),   # 1 == 1.0, as a dict key too
        "keyword": lambda: check(x, {"g": (x, "B T")}, 1.0, name="y"),
        "gate's letters": lambda: check(x, {"g": (x, "B H")}, 1.0),
        "gate's shape": lambda: check(x, {"g": (x[:1], "B T")}, 1.0),
        "gate's name": lambda: check(x, {"h": (x, "B T")}, 1.0),
        "a list, not a tuple": lambda: check(x, {"g": [x, "B T"]}, 1.0),
        "device": lambda: check(x.to("meta"), {"g": (x, "B T")}, 1.0),
    }
    for what, call in changed.items():
        before = len(reached)
        call()
        assert len(reached) == before + 1, f"a changed {what} was not checked again"
    assert check(torch.zeros(2, 3), {"g": (x, "B T")}, 1.0) == first and len(reached) == len(changed) + 1


def test_check_once_per_signature_keeps_no_refusal_and_judges_the_unusual_every_time():
    """A refused call is checked (and refused) every time, with the check's own message; an argument the signature
    cannot describe (a tensor subclass, another object) sends every call to the check."""
    check, reached = _counted_check()
    x = torch.zeros(2)
    for _ in range(2):
        with pytest.raises(ValueError, match="scale must be > 0, got True"):
            check(x, {}, True)
    assert len(reached) == 2 and not check.verdicts

    class Sub(torch.Tensor):
        pass
    for _ in range(2):
        check(x.as_subclass(Sub), {}, 0.5)
        check(x, {}, 0.5, name=object())
    assert len(reached) == 6 and not check.verdicts


def test_check_once_per_signature_reads_strides_where_asked():
    x = torch.zeros(4, 6)
    for strides, checks in ((False, 1), (True, 2)):
        check, reached = _counted_check(strides=strides)
        check(x, ())
        check(x.t().contiguous().t(), ())   # the same shape, other strides
        assert len(reached) == checks


def test_check_once_per_signature_keeps_at_most_the_bound():
    """At most `most` signatures (512 by default) are kept, the oldest dropped first: it is checked again."""
    check, reached = _counted_check(most=4)
    for n in range(1, 11):
        check(torch.zeros(n), ())
    assert len(check.verdicts) == 4 and len(reached) == 10
    check(torch.zeros(10), ())
    assert len(reached) == 10
    check(torch.zeros(1), ())
    assert len(reached) == 11 and len(check.verdicts) == 4
    check, _ = _counted_check()
    for n in range(1, 600):
        check(torch.zeros(n), ())
    assert len(check.verdicts) == 512
    check.cache_clear()
    assert not check.verdicts


def test_pick_chooses_cpu_shapes_here():
    assert pick(cpu="small", gpu="large") == ("large" if torch.cuda.is_available() else "small")


# ---- results loader -------------------------------------------------------------------------

GOOD_META = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6.0", "date": "2026-11-30 00:00 UTC",
             "commit": "abc1234", "peak_tflops": 700.0, "peak_gbps": 4300.0}


def _write(tmp_path, monkeypatch, csv_text, meta=GOOD_META):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    (tmp_path / "t.csv").write_text(csv_text)
    (tmp_path / "t.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))


HEADER = "name,provider,N,ms,tflops,gbps,roofline_ms,pct_roofline,note\n"


def test_load_reads_a_good_table(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, HEADER + "t,book,1024,0.5,100,10,0.25,50,\nt,eager,1024,,,,0.25,,OOM\n")
    df = bench.load("t")
    assert list(df["provider"]) == ["book", "eager"]
    assert df.attrs["meta"]["gpu"] == "NVIDIA H200"
    assert "NVIDIA H200" in bench.provenance(df)


def test_load_missing_files_says_how_to_make_them(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="gpu_probe.py nothing"):
        bench.load("nothing")


def _declared(name, cases=({"B": 1, "T": 64},)):
    return bench.Benchmark(name, list(cases), {"book": lambda case: None}, flops=lambda c: 1.0,
                           bytes_moved=lambda c: 1.0, timer="plain", module=__name__)


def test_a_table_not_measured_yet_shows_one_line(tmp_path, monkeypatch):
    """A chapter cell whose table no GPU run has written prints one plain line (which table, the
    command that measures it) and raises nothing: select, assign, summary and the figure all work."""
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    df = bench.run(_declared("later_table"))
    assert df.empty and {"B", "T", "provider", "ms"} <= set(df.columns)
    text = bench.provenance(df)
    assert " ".join(text.splitlines()) == \
        "Not measured yet: later_table (on a GPU: python3 scripts/gpu_probe.py later_table)."
    assert max(map(len, text.splitlines())) <= bench.TEXT_WIDTH
    assert bench.summary(bench.select(df, B=1).assign(mode="plain"), index=["mode", "B"]) is None
    from attention_kernels.plot import plot_results
    assert plot_results(df, x="T", y="ms") is None


def test_a_measured_table_beside_an_unmeasured_one(tmp_path, monkeypatch):
    """`run` of a measured and an unmeasured table returns the measured rows, and the provenance says
    where they were measured and which table is still to come."""
    _write(tmp_path, monkeypatch, HEADER + "t,book,1024,0.5,100,10,0.25,50,\n")
    df = bench.run(_declared("t", [{"N": 1024}]), _declared("later_table"))
    assert list(df["provider"]) == ["book"]
    text = bench.provenance(df)
    assert "NVIDIA H200" in text and "commit abc1234" in text
    assert " ".join(text.splitlines()).endswith("Not measured yet: later_table (on a GPU: python3 "
                                                "scripts/gpu_probe.py later_table).")


def test_unmeasured_lists_declared_tables_without_results(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    names = bench.unmeasured()
    declared = [b.name for found in bench.discover().values() for b in found]
    assert names == declared + list(bench.script_tables()) and declared  # nothing in an empty folder is measured
    # the loss curves of "In a model" come from their own script, not gpu_probe.py
    assert bench.script_tables()["in_a_model_losses"] == "python3 scripts/train_tiny.py"
    assert bench.measure_commands(names) == [bench.measure_command(declared), "python3 scripts/train_tiny.py"]
    assert bench.measure_commands(["in_a_model_losses"]) == ["python3 scripts/train_tiny.py"]


def test_unmeasured_tables_script_names_the_script_tables(tmp_path):
    """scripts/unmeasured_tables.py on an empty results folder lists the benchmark tables and the loss curves,
    each with the command that measures it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "KERNELS_RESULTS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, os.path.join(root, "scripts", "unmeasured_tables.py")], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300, check=True)
    assert "in_a_model_losses" in done.stdout and "compare_train" in done.stdout
    assert done.stdout.rstrip().endswith("; python3 scripts/train_tiny.py"), done.stdout


@pytest.mark.parametrize("csv_text, message", [
    ("name,provider,N\nt,book,1\n", "missing column"),
    (HEADER, "no rows"),
    (HEADER + "t,book,1024,fast,100,10,0.25,50,\n", "non-numeric"),
], ids=["missing-columns", "no-rows", "text-in-ms"])
def test_load_rejects_malformed_tables(tmp_path, monkeypatch, csv_text, message):
    _write(tmp_path, monkeypatch, csv_text)
    with pytest.raises(ValueError, match=message):
        bench.load("t")


@pytest.mark.parametrize("meta, message", [
    ("{not json", "not valid JSON"),
    ({"gpu": "NVIDIA H200"}, "metadata lacks"),
], ids=["bad-json", "missing-keys"])
def test_load_rejects_malformed_metadata(tmp_path, monkeypatch, meta, message):
    _write(tmp_path, monkeypatch, HEADER + "t,book,1024,0.5,100,10,0.25,50,\n", meta)
    with pytest.raises(ValueError, match=message):
        bench.load("t")


def _benchmark(provider, name="t", **kw):
    kw = {"timer": "flushed", "module": __name__, **kw}
    return bench.Benchmark(name, [{"T": 1024}], {"book": provider}, flops=lambda c: 1, bytes_moved=lambda c: 1, **kw)


def test_benchmark_records_where_it_is_declared():
    assert _benchmark(lambda case: None).module == __name__
    with pytest.raises(ValueError, match="timer must be one of"):
        _benchmark(lambda case: None, timer="wall")


@pytest.mark.parametrize("name, timer, expected", [
    ("x_decode_graph", None, "graph"), ("x_decode_graph", "graph", "graph"),
    ("x_decode_plain", None, "plain"), ("x_decode_plain", "plain", "plain"),
    ("x_prefill", "flushed", "flushed"), ("x_prefill", "graph", "graph"), ("x_prefill", "plain", "plain"),
    ("x_decode_graph", "plain", "is timed by 'graph'"), ("x_decode_plain", "flushed", "is timed by 'plain'"),
    ("x_decode_plain", "graph", "is timed by 'plain'"), ("x_prefill", None, "name its timer"),
    ("x_decode_graphs", None, "name its timer"),
])
def test_a_table_has_one_timer_for_its_kind(name, timer, expected):
    """One timer per kind of table: *_graph tables are CUDA-graph replays, *_plain tables calls back to back;
    any other table names its timer ("flushed": do_bench's single calls), and nothing else is accepted."""
    if expected in bench.TIMERS:
        assert _benchmark(lambda case: None, name=name, timer=timer).timer == expected
    else:
        with pytest.raises(ValueError, match=expected):
            _benchmark(lambda case: None, name=name, timer=timer)


def test_a_table_that_measures_names_no_timer():
    measured = _benchmark(lambda case: None, timer=None, measure=lambda fn: {"peak_gib": 1.0})
    assert measured.timer is None
    with pytest.raises(ValueError, match="is not timed"):
        _benchmark(lambda case: None, measure=lambda fn: {"peak_gib": 1.0})


def test_a_replayed_table_is_its_short_prompts_from_a_cuda_graph():
    from attention_kernels.gla import bench as gla_bench
    from attention_kernels.kda import bench as kda_bench
    from attention_kernels.lightning import bench as lightning_bench
    from attention_kernels.mamba2 import bench as mamba2_bench
    for family in (gla_bench, lightning_bench, kda_bench, mamba2_bench):
        replayed, single = family.PREFILL_GRAPH, family.PREFILL
        assert replayed.name == f"{single.name}_graph" and replayed.timer == "graph"
        assert replayed.cases == [c for c in single.cases if c["B"] == 1 and c["T"] <= 4096] and replayed.cases
        assert all(replayed.providers[p] is single.providers[p] for p in replayed.providers)
        assert replayed in family.BENCHMARKS and replayed.module == single.module
    two = bench.Benchmark("t", [{"B": 8, "T": 1024}, {"B": 1, "T": 8192}], {"book": lambda c: None, "peer": None},
                          flops=lambda c: 1, bytes_moved=lambda c: 1, timer="flushed", module=__name__)
    with pytest.raises(ValueError, match="no case at B = 1 up to T = 4096"):
        two.replayed(["book"])
    assert list(two.replayed(["book"], max_T=8192).providers) == ["book"]


def test_peak_memory_measures_the_second_call_beyond_what_was_there(monkeypatch):
    """`peak_memory` with the allocator's counters stood in for: the first call (compiling, with a scratch peak
    of its own) is left out, what was allocated before the measured call is the inputs, the rest is extra."""
    GiB = 2**30
    state = {"allocated": 2 * GiB, "peak": 2 * GiB, "calls": 0}

    def allocate(n):
        state["peak"] = max(state["peak"], state["allocated"] + n)

    def step():
        state["calls"] += 1
        allocate(10 * GiB if state["calls"] == 1 else 1 * GiB)   # the first call's autotuning scratch
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: state.update(peak=state["allocated"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: state["peak"])
    assert bench.peak_memory(step) == {"peak_gib": 3.0, "extra_gib": 1.0, "inputs_gib": 2.0}
    assert state["calls"] == 2


@pytest.mark.gpu
def test_peak_memory_of_a_training_step_counts_what_the_forward_keeps_and_frees_it():
    """One training step (`costs.train_step`) of exp(2x): the inputs are x and the upstream gradient, the peak
    holds at least the output the forward keeps for the backward, and the step frees its graph."""
    from attention_kernels.linear.costs import train_step

    size = 64 * 2**20   # bytes of x, fp32
    x = torch.randn(size // 4, device="cuda", requires_grad=True)
    step = train_step(lambda t: (2 * t).exp(), (x,), (x,))
    before = torch.cuda.memory_allocated()
    measured = bench.peak_memory(step)
    assert torch.cuda.memory_allocated() == before           # nothing of the step outlives it
    assert measured["inputs_gib"] * 2**30 >= 2 * size         # x and the upstream gradient
    assert size <= measured["extra_gib"] * 2**30 <= 4 * size  # the kept output, the gradients, no more
    assert measured["peak_gib"] == pytest.approx(measured["inputs_gib"] + measured["extra_gib"])


def test_every_declared_table_names_its_module_and_a_timer_of_its_kind():
    """The families' tables as declared: each names the module it lives in (a fresh process finds it there), and
    the plain tables of every family are timed the same way."""
    for family, tables in bench.discover().items():
        for table in tables:
            assert table.module == f"attention_kernels.{family}.bench", table.name
            assert table.timer in bench.TIMERS or table.measure is not None, table.name
            if table.name.endswith("_plain"):
                assert bench.TIMERS[table.timer] is bench.time_loop_ms, table.name


def test_a_table_without_a_module_is_not_timed_in_a_fresh_process(monkeypatch):
    monkeypatch.setattr(bench, "will_time", lambda: True)
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    monkeypatch.delenv("KERNELS_FRESH_PROCESS", raising=False)
    with pytest.raises(ValueError, match="declare no module"):
        bench.run(_benchmark(lambda case: None, module=None))


def test_sweep_records_the_timer_and_the_peers_it_ran(tmp_path, monkeypatch):
    """The metadata names the timer and every peer the table's providers were handed, with its version; a peer
    that is absent here is not named."""
    from attention_kernels import peers
    monkeypatch.setattr(bench, "ON_GPU", True)
    monkeypatch.setattr(bench, "INTERPRET", False)
    monkeypatch.setattr(bench, "measure_ceilings", lambda: {"peak_tflops": 1.0, "peak_gbps": 1.0})
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    fake = type(sys)("tilelang")
    fake.__version__ = "1.2.3"
    monkeypatch.setitem(sys.modules, "tilelang", fake)  # TileLang "installed", nothing else
    monkeypatch.setattr(peers, "_optional", lambda module, name=None: fake if module == "tilelang" else None)

    def with_peers(case):
        peers.tilelang(), peers.sdpa("cuDNN")
        peers.fla("gla", "chunk_gla")  # absent: not recorded
        return None

    df = bench.sweep(_benchmark(with_peers, name="t_decode_plain", timer=None))
    cudnn = str(torch.backends.cudnn.version())
    assert df.attrs["run"] == {"timer": "plain", "peers": {"TileLang": "1.2.3", "cuDNN": cudnn}}
    bench.save(df, "t", {**GOOD_META})
    meta = json.loads((tmp_path / "t.json").read_text())
    assert meta["timer"] == "plain" and meta["peers"] == {"TileLang": "1.2.3", "cuDNN": cudnn}
    df.attrs["meta"] = meta
    text = bench.provenance(df).replace("\n", " ")
    assert "TileLang 1.2.3" in text and "calls back to back" in text
    with peers.recording() as outer, peers.recording() as inner:  # blocks nest: each sees what was handed out
        peers.tilelang()
    assert outer == inner == {"TileLang": "1.2.3"}


def test_run_never_times_on_a_cpu(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("on a GPU run() times for real")
    _write(tmp_path, monkeypatch, HEADER + "t,book,1024,0.5,100,10,0.25,50,\n")

    def provider_that_must_not_run(case):
        raise AssertionError("timed on a CPU")

    df = bench.run(_benchmark(provider_that_must_not_run))
    assert df["ms"].iloc[0] == 0.5


@pytest.mark.parametrize("trace", [True, False], ids=["traced", "bar"])
def test_sweep_names_each_job_as_it_starts_when_traced(trace, monkeypatch, capsys):
    """With KERNELS_BENCH_TRACE a sweep prints one line per job before running it, with the seconds since the
    sweep began (a job that hangs is the last one named); without it, no such lines (the progress bar only)."""
    monkeypatch.setattr(bench, "ON_GPU", True)
    monkeypatch.setattr(bench, "INTERPRET", False)
    monkeypatch.setattr(bench, "measure_ceilings", lambda: {"peak_tflops": 1.0, "peak_gbps": 1.0})
    if trace:
        monkeypatch.setenv("KERNELS_BENCH_TRACE", "1")
    else:
        monkeypatch.delenv("KERNELS_BENCH_TRACE", raising=False)
    started = []
    b = bench.Benchmark("t", [{"T": 64}, {"T": 128}], {"book": lambda case: started.append(case["T"])},
                        flops=lambda c: 1, bytes_moved=lambda c: 1, timer="flushed", module=__name__)
    df = bench.sweep(b)
    assert started == [64, 128] and list(df["note"]) == ["n/a", "n/a"]
    named = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[t ")]
    assert named == (["[t 1/2 at 0 s] book {'T': 64}", "[t 2/2 at 0 s] book {'T': 128}"] if trace else [])


FAKE_FAMILY_BENCH = """
import os
import sys

import pandas as pd

from attention_kernels import bench


def _fake_sweep(benchmark):  # the fresh process: "time", say so, hand back a table
    if benchmark.cases[0]["T"] < 0:
        raise SystemExit("negative T")
    open(os.environ["MARKER"], "a").write(benchmark.name + ";")
    sys.stderr.write("progress 100%\\n")
    return pd.DataFrame([dict(name=benchmark.name, provider="book", T=benchmark.cases[0]["T"], ms=0.25, tflops=1,
                              gbps=1, roofline_ms=0.1, pct_roofline=40, note="")])


if os.environ.get("KERNELS_FRESH_PROCESS"):
    bench.sweep = _fake_sweep
    bench.metadata = lambda: {"gpu": "fake GPU", "torch": "x", "triton": "x", "date": "today", "commit": "abc",
                              "peak_tflops": 1.0, "peak_gbps": 1.0}

ONE = bench.Benchmark("one", [{"T": 64}], {"book": lambda c: None}, flops=lambda c: 1, bytes_moved=lambda c: 1,
                      timer="flushed", module=__name__)
TWO = bench.Benchmark("two", [{"T": 128}], {"book": lambda c: None}, flops=lambda c: 1, bytes_moved=lambda c: 1,
                      timer="flushed", module=__name__)
BROKEN = bench.Benchmark("broken", [{"T": -1}], {"book": lambda c: None}, flops=lambda c: 1, bytes_moved=lambda c: 1,
                       timer="flushed", module=__name__)
"""


class _NotebookStderr(io.StringIO):
    """sys.stderr as ipykernel makes it: what is written shows in the notebook; fileno() is the terminal."""

    def __init__(self, terminal):
        super().__init__()
        self.terminal = terminal

    def fileno(self):
        return self.terminal.fileno()


def test_run_times_in_a_fresh_process_inside_jupyter(tmp_path, monkeypatch):
    """Inside a Jupyter kernel, run() times in a child process (found again by module and name), sends its
    progress to the terminal that started Jupyter (never into the notebook), then loads the tables the
    child saved."""
    (tmp_path / "fakefamily_bench.py").write_text(FAKE_FAMILY_BENCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("MARKER", str(tmp_path / "marker"))
    monkeypatch.setenv("KERNELS_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("KERNELS_BENCH", raising=False)
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(bench, "will_time", lambda: True)
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    import fakefamily_bench as fake
    with open(tmp_path / "terminal", "w+") as terminal:
        notebook = _NotebookStderr(terminal)
        monkeypatch.setattr(sys, "stderr", notebook)
        df = bench.run(fake.ONE, fake.TWO)
        assert "progress 100%" in (tmp_path / "terminal").read_text()
        assert notebook.getvalue() == ""
    assert (tmp_path / "marker").read_text() == "one;two;"  # both timed, in one child
    assert list(df["T"]) == [64, 128] and df.attrs["meta"]["gpu"] == "fake GPU"
    with pytest.raises(RuntimeError, match="(?s)broken failed in its own process.*negative T"):
        bench.run(fake.BROKEN)


def _table():
    rows = [dict(name="t", provider=p, T=t, ms=ms * t / 1024, tflops=1.0, gbps=1.0, roofline_ms=0.1,
                 pct_roofline=100 * 0.1 / (ms * t / 1024), note="") for p, ms in (("book", 0.5), ("peer", 1.0))
            for t in (1024, 2048)]
    rows.append(dict(name="t", provider="eager", T=1024, ms=2.0, tflops=1.0, gbps=1.0, roofline_ms=0.1,
                     pct_roofline=5.0, note=""))
    rows.append(dict(name="t", provider="eager", T=2048, ms=float("nan"), tflops=float("nan"), gbps=float("nan"),
                     roofline_ms=0.1, pct_roofline=float("nan"), note="OOM"))
    df = pd.DataFrame(rows)
    df.attrs["meta"] = GOOD_META
    return df


def test_summary_keeps_its_shape_when_a_peer_did_not_run():
    """A peer that is not installed gives rows with no time ("n/a"): its columns stay, reading "—", so a
    chapter's table has the same shape on every machine."""
    full = _table()
    missing = full.copy()
    peer = missing["provider"] == "peer"
    missing.loc[peer, ["ms", "tflops", "gbps", "pct_roofline"]] = float("nan")
    missing["note"] = missing["note"].astype(object)
    missing.loc[peer, "note"] = "n/a"
    args = dict(index="T", over=["peer", "eager", ("peer", "eager")], roofline=True)
    a, b = bench.summary(full, **args), bench.summary(missing, **args)
    assert list(a.columns) == list(b.columns) and a.shape == b.shape
    assert (b[("time (ms)", "peer")] == "—").all() and (b[("speed-up over", "peer")] == "—").all()


def test_provenance_fits_the_text_column():
    df = _table()
    df.attrs["meta"] = {**GOOD_META, "driver": "580.159.04", "cuda": "13.0", "fla": "0.6.0", "process": "fresh",
                        "torch": "2.11.0+cu130"}
    lines = bench.provenance(df).splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= bench.TEXT_WIDTH
    assert "fla 0.6.0" in bench.provenance(df)  # a table measured before the peers were recorded by name
    df.attrs["meta"] = {**df.attrs["meta"], "timer": "graph", "peers": {"FlashMLA": "1.0.0", "TileLang": "0.1.6"}}
    text = bench.provenance(df)
    assert "FlashMLA 1.0.0, TileLang 0.1.6" in text.replace("\n", " ") and "CUDA-graph replays" in text
    assert max(map(len, text.splitlines())) <= bench.TEXT_WIDTH


def test_provenance_names_a_table_from_another_card():
    """Two tables shown together whose rows come from two cards: the provenance says which rows are whose,
    so a reader never takes a ratio across cards."""
    df = _table()
    h100 = {**GOOD_META, "gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234"}
    df.attrs["meta"] = h100
    df.attrs["parts"] = {"softmax_table": h100, "step_table": GOOD_META}
    text = bench.provenance(df).replace("\n", " ")
    assert "The rows of step_table were measured on another card: NVIDIA H200" in text
    assert "softmax_table" not in text
    df.attrs["parts"] = {"softmax_table": h100, "step_table": h100}
    assert "another card" not in bench.provenance(df)


def test_summary_speedup_means_the_book_is_faster():
    t = bench.summary(_table(), index="T", over=["peer", "eager", ("peer", "eager")], roofline=True)
    assert t.loc[1024, ("speed-up over", "peer")] == "2.00"        # the peer takes twice as long
    assert t.loc[1024, ("speed-up over", "eager")] == "4.00"
    assert t.loc[1024, ("peer's speed-up over", "eager")] == "2.00"  # another kernel's ratio names that kernel
    assert t.loc[2048, ("time (ms)", "eager")] == "out of memory"   # never NaN
    assert t.loc[2048, ("speed-up over", "eager")] == "—"
    assert t.loc[1024, ("% of roofline", "book")] == "20.0"
    assert list(t[("time (ms)", "book")]) == ["0.500", "1.000"]      # one number of decimals per column
    assert list(t.columns.get_level_values(0).unique()) == ["time (ms)", "speed-up over", "peer's speed-up over",
                                                            "% of roofline"]
    assert set(bench.summary(_table(), index="T", scale=1000).columns.get_level_values(0)) == {"time (µs)"}
    tflops = bench.summary(_table(), index="T", values="tflops")
    assert set(tflops.columns.get_level_values(0)) == {"TFLOP/s"}


def test_select_keeps_the_metadata():
    part = bench.select(_table(), provider=["book", "peer"], T=1024)
    assert set(part["provider"]) == {"book", "peer"} and set(part["T"]) == {1024}
    assert part.attrs["meta"]["gpu"] == "NVIDIA H200"
    with pytest.raises(ValueError, match="no column 'N'"):
        bench.select(_table(), N=1024)


def test_every_family_declares_its_benchmarks():
    """A family is found, not listed: its bench.py declares BENCHMARKS (with tables named after the family,
    in the one case schema) and a HEADLINE panel drawn from one of them, or None to stay out of the figure."""
    found = bench.discover()
    assert {"flash_attn", "mla", "gla"} <= set(found)
    for family, benchmarks in found.items():
        assert benchmarks, f"{family}: no BENCHMARKS"
        names = {b.name for b in benchmarks}
        for b in benchmarks:
            assert b.name.startswith(family), b.name
            for case in b.cases:
                assert "N" not in case and {"B", "H"} <= set(case), (b.name, case)
        headline = __import__(f"attention_kernels.{family}.bench", fromlist=["HEADLINE"]).HEADLINE  # declared, maybe None
        assert headline is None or headline.benchmark in names


def _plot_table(providers=("book", "SDPA flash")):
    rows = [dict(name="t", provider=p, T=n, causal=c, ms=ms, tflops=1 / ms, gbps=2 / ms, roofline_ms=0.1,
                 pct_roofline=10 / ms, note="")
            for i, p in enumerate(providers) for ms in [0.5 + 0.1 * i] for n in (1024, 2048) for c in (False, True)]
    df = pd.DataFrame(rows)
    df.attrs["meta"] = GOOD_META
    return df


def test_plot_draws_every_provider_and_roofline(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from attention_kernels.plot import COLUMN_INCHES, plot_results

    fig = plot_results(_plot_table().query("causal"), y="tflops", title="shape")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["book", "SDPA flash", "roofline"]
    roof = [line for line in fig.axes[0].lines if line.get_label() == "roofline"][0]
    assert roof.get_linestyle() == "--"
    assert "NVIDIA H200" in fig._suptitle.get_text() and "shape" in fig._suptitle.get_text()
    assert fig.axes[0].get_xscale() == "log"
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1K", "2K"]
    assert fig.get_size_inches()[0] == COLUMN_INCHES
    assert not matplotlib.rcParams["axes.grid"]  # the house style stays inside the book's figures


def test_plot_stacks_panels_at_the_column_width(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from attention_kernels.plot import COLUMN_PX, plot_results

    fig = plot_results(_plot_table(), y="tflops", col="causal", title="shape")
    boxes = [ax.get_position() for ax in fig.axes]
    assert len(boxes) == 2 and boxes[0].y0 > boxes[1].y1          # one above the other, not side by side
    assert all(b.width > 0.7 for b in boxes)                       # each nearly the full width
    fig.savefig(tmp_path / "f.png")
    assert plt.imread(tmp_path / "f.png").shape[1] == COLUMN_PX
    # readable at the column width: 10-point ticks at the figure's dpi are >= 10 px on the page
    tick = min(t.get_fontsize() for t in fig.axes[-1].get_xticklabels() + fig.axes[0].get_yticklabels())
    assert tick * fig.dpi / 72 * min(1.0, 688 / COLUMN_PX) >= 10


def test_every_provider_has_its_own_colour_and_marker():
    from attention_kernels.plot import BOOK_HUES, provider_style

    every = ["book", "book: Triton", "book: no split", "book: chunk", "book: sequential chunk", "book: TileLang",
             "SDPA flash", "SDPA cuDNN", "eager", "PyTorch absorbed", "PyTorch naive", "fla chunk_gla", "FlashMLA",
             "TileLang", "somebody new"]
    styles = provider_style(every)
    assert len({s.color for s in styles.values()}) == len(every)
    assert len({s.marker for s in styles.values() if s.color in BOOK_HUES}) == 6   # a hue and a marker each
    assert all(styles[p].color in BOOK_HUES for p in every[:6])
    assert all(styles[p].color not in BOOK_HUES for p in every[6:])
    # the chapters' own line-ups: every figure's lines differ in colour and in marker
    for lineup in (["book", "book: Triton", "book: no split", "PyTorch absorbed", "PyTorch naive"],
                   ["book", "book: dense cache", "book: Triton", "book: TileLang", "book: TileLang, no split",
                    "FlashMLA"],
                   ["book", "PyTorch step", "fla fused_recurrent_gla"],
                   ["book: chunk", "book: sequential chunk", "fla chunk_gla", "SDPA flash", "PyTorch step loop"],
                   ["book", "SDPA flash", "SDPA cuDNN", "eager"]):
        s = provider_style(lineup)
        assert len({v.color for v in s.values()}) == len({v.marker for v in s.values()}) == len(lineup), lineup


def test_explorer_degrades_to_static_text():
    import matplotlib
    matplotlib.use("Agg")
    from attention_kernels.notebook import explore

    df = _plot_table(("book",))
    bundle = explore(df, filters=("causal",))._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("Interactive explorer")


def test_online_softmax_explorer_has_a_figure_and_a_table(monkeypatch):
    """Without a kernel, the page shows the explorer's figure (PNG) and its steps as text; its default
    example rescales."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from attention_kernels import notebook

    shown = []
    monkeypatch.setattr(notebook, "display", lambda obj, raw=False: shown.append((obj, raw)))
    explorer = notebook.online_softmax_explorer()
    explorer._ipython_display_()
    (figure, _), (bundle, raw) = shown
    assert isinstance(figure, Figure) and raw
    from IPython.core.pylabtools import print_figure   # what the inline backend stores as image/png
    assert print_figure(figure, "png").startswith(b"\x89PNG")
    assert "application/vnd.jupyter.widget-view+json" in bundle
    text = bundle["text/plain"]
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["block", "scores"] and "α (rescale)" in lines[0]
    assert lines[1].split()[-2] == "—"                     # no rescale in block 0
    assert float(lines[2].split()[-2]) < 1                 # block 1 raised the max: a rescale
    assert "rose in block(s) 1, 2" in text and text.endswith("torch.softmax(x): True")
    assert "nan" not in text.lower()


def test_summary_never_shows_nan():
    t = bench.summary(_table(), index="T", over=["peer", "eager"], roofline=True)
    assert "NaN" not in t.to_string() and "nan" not in t.to_html()
    assert t.to_string().count("—") == 1 and "out of memory" in t.to_string()


IMPORT_WITHOUT_JUPYTER = textwrap.dedent("""
    import importlib.abc, sys

    class NoJupyter(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("IPython", "ipywidgets", "ipykernel", "jupyter_client", "nbformat"):
                raise ImportError(f"{name} is not installed here")

    sys.meta_path.insert(0, NoJupyter())
    import matplotlib
    before = dict(matplotlib.rcParams)
    from triton.runtime import _allocation
    allocator = _allocation._allocator.get()

    import attention_kernels, attention_kernels.flash_attn, attention_kernels.mla, attention_kernels.gla, attention_kernels.bench, attention_kernels.plot
    from attention_kernels import bench
    bench.discover()
    assert dict(matplotlib.rcParams) == before, "importing kernels changed matplotlib's settings"
    assert _allocation._allocator.get() is allocator, "importing kernels installed a Triton allocator"
    print("imported without Jupyter")
""")


def test_the_library_imports_without_jupyter_and_changes_no_global_state():
    done = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT_JUPYTER], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported without Jupyter" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is only switched on without a GPU")
def test_importing_triton_first_on_a_cpu_is_explained():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", "import triton, attention_kernels"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "import attention_kernels first" in done.stderr


def _counted(x):
    """A docstring
    over two lines."""
    # a comment line

    y = x + 1
    return y  # a line with a comment counts


def test_code_lines_leaves_out_blanks_comments_and_docstrings():
    from attention_kernels.mla import decode
    from attention_kernels.notebook import code_lines
    assert code_lines(_counted) == 3
    assert code_lines(_counted, _counted) == 3              # a function named twice counts once
    kernels_of_module = code_lines(decode)      # every kernel the module defines, each once
    assert kernels_of_module == code_lines(decode._mla_decode_kernel, decode._mla_combine_kernel, decode._cache_row)


def test_launch_direct_caches_the_compiled_kernel_and_orders_its_constexprs(monkeypatch):
    """`launch.launch_direct` without a GPU: the kernel and Triton's launcher are played by stand-ins. The first
    aligned call goes through the kernel and keeps its compiled form, with the constexprs in signature order
    (options such as num_warps included where the signature names them); later calls with that key go to it; an
    unaligned call, or one with another key, goes through the kernel again. Each returns its launch (`Launched`),
    to be made again, but an unaligned one, which has no compiled kernel to launch directly."""
    from attention_kernels import launch

    calls = []

    class Kernel:
        arg_names = ["x", "n", "A", "B", "num_warps"]

        def __getitem__(self, grid):
            def run(*args, **kw):
                calls.append(("kernel", grid, args, kw))
                return "compiled"
            return run

    class Direct:
        def __init__(self, compiled, constexprs):
            self.compiled, self.constexprs = compiled, list(constexprs)

        def __call__(self, grid, *args):
            calls.append(("direct", grid, args, self.constexprs))

    monkeypatch.setattr(launch, "_DIRECT", {})
    monkeypatch.setattr(launch, "DirectLaunch", Direct)
    monkeypatch.setattr(launch, "fast_paths_on", lambda: True)  # as on a tested Triton, whichever runs the test
    kernel = Kernel()
    go = lambda key, aligned=True: launch.launch_direct(kernel, (2, 1, 1), key, ("x", 7), {"B": 2, "A": 1},  # noqa
                                                        aligned=aligned, num_warps=4, maxnreg=128)
    first, again, unaligned, other = go("k"), go("k"), go("k", aligned=False), go("other")
    assert [c[0] for c in calls] == ["kernel", "direct", "kernel", "kernel"]
    assert first == again == launch.Launched(launch._DIRECT[(kernel, "k")], (2, 1, 1), ("x", 7))
    assert unaligned is None and other.direct is launch._DIRECT[(kernel, "other")]
    assert calls[0][3] == {"B": 2, "A": 1, "num_warps": 4, "maxnreg": 128}
    assert calls[1] == ("direct", (2, 1, 1), ("x", 7), [1, 2, 4])


def test_launch_keeps_the_tile_that_fits_and_launches_it_directly(monkeypatch):
    """`launch.launch` without a GPU, the kernel and `DirectLaunch` played by stand-ins: the first call with a key
    compiles the tiles in order until one fits (the first reports OutOfResources) and keeps that one's compiled
    kernel, with BM and BN among its constexprs in signature order; the second call with the key launches it
    directly, on that tile's grid, and compiles nothing; an unaligned call goes through the kernel with the kept
    tile, not the one that did not fit; another key tries the tiles from the first again."""
    from triton.runtime.errors import OutOfResources

    from attention_kernels import launch

    calls = []

    class Kernel:
        arg_names = ["x", "n", "BM", "BN", "CAUSAL"]

        def __getitem__(self, grid):
            def run(*args, BM, BN, num_warps, num_stages, **constexprs):
                calls.append(("kernel", BM, grid))
                if BM == 128:
                    raise OutOfResources(300_000, 232_448, "shared memory")
                return ("compiled", BM)
            return run

    class Direct:
        def __init__(self, compiled, constexprs):
            self.compiled, self.constexprs = compiled, list(constexprs)

        def __call__(self, grid, *args):
            calls.append(("direct", self.compiled, grid, args, self.constexprs))

    monkeypatch.setattr(launch, "_CHOSEN", {})
    monkeypatch.setattr(launch, "_DIRECT", {})
    monkeypatch.setattr(launch, "DirectLaunch", Direct)
    monkeypatch.setattr(launch, "fast_paths_on", lambda: True)  # as on a tested Triton, whichever runs the test
    kernel, tiles, x = Kernel(), [(128, 64, 8, 3), (64, 32, 4, 1)], torch.zeros(16)
    go = lambda key, *args: launch.launch(kernel, lambda BM, BN: (1000 // BM, 2), tiles, key, *args, CAUSAL=True)  # noqa
    first = go("k", x, 7)
    assert calls == [("kernel", 128, (7, 2, 1)), ("kernel", 64, (15, 2, 1))]
    again = go("k", x, 7)
    assert calls[2:] == [("direct", ("compiled", 64), (15, 2, 1), (x, 7), [64, 32, True])]
    assert first == again == launch.Launched(launch._DIRECT[(kernel, "k")], (15, 2, 1), (x, 7))
    unaligned = go("k", torch.zeros(17)[1:], 7)
    assert unaligned is None and calls[3:] == [("kernel", 64, (15, 2, 1))]
    go("other", x, 7)
    assert calls[4:] == [("kernel", 128, (7, 2, 1)), ("kernel", 64, (15, 2, 1))]
    assert launch._CHOSEN == {"k": 1, "other": 1}


def test_reused_keeps_one_per_stream_and_key_and_makes_afresh_in_a_capture(monkeypatch):
    """`launch.reused` without a GPU (the stream and the capture state played by stand-ins): one value per
    (stream, key), the least recently used dropped past `most`, and a fresh one inside a graph capture; a stream the
    caller has read (`launch_stream()`) is taken as it is."""
    from attention_kernels import launch

    stream, capturing = [(0, 11)], [False]
    monkeypatch.setattr(launch, "current_stream", lambda: stream[0])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    kept, made = {}, []

    def make():
        made.append(object())
        return made[-1]
    a = launch.reused(kept, "a", make, most=2)
    assert launch.reused(kept, "a", make, most=2) is a and len(made) == 1
    stream[0] = (0, 12)
    assert launch.reused(kept, "a", make, most=2) is not a            # another stream, its own
    launch.reused(kept, "b", make, most=2)                             # the first stream's "a" is dropped
    stream[0] = (0, 11)
    assert launch.reused(kept, "a", make, most=2) is not a and len(kept) == 2
    capturing[0] = True
    assert launch.reused(kept, "a", make, most=2) is made[-1] and len(made) == 5 and len(kept) == 2
    assert launch.reused(kept, "a", make, most=2, stream=(0, 11)) is made[3]   # the stream its caller read


def test_relaunches_keep_what_does_not_change_and_take_each_calls_tensors():
    """`launch.relaunches` without a GPU (the compiled kernels played by stand-ins): each launch is made again on
    the stream it is handed, with its grid and its other arguments, and each tensor argument replaced by the later
    call's tensor in the same place (the first place, for a tensor given twice); no tensor of the first call is kept
    alive. None where one launch went through Triton's dispatcher, is instrumented, or read a tensor of its own."""
    import gc
    import weakref

    from attention_kernels import launch

    class Direct:
        instrumented = False

        def __init__(self):
            self.seen = []

        def on(self, stream, grid, args):
            self.seen.append((stream, grid, args))

    a, b, c, own = torch.zeros(1), torch.zeros(2), torch.zeros(3), torch.zeros(4)
    d1, d2 = Direct(), Direct()
    first = [launch.Launched(d1, (2, 1, 1), (a, b, 0.5, None, 7)), launch.Launched(d2, (4, 1, 1), (c, b, 3))]
    tensors = (a, None, b, c, b)
    again = launch.relaunches(first, tensors)
    x, y, z = torch.ones(1), torch.ones(2), torch.ones(3)
    for relaunch in again:
        relaunch((0, 9), (x, None, y, z, torch.ones(5)))
    (stream, grid, args), = d1.seen
    assert stream == (0, 9) and grid == (2, 1, 1) and args[0] is x and args[1] is y and args[2:] == [0.5, None, 7]
    (stream, grid, args), = d2.seen
    assert grid == (4, 1, 1) and args[0] is z and args[1] is y and args[2] == 3
    gone = weakref.ref(a)
    del a, first, tensors
    gc.collect()
    assert gone() is None, "a relaunch keeps a tensor of the first call alive"
    assert launch.relaunches([launch.Launched(d1, (1, 1, 1), (b,)), None], (b,)) is None
    assert launch.relaunches([launch.Launched(d1, (1, 1, 1), (b, own))], (b,)) is None
    d2.instrumented = True
    assert launch.relaunches([launch.Launched(d2, (1, 1, 1), (b,))], (b,)) is None


def test_direct_launch_gives_the_c_launcher_three_grid_dims(monkeypatch):
    """A launch with a one- or two-dimensional grid reaches Triton's C launcher as (x, y, 1) and sizes a kernel's
    TMA scratch by the CTAs it launches (a kernel launched on a 2-D grid once failed here on the GPU)."""
    from attention_kernels import launch as launch_module
    calls, made = [], []
    direct = object.__new__(launch_module.DirectLaunch)
    direct._launch = lambda *a: calls.append(a)
    direct._head, direct._metadata, direct._constexprs = ("fn", False, False), "meta", ()
    direct._scratch_bytes, direct._scratch = 384, {}
    monkeypatch.setattr(launch_module, "reused", lambda kept, size, make, stream=None: made.append(size))
    direct.on((None, 7), (5, 3), ("a", "b"))
    direct.on((None, 7), (4,), ("a", "b"))
    assert [c[:4] for c in calls] == [(5, 3, 1, 7), (4, 1, 1, 7)]
    assert made == [5 * 3 * 384, 4 * 384]
