"""The shared helpers: the comparison that every test relies on, and the results loader."""
import json

import pandas as pd
import pytest
import torch

from kernels import bench
from kernels.common import assert_close, check_tensor, pick, rel_err


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
    with pytest.raises(FileNotFoundError, match="refresh_gpu.sh"):
        bench.load("nothing")


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


def test_run_or_load_never_times_on_a_cpu(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("on a GPU run_or_load times for real")
    _write(tmp_path, monkeypatch, HEADER + "t,book,1024,0.5,100,10,0.25,50,\n")

    def provider_that_must_not_run(case):
        raise AssertionError("timed on a CPU")

    df = bench.run_or_load("t", [{"N": 1024}], {"book": provider_that_must_not_run}, flops=lambda c: 1, bytes=lambda c: 1)
    assert df["ms"].iloc[0] == 0.5


FAKE_BENCHMARK = """
import os
import sys

from kernels.bench import in_fresh_process


@in_fresh_process
def bench(x, y=1):
    if os.environ.get("KERNELS_FRESH_PROCESS"):  # the fresh process: "time", save, say so
        if x < 0:
            raise SystemExit("negative x")
        open(os.environ["MARKER"], "w").write(f"{x},{y}")
        sys.stderr.write("progress 100%\\n")
        return None
    return "loaded" if os.environ.get("KERNELS_BENCH") == "load" else "timed here"
"""


def test_in_fresh_process_times_in_a_child_then_loads(tmp_path, monkeypatch, capsys):
    (tmp_path / "fakebench.py").write_text(FAKE_BENCHMARK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("MARKER", str(tmp_path / "marker"))
    monkeypatch.delenv("KERNELS_BENCH", raising=False)
    import fakebench
    assert fakebench.bench(3, y=5) == "timed here"  # no GPU, no Jupyter kernel: runs in place
    assert not (tmp_path / "marker").exists()
    monkeypatch.setattr(bench, "will_time", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "ipykernel", object())
    assert fakebench.bench(3, y=5) == "loaded"  # timed in the child, loaded here
    assert (tmp_path / "marker").read_text() == "3,5"
    assert "progress 100%" in capsys.readouterr().err  # the child's progress is passed through
    assert "KERNELS_BENCH" not in __import__("os").environ
    with pytest.raises(RuntimeError, match="(?s)failed in its own process.*negative x"):
        fakebench.bench(-1)


def test_plot_draws_every_provider_and_roofline(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    from kernels.plot import plot_results

    rows = [dict(name="t", provider=p, N=n, ms=ms, tflops=1 / ms, gbps=2 / ms, roofline_ms=0.1, pct_roofline=10 / ms,
                 note="") for p, ms in (("book", 0.5), ("SDPA flash", 1.0)) for n in (1024, 2048)]
    df = pd.DataFrame(rows)
    df.attrs["meta"] = GOOD_META
    fig = plot_results(df, y="tflops", title="shape")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["book", "SDPA flash", "roofline"]
    assert "NVIDIA H200" in fig._suptitle.get_text()


def test_explorer_degrades_to_static_text():
    import matplotlib
    matplotlib.use("Agg")
    from kernels.plot import explore

    rows = [dict(name="t", provider="book", N=n, causal=c, ms=1.0, tflops=1.0, gbps=1.0, roofline_ms=0.5,
                 pct_roofline=50.0, note="") for n in (1024, 2048) for c in (False, True)]
    df = pd.DataFrame(rows)
    df.attrs["meta"] = GOOD_META
    bundle = explore(df, filters=("causal",))._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("Interactive explorer")
