"""Comparing one stored sample with its recomputation: the metrics and the bars they must meet.

``osprey data verify`` (:mod:`osprey_data.builder.verify`) recomputes a sample's features with a
clean teacher-forced prefill (one sequence, no padding) and hands both versions here. Everything
in this file is plain numpy on already-decoded arrays, so the bars can be tested without a model.

The bars say how far a correctly built store may be from the recomputation:

* hidden states (taps, final hidden): the codec's own error (bf16 codecs round to nearest, at
  most ``2^-8 |x|`` per element; fp8 follows :func:`~osprey_data.store.codecs.fp8_error_bound`)
  plus the arithmetic noise of the dtypes the store was built and recomputed in
  (:data:`DTYPE_HIDDEN_REL`). Judged as a relative error ``||stored - recomputed|| /
  ||recomputed||`` per tap over the *ordinary* channels: a few massive-activation channels
  (SmolLM2: |h| up to 26,624 against a median of 2.2) would otherwise dominate the norm and hide
  an error in every other channel. The :data:`OUTLIER_CHANNELS` largest-magnitude channels of
  each (token, tap) are left out of that norm (the fp8 codec keeps the same number exactly);
  max/mean absolute errors are reported over all channels.
* log-probs (stored as float32, no codec): the dtype noise only, as the *mean* absolute error
  over the ids both top-k lists hold (:data:`DTYPE_LOGPROB_MEAN`); the max is reported, not
  judged: in bf16 a few low-probability ids of a correct store move by up to ~1 nat.
* top-1 and top-k: where the recomputed top-2 gap exceeds the dtype's near-tie gap
  (:data:`DTYPE_TIE_GAP`, about twice the largest per-id log-prob noise of the high-probability
  ids), the stored top-1 must equal the recomputed one, and every id whose recomputed log-prob
  clears the k-th by that gap must be in the stored top-k. Those are checked exactly (no
  disagreement allowed); closer positions are near-ties and only counted.

Legend: T tokens, L taps, D hidden, K top-k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from osprey_data.store.codecs import fp8_error_bound

__all__ = ["Bars", "SampleCheck", "bars_for", "compare_hidden", "compare_topk", "OUTLIER_CHANNELS",
           "DTYPE_HIDDEN_REL", "DTYPE_LOGPROB_MEAN", "DTYPE_TIE_GAP", "BF16_REL"]

# Channels per (token, tap) left out of the relative error: the fp8 codec's outlier count.
OUTLIER_CHANNELS = 8

# bf16 rounds to nearest: |round(x) - x| <= half an ulp <= 2^-8 |x| (8 significand bits).
BF16_REL = 2.0 ** -8

# Relative hidden-state noise between two correct forwards of the same sequence in a dtype (a
# batched, padded prefill against a single one; another device or engine): float32 reduction
# order only; bf16/fp16 round every layer's output, so one-ulp flips compound over the layers.
# Measured on SmolLM2-135M (30 layers), a 4-sequence batched build against single recomputes:
# see docs/build.md ("Checking a store").
DTYPE_HIDDEN_REL = {"float32": 1e-4, "bfloat16": 2.0 ** -4, "float16": 2.0 ** -6}

# Mean absolute log-prob noise over shared top-k ids, for the same reason (a float32 head over
# the last hidden state follows its noise). SmolLM2 bf16, batched build vs single recompute:
# mean 0.077, p99 0.37, max 1.07 nats (low-probability ids); float32: below 1e-4.
DTYPE_LOGPROB_MEAN = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.06}

# Recomputed top-2 gaps under which the order may legitimately flip. SmolLM2 bf16: the widest
# flipped gap was 0.25 nats (10 flips in 610 positions), the top-1 log-prob moved by <= 0.18.
DTYPE_TIE_GAP = {"float32": 4e-3, "bfloat16": 0.5, "float16": 0.125}


@dataclass(frozen=True)
class Bars:
    """What a correctly built sample must meet (see the module docstring)."""

    hidden_dtype_rel: float
    """Relative hidden-state error allowed on top of the codec's (dtype noise)."""
    logprob_mean: float
    """Largest mean |stored - recomputed| log-prob over shared top-k ids."""
    tie_gap: float
    """Log-prob gaps under this are near-ties (the order may legitimately differ)."""
    codec: str
    """The store's hidden codec (its bound is computed per sample)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bars_for(codec: str, build_dtype: str, recompute_dtype: str) -> Bars:
    """The bars for a store in ``codec`` built in ``build_dtype``, recomputed in ``recompute_dtype``."""
    dtypes = (build_dtype, recompute_dtype)

    def worst(table: dict[str, float]) -> float:  # an unknown dtype counts as bf16, the noisiest
        return max(table.get(d, table["bfloat16"]) for d in dtypes)

    return Bars(hidden_dtype_rel=worst(DTYPE_HIDDEN_REL), logprob_mean=worst(DTYPE_LOGPROB_MEAN),
                tie_gap=worst(DTYPE_TIE_GAP), codec=codec)


@dataclass
class SampleCheck:
    """The comparison of one sample; ``failures`` empty means it passed."""

    index: int
    sample_id: str
    num_tokens: int
    hidden_max_abs: float = 0.0
    """Largest |stored - recomputed| over every tap, token and channel."""
    hidden_mean_abs: float = 0.0
    hidden_rel: float = 0.0
    """Worst tap's relative error over ordinary channels."""
    hidden_bar: float = 0.0
    """The relative error allowed (codec bound + dtype noise)."""
    worst_tap: int | None = None
    """Tap id (HF numbering) with the largest relative error."""
    final_rel: float | None = None
    final_bar: float | None = None
    top1_agree: float = 1.0
    """Fraction of positions whose stored top-1 id equals the recomputed one (near-ties included)."""
    top1_clear_mismatch: int = 0
    """Positions outside near-ties where the top-1 differs (must be 0)."""
    near_ties: int = 0
    topk_overlap: float = 1.0
    """Mean |stored top-k ∩ recomputed top-k| / K."""
    topk_clear_missing: int = 0
    """(position, id) pairs clearly inside the recomputed top-k but absent from the stored one."""
    logprob_max_err: float = 0.0
    logprob_mean_err: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _ordinary_mask(ref_NLD: np.ndarray) -> np.ndarray:
    """False at the OUTLIER_CHANNELS largest-|x| channels of each (token, tap)."""
    D = ref_NLD.shape[-1]
    P = max(0, min(OUTLIER_CHANNELS, D - 1))
    mask = np.ones(ref_NLD.shape, dtype=bool)
    if P:
        top = np.argpartition(np.abs(ref_NLD), D - P, axis=-1)[..., D - P:]
        np.put_along_axis(mask, top, False, axis=-1)
    return mask


def _codec_bound(codec: str, ref_NLD: np.ndarray) -> np.ndarray:
    if codec == "fp8":
        return fp8_error_bound(ref_NLD, OUTLIER_CHANNELS)
    return np.abs(ref_NLD) * BF16_REL


def compare_hidden(stored_NLD: np.ndarray, ref_NLD: np.ndarray, *, codec: str,
                   dtype_rel: float) -> dict[str, Any]:
    """Errors of stored hidden states (N, L, D) against recomputed ones, per tap.

    Returns ``max_abs``, ``mean_abs`` (all channels), ``rel_L`` (per tap, ordinary channels),
    ``bar_L`` (the codec's bound as a relative error on the same channels, plus ``dtype_rel``).
    """
    stored = np.asarray(stored_NLD, dtype=np.float32)
    ref = np.asarray(ref_NLD, dtype=np.float32)
    assert stored.shape == ref.shape, (stored.shape, ref.shape)
    err = np.abs(stored - ref)
    ordinary = _ordinary_mask(ref)
    bound = _codec_bound(codec, ref)
    axes = (0, 2)  # tokens and channels: one number per tap

    def norm_L(x: np.ndarray) -> np.ndarray:
        return np.sqrt(np.square(np.where(ordinary, x, 0.0), dtype=np.float64).sum(axis=axes))

    ref_norm, err_norm, bound_norm = norm_L(ref), norm_L(err), norm_L(bound)
    safe = np.maximum(ref_norm, 1e-30)
    return {"max_abs": float(err.max()) if err.size else 0.0,
            "mean_abs": float(err.mean()) if err.size else 0.0,
            "rel_L": err_norm / safe, "bar_L": bound_norm / safe + dtype_rel}


def compare_topk(stored_ids_TK: np.ndarray, stored_lp_TK: np.ndarray, ref_ids_TK: np.ndarray,
                 ref_lp_TK: np.ndarray, *, tie_gap: float) -> dict[str, Any]:
    """Top-1 agreement, top-k overlap and log-prob errors of stored top-k against recomputed."""
    s_ids, r_ids = np.asarray(stored_ids_TK), np.asarray(ref_ids_TK)
    s_lp, r_lp = np.asarray(stored_lp_TK, dtype=np.float64), np.asarray(ref_lp_TK, dtype=np.float64)
    T, K = r_ids.shape
    if T == 0:
        return {"top1_agree": 1.0, "clear_mismatch": 0, "near_ties": 0, "overlap": 1.0, "clear_missing": 0,
                "lp_max": 0.0, "lp_mean": 0.0}
    agree_T = s_ids[:, 0] == r_ids[:, 0]
    gap_T = r_lp[:, 0] - r_lp[:, 1] if K > 1 else np.full(T, np.inf)
    tie_T = gap_T < tie_gap
    # shared ids: (T, K, K) equality of stored against recomputed ids
    same_TKK = s_ids[:, :, None] == r_ids[:, None, :]
    in_stored_TK = same_TKK.any(axis=1)  # recomputed id j is in the stored list
    overlap = float(in_stored_TK.sum(axis=1).mean() / K)
    clear_TK = r_lp > (r_lp[:, -1:] + tie_gap)  # clearly inside the recomputed top-k
    clear_missing = int((clear_TK & ~in_stored_TK).sum())
    # stored log-prob of each recomputed id (where stored), by the matching slot
    slot_TK = same_TKK.argmax(axis=1)
    s_lp_at_r = np.take_along_axis(s_lp, slot_TK, axis=1)
    lp_err = np.abs(s_lp_at_r - r_lp)[in_stored_TK]
    return {"top1_agree": float(agree_T.mean()), "clear_mismatch": int((~agree_T & ~tie_T).sum()),
            "near_ties": int(tie_T.sum()), "overlap": overlap, "clear_missing": clear_missing,
            "lp_max": float(lp_err.max()) if lp_err.size else float("inf"),
            "lp_mean": float(lp_err.mean()) if lp_err.size else float("inf")}


def check_sample(check: SampleCheck, *, stored: Any, ref: Any, taps: tuple[int, ...], bars: Bars,
                 has_final_hidden: bool) -> SampleCheck:
    """Fill ``check`` from a stored :class:`~osprey_data.store.Sample` and recomputed
    :class:`~osprey_data.builder.backends.SequenceFeatures`, with a failure line per unmet bar."""
    h = compare_hidden(stored.hidden_TLD, _numpy(ref.hidden_TLD), codec=bars.codec, dtype_rel=bars.hidden_dtype_rel)
    worst = int(np.argmax(h["rel_L"] / h["bar_L"]))
    check.hidden_max_abs, check.hidden_mean_abs = h["max_abs"], h["mean_abs"]
    check.hidden_rel, check.hidden_bar, check.worst_tap = float(h["rel_L"][worst]), float(h["bar_L"][worst]), taps[worst]
    over = [(taps[j], float(h["rel_L"][j]), float(h["bar_L"][j])) for j in range(len(taps))
            if not h["rel_L"][j] <= h["bar_L"][j]]
    if over:
        check.failures.append("hidden " + ", ".join(f"tap {t}: rel err {r:.3g} > bar {b:.3g}" for t, r, b in over))
    if has_final_hidden:
        f = compare_hidden(np.asarray(stored.final_hidden_TD)[:, None], _numpy(ref.final_hidden_TD)[:, None],
                           codec=bars.codec, dtype_rel=bars.hidden_dtype_rel)
        check.final_rel, check.final_bar = float(f["rel_L"][0]), float(f["bar_L"][0])
        if not check.final_rel <= check.final_bar:
            check.failures.append(f"final hidden: rel err {check.final_rel:.3g} > bar {check.final_bar:.3g}")
    k = compare_topk(stored.topk_ids_TK, stored.topk_logprobs_TK, ref.topk_ids_TK, ref.topk_logprobs_TK,
                     tie_gap=bars.tie_gap)
    check.top1_agree, check.top1_clear_mismatch, check.near_ties = k["top1_agree"], k["clear_mismatch"], k["near_ties"]
    check.topk_overlap, check.topk_clear_missing = k["overlap"], k["clear_missing"]
    check.logprob_max_err, check.logprob_mean_err = k["lp_max"], k["lp_mean"]
    if check.top1_clear_mismatch:
        check.failures.append(f"top-1 differs at {check.top1_clear_mismatch} of {check.num_tokens} positions "
                              f"outside near-ties (gap >= {bars.tie_gap:.3g})")
    if check.topk_clear_missing:
        check.failures.append(f"{check.topk_clear_missing} ids clearly in the recomputed top-k are missing "
                              f"from the stored top-k")
    if not check.logprob_mean_err <= bars.logprob_mean:
        check.failures.append(f"mean log-prob error {check.logprob_mean_err:.3g} > bar {bars.logprob_mean:.3g}")
    return check


def _numpy(x: Any) -> np.ndarray:
    """float32 numpy of a torch tensor (any dtype) or array."""
    if hasattr(x, "detach"):
        return x.detach().to("cpu").float().numpy()
    return np.asarray(x, dtype=np.float32)
