"""The Tritons the fast paths were measured on (`attention_kernels.launch.TESTED_TRITON`), and what any other Triton gets:
the plain `kernel[grid](...)` launch every time, and one warning a process. The version is played by
monkeypatching `triton.__version__`; the kernels and Triton's launcher by stand-ins, except where a test says."""
import warnings

import pytest
import torch
import triton

from attention_kernels import launch
from attention_kernels.common import DEVICE, INTERPRET, assert_close


@pytest.fixture
def version(monkeypatch):
    """Sets the Triton version the package sees; the process counts as not yet warned."""
    monkeypatch.setattr(launch, "_untested_warned", False)
    return lambda v: monkeypatch.setattr(triton, "__version__", v)


@pytest.mark.parametrize("found, tested", [("3.6.0", True), ("3.6.1", True), ("3.6.0+git1a2b3c4", True),
                                           ("3.5.1", False), ("3.9.0", False), ("3.60.0", False)])
def test_the_release_is_what_counts(found, tested, version):
    version(found)
    assert launch.triton_tested() is tested


def test_an_untested_triton_is_warned_about_once_in_one_line(version):
    version("3.9.0")
    with pytest.warns(UserWarning) as caught:
        assert not launch.fast_paths_on()
    (warning,) = caught
    message = str(warning.message)
    assert "\n" not in message and "Triton 3.9.0" in message and "(3.6)" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not launch.fast_paths_on()
    version("3.6.0")
    assert launch.fast_paths_on()


class _Kernel:
    """A JIT function's stand-in: `kernel[grid](...)` records a launch through the dispatcher and returns a compiled
    kernel's stand-in; `direct` stands in for `DirectLaunch`, whose launches of it are recorded as direct."""
    arg_names = ["x", "n", "BM", "BN"]

    def __init__(self):
        self.calls = []
        self.compiled = object()
        kernel = self

        class Direct:
            def __init__(self, compiled, constexprs):
                assert compiled is kernel.compiled

            def __call__(self, grid, *args):
                kernel.calls.append("direct")
        self.direct = Direct

    def __getitem__(self, grid):
        def run(*args, **constexprs):
            self.calls.append("dispatcher")
            return self.compiled
        return run


@pytest.mark.parametrize("found, path", [("3.6.0", ["dispatcher", "direct", "direct"]),
                                         ("3.9.0", ["dispatcher", "dispatcher", "dispatcher"])])
def test_launch_goes_direct_on_a_tested_triton_only(found, path, version, monkeypatch):
    monkeypatch.setattr(launch, "_CHOSEN", {})
    monkeypatch.setattr(launch, "_DIRECT", {})
    monkeypatch.setattr(launch, "_untested_warned", True)   # (warned about in its own test)
    version(found)
    kernel, x = _Kernel(), torch.zeros(16)
    monkeypatch.setattr(launch, "DirectLaunch", kernel.direct)
    for _ in range(3):
        launch.launch(kernel, lambda BM, BN: (1,), [(16, 16, 4, 1)], ("gate", found), x, 16)
    assert kernel.calls == path


def test_launch_direct_keeps_nothing_on_an_untested_triton(version, monkeypatch):
    monkeypatch.setattr(launch, "_DIRECT", {})
    monkeypatch.setattr(launch, "_untested_warned", True)
    version("3.9.0")
    kernel = _Kernel()
    made = [launch.launch_direct(kernel, (1, 1, 1), "gate", (torch.zeros(16), 16), {"BM": 16, "BN": 16})
            for _ in range(2)]
    assert made == [None, None] and kernel.calls == ["dispatcher", "dispatcher"] and launch._DIRECT == {}


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's behaviour")
def test_the_interpreter_neither_warns_nor_launches_directly(version, monkeypatch):
    """Under the interpreter nothing is compiled, so no launch is direct on any Triton, and none asks the version:
    an untested Triton runs the chapters without a warning. Real kernels: `launch` (FlashAttention) and
    `launch_direct` (MLA decode's split-KV merge)."""
    from attention_kernels.flash_attn import flash_attn_func
    from attention_kernels.mla import mla_decode

    monkeypatch.setattr(launch, "_CHOSEN", {})
    monkeypatch.setattr(launch, "_DIRECT", {})
    version("3.9.0")
    q, k, v = (torch.randn(1, 40, 2, 32) for _ in range(3))
    mq, kv = torch.randn(2, 1, 2, 40), torch.randn(2, 50, 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flash_attn_func(q, k, v, causal=True)
        mla_decode(mq, kv, None, torch.tensor([50, 7], dtype=torch.int32), 32, 0.2, num_splits=2)
    assert not [w for w in caught if "Triton 3.9.0" in str(w.message)]
    assert launch._CHOSEN and launch._DIRECT == {}


@pytest.mark.gpu
def test_gpu_an_untested_triton_launches_through_the_dispatcher(version, monkeypatch):
    """On a GPU, a Triton other than the tested ones gets the same answers through Triton's own launch path: no
    compiled kernel is kept for a direct launch, and a planned MLA call keeps no launches to make again."""
    from attention_kernels.flash_attn import flash_attn_func
    from attention_kernels.mla import mla_decode, planning

    monkeypatch.setattr(launch, "_CHOSEN", {})
    monkeypatch.setattr(launch, "_DIRECT", {})
    monkeypatch.setattr(planning, "_PLANS", {})
    q, k, v = (torch.randn(2, 300, 4, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    mq = torch.randn(4, 1, 64, 576, device=DEVICE, dtype=torch.bfloat16)
    kv = torch.randn(4, 1000, 576, device=DEVICE, dtype=torch.bfloat16)
    lens = torch.tensor([1000, 3, 517, 64], device=DEVICE, dtype=torch.int32)
    tested = [flash_attn_func(q, k, v, causal=True), mla_decode(mq, kv, None, lens, 512, 0.1, check_seqlens=False)]
    monkeypatch.setattr(launch, "_CHOSEN", {})
    monkeypatch.setattr(launch, "_DIRECT", {})
    monkeypatch.setattr(planning, "_PLANS", {})
    version("3.9.0")
    with pytest.warns(UserWarning, match="Triton 3.9.0"):
        untested = [flash_attn_func(q, k, v, causal=True)]
    for _ in range(2):   # the second call through the plan the first made
        untested.append(mla_decode(mq, kv, None, lens, 512, 0.1, check_seqlens=False))
    assert launch._DIRECT == {}
    (plan,) = planning._PLANS.values()
    assert not plan.gluon and plan.relaunches is None
    assert_close(untested[0], tested[0], tol=2e-2)
    for out, lse in untested[1:]:
        assert_close(out, tested[1][0], tol=2e-2)
        assert_close(lse, tested[1][1], tol=2e-2)
