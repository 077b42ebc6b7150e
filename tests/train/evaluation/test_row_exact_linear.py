"""Row-exact linears (issue 37): the probe finds which calls of a kernel give a row the one-row bits,
the shaped forward makes every row of every verify block equal the one-row call, and
``HFTargetSession.make_rows_exact`` makes greedy speculative decoding equal plain decoding, falling
back to row-by-row verification where a non-linear module is not row-invariant.

The kernels here are fakes whose result for a row depends on the block's row count ``M`` the way
real ones do (another code path for ``M = 1``, or from some ``M`` on): each row is computed by the
same fixed call (``torch.mv``), so any difference between ``M`` values is exactly the one the fake
adds. The tests thus fail without the shaping on any machine, whatever its own kernels do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from osprey_data.errors import ModelError
from osprey_data.target_model import resolve_precision
from osprey_train.evaluation.row_exact_linear import LinearPlan, linear_plans, probe_linear, use_row_exact_linears
from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate, speculative_generate
from osprey_train.evaluation.live_report import first_divergence
from tests.train.evaluation.test_lossless_real_model import OracleWithErrors, RowLogits

TAPS = (2, 3, 6)


class FakeKernel:
    """``x @ W.T + b`` computed row by row with one fixed call, then changed by the code path
    ``path(M)`` a block of ``M`` rows takes: path 0 is the base kernel; path ``p > 0`` adds ``shift``
    (a tensor added to every row) or, without one, moves the result ``p`` ulps up (``nextafter``),
    so that different paths give different bits. ``sum_order``: paths ``p > 0`` sum in float64 and
    round instead (another summation order and no shift: what only inputs whose sums round expose)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, path: Callable[[int], int],
                 shift: torch.Tensor | None = None, sum_order: bool = False) -> None:
        self.weight, self.bias, self.path, self.shift, self.sum_order = weight, bias, path, shift, sum_order
        self.calls: list[int] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x_MD = x.reshape(-1, x.shape[-1])
        m = x_MD.shape[0]
        self.calls.append(m)
        path = int(self.path(m))
        if path and self.sum_order:
            out_MO = torch.stack([torch.mv(self.weight.double(), r.double()) for r in x_MD]).to(x.dtype)
        else:
            out_MO = torch.stack([torch.mv(self.weight, r) for r in x_MD])
        if self.bias is not None:
            out_MO = out_MO + self.bias
        if path and not self.sum_order:
            if self.shift is not None:
                out_MO = out_MO + self.shift
            else:
                for _ in range(path):
                    out_MO = torch.nextafter(out_MO, torch.full_like(out_MO, math.inf))
        return out_MO.reshape(*x.shape[:-1], out_MO.shape[-1])


def _fake(module: torch.nn.Linear, path: Callable[[int], int], **kw) -> FakeKernel:
    """Give ``module`` a fake kernel (as its forward, like prepacking does) and return it."""
    fake = FakeKernel(module.weight.detach(), None if module.bias is None else module.bias.detach(), path, **kw)
    module.forward = fake
    return fake


def _spread_rows(rows: int, features: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Rows of magnitudes spread over 2^-10..2^10 (other values than the probe's own)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-10, 11, (rows, features), generator=g).float())
    return (torch.randn(1, rows, features, generator=g) * scale).to(dtype)


def _rows_match_one_row_calls(forward: Callable, x_1TD: torch.Tensor, max_rows: int) -> list[int]:
    """Block lengths 1..max_rows whose every row equals ``forward`` of that row alone (bit for bit)."""
    with torch.no_grad():
        alone = [forward(x_1TD[:, r: r + 1]) for r in range(max_rows)]
        return [m for m in range(1, max_rows + 1)
                if all(torch.equal(forward(x_1TD[:, :m])[:, r: r + 1], alone[r]) for r in range(m))]


def _one_row_and_from_4(m: int) -> int:
    """A kernel with a path of its own for one row and another from blocks of 4 rows on."""
    return 1 if m == 1 else 2 if m >= 4 else 0


# --- LinearPlan -------------------------------------------------------------------------------


def test_chunks_cut_blocks_into_exact_sizes_and_single_rows():
    plan = LinearPlan(reference_rows=2, exact_sizes=(2, 3), max_rows=6, threads=1)
    assert [plan.chunks(m) for m in range(1, 8)] == [[1], [2], [3], [3, 1], [3, 2], [3, 3], [7]]
    assert LinearPlan(1, (), 4, 1).chunks(4) == [1, 1, 1, 1]
    assert LinearPlan(1, tuple(range(2, 16)), 17, 1).chunks(16) == [15, 1]
    assert LinearPlan(1, tuple(range(2, 16)), 17, 1).chunks(17) == [15, 2]
    assert LinearPlan(1, (2,), 4, 1).chunks(40) == [40]  # a prefill runs as it comes
    for sizes in [(), (2,), (3,), (2, 5), (4, 6, 7), (2, 3, 4, 5, 6, 7, 8)]:
        plan = LinearPlan(2, sizes, 8, 1)
        for m in range(1, 9):
            parts = plan.chunks(m)
            assert sum(parts) == m and all(p == 1 or p in sizes for p in parts), (sizes, m, parts)


def test_native_and_describe():
    assert LinearPlan(1, (2, 3, 4), 4, 1).native
    assert LinearPlan(1, (2, 3, 4), 4, 1).describe() == "native (every block of 1..4 rows exact)"
    assert LinearPlan(1, (), 1, 1).native  # one-row blocks only: nothing to shape
    padded = LinearPlan(2, (2, 3, 4), 4, 1)
    assert not padded.native
    assert padded.describe() == "one-row calls padded to 2 rows; every block of 2..4 rows exact"
    gaps = LinearPlan(1, (2, 4, 6), 8, 1)
    assert not gaps.native
    assert gaps.describe() == "one-row calls as they come; blocks of 3,5,7-8 rows cut into exact sizes"
    assert LinearPlan(2, (), 3, 1).describe() == "one-row calls padded to 2 rows; blocks of 2-3 rows cut into exact sizes"


# --- probe_linear -----------------------------------------------------------------------------


def _linear(din=48, dout=40, bias=True, seed=0, dtype=torch.float32) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(din, dout, bias=bias).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_probe_finds_padding_and_the_next_kernel_switch(dtype):
    """M = 1 another kernel, and another again from M = 4 on: one-row calls are padded to 2 rows,
    and only blocks of 2 and 3 rows are exact."""
    lin = _linear(dtype=dtype)
    _fake(lin, _one_row_and_from_4)
    plan = probe_linear(lin.forward, lin.in_features, dtype, torch.device("cpu"), max_rows=6)
    assert (plan.reference_rows, plan.exact_sizes, plan.max_rows, plan.threads) == (2, (2, 3), 6, 1)
    assert not plan.native


def test_probe_keeps_one_row_calls_when_only_large_blocks_switch():
    """Like MKL float32 at M = 16: one-row calls agree with blocks up to 15 rows."""
    lin = _linear()
    _fake(lin, lambda m: int(m >= 16))
    plan = probe_linear(lin.forward, lin.in_features, torch.float32, torch.device("cpu"), max_rows=17)
    assert (plan.reference_rows, plan.exact_sizes) == (1, tuple(range(2, 16)))
    assert plan.describe() == "one-row calls as they come; blocks of 16-17 rows cut into exact sizes"


def test_probe_takes_the_reference_more_block_sizes_agree_with():
    """One row takes the same path as blocks of 4+ rows: the one-row call is the reference (3 sizes
    agree with it, 2 with the padded call), and blocks of 2-3 rows go one row at a time."""
    lin = _linear()
    _fake(lin, lambda m: int(m == 1 or m >= 4))
    plan = probe_linear(lin.forward, lin.in_features, torch.float32, torch.device("cpu"), max_rows=6)
    assert (plan.reference_rows, plan.exact_sizes) == (1, (4, 5, 6))
    assert [plan.chunks(m) for m in (2, 3, 4, 6)] == [[1, 1], [1, 1, 1], [4], [6]]


def test_probe_of_a_row_invariant_kernel_is_native():
    lin = _linear()
    _fake(lin, lambda m: 0)
    plan = probe_linear(lin.forward, lin.in_features, torch.float32, torch.device("cpu"), max_rows=6)
    assert plan.native and (plan.reference_rows, plan.exact_sizes) == (1, (2, 3, 4, 5, 6))


def test_probe_sees_a_change_of_summation_order_alone():
    """No shift, only another order of the sum for M = 1 (float64, then rounded): the probe's spread
    magnitudes make the sums round, so the order shows."""
    lin = _linear(din=256)
    _fake(lin, lambda m: int(m == 1), sum_order=True)
    plan = probe_linear(lin.forward, lin.in_features, torch.float32, torch.device("cpu"), max_rows=5)
    assert (plan.reference_rows, plan.exact_sizes) == (2, (2, 3, 4, 5))


# --- use_row_exact_linears --------------------------------------------------------------------


def _two_linears(dtype=torch.float32) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.Linear(40, 24, bias=False)).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shaped_linears_give_every_row_of_every_block_the_one_row_bits(dtype):
    model = _two_linears(dtype)
    _fake(model[0], _one_row_and_from_4)  # padded reference, blocks of 4+ cut
    _fake(model[1], lambda m: int(m >= 3))  # one-row reference, blocks of 3+ cut
    x = _spread_rows(7, 48, seed=3, dtype=dtype)
    # the fakes do what they say: without shaping, rows differ with the block length
    assert _rows_match_one_row_calls(model[0], x, 7) == [1]
    assert _rows_match_one_row_calls(model[1], x[..., :40], 7) == [1, 2]
    assert _rows_match_one_row_calls(model, x, 7) == [1]
    plans = use_row_exact_linears(model, max_rows=7)
    name = str(dtype).removeprefix("torch.")
    assert plans == {f"F.linear {name} cpu 48->40 +bias": LinearPlan(2, (2, 3), 7, 1),
                     f"F.linear {name} cpu 40->24": LinearPlan(1, (2,), 7, 1)}
    assert linear_plans(model) == [plans[f"F.linear {name} cpu 48->40 +bias"], plans[f"F.linear {name} cpu 40->24"]]
    with torch.no_grad():
        hidden = model[0](x)
    for forward, rows in ((model[0], x), (model[1], hidden), (model, x)):
        assert _rows_match_one_row_calls(forward, rows, 7) == list(range(1, 8))
    # the kernels were called only in the sizes the plans allow
    model[0]._osprey_row_inner.calls.clear()
    with torch.no_grad():
        model[0](x[:, :6])
        model[0](x[:, :1])
    assert model[0]._osprey_row_inner.calls == [3, 3, 2]


def test_calls_that_are_not_decode_shaped_run_unchanged():
    model = _two_linears()
    fake = _fake(model[0], _one_row_and_from_4)
    use_row_exact_linears(model, max_rows=4)
    with torch.no_grad():
        for x in (_spread_rows(9, 48, seed=1),               # a prefill: longer than max_rows
                  _spread_rows(6, 48, seed=2).reshape(2, 3, 48),  # a batch of two sequences
                  _spread_rows(1, 48, seed=3)[0, 0]):        # a vector (no row dimension)
            fake.calls.clear()
            assert torch.equal(model[0](x), fake(x))
            assert fake.calls == [x.numel() // 48, x.numel() // 48]


def test_row_invariant_kernels_are_left_alone():
    model = _two_linears()
    fakes = [_fake(model[0], lambda m: 0), _fake(model[1], lambda m: 0)]
    plans = use_row_exact_linears(model, max_rows=5)
    assert all(p.native for p in plans.values()) and linear_plans(model) == []
    assert [model[0].forward, model[1].forward] == fakes


def test_plans_are_kept_for_smaller_blocks_and_reprobed_for_larger_ones_or_other_threads():
    model = _two_linears()
    fake = _fake(model[0], _one_row_and_from_4)
    key = "F.linear float32 cpu 48->40 +bias"
    plan = use_row_exact_linears(model, max_rows=4)[key]
    assert plan == LinearPlan(2, (2, 3), 4, 1) and model[0]._osprey_row_plan is plan
    assert use_row_exact_linears(model, max_rows=3)[key] is plan and model[0]._osprey_row_plan is plan
    assert model[0]._osprey_row_inner is fake
    larger = use_row_exact_linears(model, max_rows=6)
    assert model[0]._osprey_row_plan == LinearPlan(2, (2, 3), 6, 1)
    assert model[0]._osprey_row_inner is fake  # re-probed on the kernel, not on the shaped forward
    assert larger[key] is model[0]._osprey_row_plan
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        use_row_exact_linears(model, max_rows=6)
        assert model[0]._osprey_row_plan == LinearPlan(2, (2, 3), 6, 2)
        assert model[0]._osprey_row_inner is fake
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        use_row_exact_linears(model, max_rows=0)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_this_machines_own_kernels_are_row_exact_once_shaped(precision):
    """No fake: MKL float32 (M = 1 a GEMV here) and oneDNN prepacked bf16, on rows the probe never saw."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(192, 320), torch.nn.Linear(320, 192, bias=False)).eval()
    prec = resolve_precision(precision, "cpu")
    prec.prepare(model)
    use_row_exact_linears(model, max_rows=9)
    for seed in range(3):
        x = _spread_rows(9, 192, seed=10 + seed, dtype=prec.weights)
        assert _rows_match_one_row_calls(model, x, 9) == list(range(1, 10)), (precision, seed)


# --- make_rows_exact on a model ---------------------------------------------------------------


STEPS = (1, 2, 4)
NEW = 24


def _tiny_target(tiny_llama_dir, precision: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    prec = resolve_precision(precision, "cpu")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    prec.prepare(model)
    return model, prec


def _with_m_dependent_linears(model) -> None:
    """The LM head computes a one-row call another way, far enough off to flip greedy tokens; every
    down_proj switches kernel (by one ulp) from blocks of 4 rows on."""
    g = torch.Generator().manual_seed(1)
    head = model.get_output_embeddings()
    _fake(head, lambda m: int(m == 1), shift=torch.randn(head.out_features, generator=g).to(head.weight.dtype))
    for layer in model.model.layers:
        _fake(layer.mlp.down_proj, lambda m: int(m >= 4))


def _prompts(vocab: int, n: int = 6) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (int(torch.randint(8, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _compare(target, vocab) -> tuple[list[str], dict[int, set[int]], int]:
    """Speculative (oracle-with-errors drafter) vs plain decoding on every prompt and S: the splits,
    the acceptance lengths seen per S, and how many verify rows on plain decoding's path differ
    from its logits in bits (after checking that every generated token's row was compared)."""
    splits, accepted, differ = [], {s: set() for s in STEPS}, 0
    rows = RowLogits(target)
    try:
        for i, prompt in enumerate(_prompts(vocab)):
            rows.record()
            plain = plain_generate(target, prompt, max_new_tokens=NEW).output_ids
            for s in STEPS:
                drafter = OracleWithErrors(plain, len(prompt), vocab, seed=f"{i}:{s}")
                rows.check([*prompt, *plain])
                spec = speculative_generate(target, drafter, prompt, num_steps=s, max_new_tokens=NEW)
                accepted[s].update(a for a, d in zip(spec.accepted, spec.drafted) if d == s)
                where = first_divergence(spec.output_ids, plain)
                if where is not None:
                    splits.append(f"prompt {i} S={s} at {where}")
                else:
                    assert rows.compared >= NEW
                differ += len(rows.differ)
    finally:
        del target.forward  # the session's own method again
    return splits, accepted, differ


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_make_rows_exact_makes_speculative_equal_plain(tiny_llama_dir, precision):
    model, _ = _tiny_target(tiny_llama_dir, precision)
    _with_m_dependent_linears(model)
    vocab = model.get_output_embeddings().out_features
    target = HFTargetSession(model, TAPS)
    # the control: row-exact attention alone does not save it
    splits, _, differ = _compare(target, vocab)
    assert splits and differ, "the M-dependent linears should split speculative from plain decoding before shaping"
    exactness = target.make_rows_exact(max(STEPS) + 1)
    assert exactness["row_by_row"] == [] and exactness["rows_checked"] == max(STEPS) + 1
    assert exactness["threads"] == 1
    assert exactness["summary"].startswith("verify rows exact by construction")
    dtype = "float32" if precision == "float32" else "bfloat16"
    kind = "F.linear" if precision == "float32" else "oneDNN prepacked"
    assert exactness["linears"][f"{kind} {dtype} cpu 64->{vocab}"] == \
        "one-row calls padded to 2 rows; every block of 2..5 rows exact"
    assert exactness["linears"][f"{kind} {dtype} cpu 128->64"] == \
        "one-row calls as they come; blocks of 4-5 rows cut into exact sizes"
    splits, accepted, differ = _compare(target, vocab)
    assert splits == [] and differ == 0
    assert accepted == {s: set(range(s + 1)) for s in STEPS}


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_non_linear_module_that_is_not_row_invariant_falls_back_to_row_by_row(tiny_llama_dir, precision):
    """The final norm shifts blocks of 3+ rows: no linear shaping can fix that, the whole-model check
    sees it and verify blocks of those lengths run one row at a time; the output stays exact."""
    model, _ = _tiny_target(tiny_llama_dir, precision)
    norm = model.model.norm
    inner = norm.forward
    g = torch.Generator().manual_seed(2)
    shift = (4 * torch.randn(model.config.hidden_size, generator=g)).to(model.dtype)

    def m_dependent_norm(hidden):
        out = inner(hidden)
        return out + shift if hidden.shape[-2] >= 3 else out

    norm.forward = m_dependent_norm
    vocab = model.get_output_embeddings().out_features
    target = HFTargetSession(model, TAPS)
    exactness = target.make_rows_exact(max(STEPS) + 1)
    assert exactness["row_by_row"] == [3, 4, 5]
    assert exactness["summary"].startswith("verify blocks of [3, 4, 5] rows computed one row at a time")
    splits, accepted, differ = _compare(target, vocab)
    assert splits == [] and differ == 0
    assert accepted == {s: set(range(s + 1)) for s in STEPS}
    # the control: verified as blocks, the same decoding splits
    target._row_by_row = frozenset()
    assert _compare(target, vocab)[0]


def test_make_rows_exact_needs_row_exact_attention(tiny_llama_dir):
    model, _ = _tiny_target(tiny_llama_dir, "float32")
    with pytest.raises(ModelError, match="needs row-exact attention"):
        HFTargetSession(model, TAPS, row_exact=False).make_rows_exact(3)
