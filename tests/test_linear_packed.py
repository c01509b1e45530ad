"""Packed sequences (cu_seqlens) through GLA, Lightning and KDA, chunk and fused recurrent forms: a packed call
equals each sequence run alone (outputs, final states, and for the chunk forms every gradient), including
empty sequences, one-token ones and ones that straddle a chunk boundary of the packed row; bad offsets are
refused by name before any launch; an infinite v stays in its sequence."""
import math

import pytest
import torch

from attention_kernels.gla import chunk_gla, fused_recurrent_gla
from attention_kernels.kda import chunk_kda, fused_recurrent_kda
from attention_kernels.lightning import chunk_lightning, fused_recurrent_lightning, lightning_slopes

H, K, V = 2, 16, 32
LENGTHS = [0, 5, 70, 1, 64, 0]          # 140 tokens: sequences start mid-chunk, one is empty at either end
SLOPES = lightning_slopes(H)


def _forms():
    """name -> (call(rows, **kw), how many row tensors, trains)."""
    return {
        "chunk_gla": (lambda r, **kw: chunk_gla(*r, **kw), 4, True),
        "fused_recurrent_gla": (lambda r, **kw: fused_recurrent_gla(*r, **kw), 4, False),
        "chunk_lightning": (lambda r, **kw: chunk_lightning(*r[:3], SLOPES.to(r[0].device), **kw), 3, True),
        "fused_recurrent_lightning": (lambda r, **kw: fused_recurrent_lightning(*r[:3], SLOPES.to(r[0].device),
                                                                                   **kw), 3, False),
        "chunk_kda": (lambda r, **kw: chunk_kda(*r, use_qk_l2norm_in_kernel=True, **kw), 5, True),
        "fused_recurrent_kda": (lambda r, **kw: fused_recurrent_kda(*r, use_qk_l2norm_in_kernel=True, **kw), 5, False),
    }


FORMS = _forms()


def _inputs(lengths, dtype=torch.float32):
    T = sum(lengths)
    q, k = torch.randn(2, 1, T, H, K, dtype=dtype)
    v = torch.randn(1, T, H, V, dtype=dtype)
    g = -torch.rand(1, T, H, K) * 0.2
    beta = torch.rand(1, T, H)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    h0 = torch.randn(len(lengths), H, K, V)
    return [q, k, v, g, beta], cu, h0


@pytest.mark.parametrize("form", FORMS)
def test_packed_equals_each_sequence_alone(form):
    call, n_rows, trains = FORMS[form]
    rows, cu, h0 = _inputs(LENGTHS)
    rows = rows[:n_rows]
    leaves = [t.clone().requires_grad_(trains) for t in rows]
    h0_leaf = h0.clone().requires_grad_(trains)
    o, ht = call(leaves, initial_state=h0_leaf, output_final_state=True, cu_seqlens=cu)
    assert o.shape == rows[2].shape and ht.shape == h0.shape
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    offsets = cu.tolist()
    for n, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
        if s == e:                          # an empty sequence: its final state is its initial one
            assert torch.equal(ht[n], h0[n])
            continue
        o_n, ht_n = call([t[:, s:e] for t in rows], initial_state=h0[n:n + 1], output_final_state=True)
        assert torch.equal(o[:, s:e].detach(), o_n) and torch.equal(ht[n].detach(), ht_n[0])
    if not trains:
        return
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves + [h0_leaf])
    for n, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
        if s == e:
            assert torch.equal(grads[-1][n], dht[n])
            continue
        alone = [t[:, s:e].clone().requires_grad_() for t in rows]
        h0_n = h0[n:n + 1].clone().requires_grad_()
        o_n, ht_n = call(alone, initial_state=h0_n, output_final_state=True)
        expected = torch.autograd.grad((o_n * do[:, s:e]).sum() + (ht_n * dht[n:n + 1]).sum(), alone + [h0_n])
        for g, g_n in zip(grads[:-1], expected[:-1]):
            torch.testing.assert_close(g[:, s:e], g_n, rtol=0, atol=0)
        torch.testing.assert_close(grads[-1][n], expected[-1][0], rtol=0, atol=0)
        assert all(torch.isfinite(g).all() for g in expected)


@pytest.mark.parametrize("form", ["chunk_gla", "chunk_lightning", "chunk_kda"])
def test_chunk_forms_run_packed_sequences_in_one_set_of_launches(form, monkeypatch):
    # the chunk forms' kernels, forward and backward, read the chunk table (packed_chunks) themselves: no
    # launch per sequence on the host, and the chunk table has each sequence's chunks from its first token
    from attention_kernels.linear import packed
    monkeypatch.setattr(packed, "_rows", lambda *a: pytest.fail("a sequence's rows were cut out"))
    call, n_rows, _ = FORMS[form]
    rows, cu, h0 = _inputs(LENGTHS)
    leaves = [t.requires_grad_() for t in rows[:n_rows]]
    o, ht = call(leaves, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert o.isfinite().all() and ht.shape == h0.shape
    assert all(g.isfinite().all() for g in torch.autograd.grad(o.sum() + ht.sum(), leaves))
    table = packed.packed_chunks(cu, sum(LENGTHS))
    assert table.chunk_indices.tolist() == [[1, 0], [2, 0], [2, 1], [3, 0], [4, 0]]
    assert table.chunk_offsets.tolist() == [0, 0, 1, 3, 4, 5, 5] and table.n_chunks == 5


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, computing with inf as asked
@pytest.mark.parametrize("form", FORMS)
def test_an_infinite_v_stays_in_its_sequence(form):
    """+inf in every channel of v at one token of a packed sequence (70 tokens from row 5, the inf at its token
    65, one past the start of its second chunk): every other sequence's outputs and final state are, bit for
    bit, those of the clean call, and finite; the poisoned sequence's rows before the inf too. From the inf on
    its rows are not finite: ±inf from the recurrent forms, NaN from the chunk forms (whose products cannot tell
    the signs apart), and neither reaches an earlier token or another sequence."""
    call, n_rows, _ = FORMS[form]
    rows, cu, h0 = _inputs(LENGTHS)
    rows = rows[:n_rows]
    clean_o, clean_ht = call(rows, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    start, poisoned_n = 5, 2                        # LENGTHS' sequence 2 holds rows 5..74
    token = start + 65
    rows[2] = rows[2].clone()
    rows[2][:, token] = math.inf
    o, ht = call(rows, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(o[:, :token], clean_o[:, :token]) and torch.isfinite(o[:, :token]).all()
    assert not torch.isfinite(o[:, token:start + 70]).any(), "the rows at and after the inf"
    assert torch.equal(o[:, start + 70:], clean_o[:, start + 70:]) and torch.isfinite(o[:, start + 70:]).all()
    others = [n for n in range(len(LENGTHS)) if n != poisoned_n]
    assert torch.equal(ht[others], clean_ht[others]) and torch.isfinite(ht[others]).all()
    assert not torch.isfinite(ht[poisoned_n]).all()


@pytest.mark.parametrize("form", ["chunk_gla", "fused_recurrent_kda"])
def test_packed_without_states(form):
    call, n_rows, _ = FORMS[form]
    rows, cu, _ = _inputs([3, 65])
    o, ht = call(rows[:n_rows], cu_seqlens=cu)
    assert ht is None
    o_1, _ = call([t[:, 3:] for t in rows[:n_rows]])
    assert torch.equal(o[:, 3:], o_1)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("offsets, T, message", [
    ([1, 5, 10], 10, "cu_seqlens must start at 0"),
    ([0, 5, 9], 10, "cu_seqlens must end at the packed length 10"),
    ([0, 6, 5, 10], 10, "cu_seqlens must be non-decreasing"),
])
def test_bad_offsets_refused(form, offsets, T, message):
    call, n_rows, _ = FORMS[form]
    rows, _, _ = _inputs([T])
    with pytest.raises(ValueError, match=message):
        call(rows[:n_rows], cu_seqlens=torch.tensor(offsets, dtype=torch.int32))


@pytest.mark.parametrize("form", FORMS)
def test_bad_layout_refused(form):
    call, n_rows, _ = FORMS[form]
    rows, cu, h0 = _inputs([4, 6])
    with pytest.raises(TypeError, match="cu_seqlens"):
        call(rows[:n_rows], cu_seqlens=cu.long())
    with pytest.raises(ValueError, match="batch 1"):
        call([torch.cat([t, t]) for t in rows[:n_rows]], cu_seqlens=cu)
    with pytest.raises(ValueError, match="initial_state"):
        call(rows[:n_rows], initial_state=h0[:1], cu_seqlens=cu)   # one state, two sequences


def test_packed_with_fla_state_layout():
    # fla's layers keep the state as [N, H, V, K] (state_v_first=True) and pass cu_seqlens: the same call
    rows, cu, h0 = _inputs([5, 70])
    o, ht = chunk_gla(*rows[:4], initial_state=h0, output_final_state=True, cu_seqlens=cu)
    o_t, ht_t = chunk_gla(*rows[:4], initial_state=h0.transpose(-1, -2), output_final_state=True,
                          state_v_first=True, cu_seqlens=cu)
    assert torch.equal(o, o_t) and torch.equal(ht, ht_t.transpose(-1, -2))


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["chunk_gla", "chunk_lightning", "chunk_kda"])
def test_packed_chunk_forms_gpu(form):
    # the compiled packed kernels (chunk table, one state pass program per sequence and head, forward and
    # backward) against each sequence run alone, bf16 at K = V = 128 on a long-tailed mix of lengths (two of
    # them empty, most starting mid-chunk): outputs, final states and every gradient
    from attention_kernels.common import assert_close, tolerance
    call, n_rows, _ = FORMS[form]
    lengths = [0, 1, 63, 64, 65, 700, 2, 0, 1500, 129]
    T, D = sum(lengths), 128
    q, k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = (-torch.rand(1, T, H, D, device="cuda") * 0.2).to(torch.bfloat16)
    beta = torch.rand(1, T, H, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    h0 = torch.randn(len(lengths), H, D, D, device="cuda")
    rows = [t.requires_grad_() for t in [q, k, v, g, beta][:n_rows]]
    h0.requires_grad_()
    o, ht = call(rows, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), rows + [h0])
    bound = tolerance(torch.bfloat16)
    offsets = cu.tolist()
    for n, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
        if s == e:
            assert torch.equal(ht[n], h0[n]) and torch.equal(grads[-1][n], dht[n])
            continue
        alone = [t[:, s:e].detach().requires_grad_() for t in rows]
        h0_n = h0[n:n + 1].detach().requires_grad_()
        o_n, ht_n = call(alone, initial_state=h0_n, output_final_state=True)
        assert_close(o[:, s:e], o_n, bound, f"o of sequence {n}")
        assert_close(ht[n], ht_n[0], bound, f"final state of sequence {n}")
        expected = torch.autograd.grad((o_n.float() * do[:, s:e]).sum() + (ht_n * dht[n:n + 1]).sum(), alone + [h0_n])
        for name, grad, grad_n in zip("q k v g beta".split()[:n_rows], grads, expected):
            assert_close(grad[:, s:e], grad_n, bound, f"d{name} of sequence {n}")
        assert_close(grads[-1][n], expected[-1][0], bound, f"dh0 of sequence {n}")


def test_packed_kda_backward_in_key_halves(monkeypatch):
    # the delta rule's reverse state pass in key halves (launched at 64 < K <= 128 on a GPU with the shared
    # memory) walks each packed sequence from its own last chunk: gradients bit-equal to each sequence alone,
    # K 80 (the second half partly padding), an empty sequence at either end
    from attention_kernels.linear import chunk_backward
    monkeypatch.setattr(chunk_backward, "_DELTA_HALVES", True)
    lengths, Kh = [0, 5, 70, 0], 80
    T = sum(lengths)
    q, k, g = torch.randn(1, T, H, Kh), torch.randn(1, T, H, Kh), -torch.rand(1, T, H, Kh) * 0.2
    v, beta = torch.randn(1, T, H, V), torch.rand(1, T, H)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    h0, dht = torch.randn(len(lengths), H, Kh, V), torch.randn(len(lengths), H, Kh, V)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, ht = chunk_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                      cu_seqlens=cu)
    do = torch.randn_like(o)
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)
    offsets = cu.tolist()
    for n, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
        if s == e:
            assert torch.equal(grads[-1][n], dht[n])
            continue
        alone = [t[:, s:e].clone().requires_grad_() for t in (q, k, v, g, beta)] + [h0[n:n + 1].clone().requires_grad_()]
        o_n, ht_n = chunk_kda(*alone[:5], initial_state=alone[5], output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
        expected = torch.autograd.grad((o_n * do[:, s:e]).sum() + (ht_n * dht[n:n + 1]).sum(), alone)
        for grad, grad_n in zip(grads[:-1], expected[:-1]):
            assert torch.equal(grad[:, s:e], grad_n)
        assert torch.equal(grads[-1][n], expected[-1][0])
