"""The one drafter/target compatibility check, against a store's header and against a live target."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from osprey_data.errors import ModelError
from osprey_data.target_model import TapLayers, TargetIdentity, check_compatible

TARGET = TargetIdentity(name_or_path="t", model_type="llama", config_hash="c" * 64, tokenizer_hash="k" * 64,
                        vocab_size=384, hidden_size=64, num_layers=6, dtype="float32")


@dataclass
class Spec:
    """The fields of a DrafterConfig the check reads."""

    vocab_size: int = 384
    target_hidden_size: int = 64
    tap_layers: TapLayers = TapLayers(layer_ids=(2, 3, 4))
    target: TargetIdentity | None = TARGET


def test_matching_drafter_passes_both_ways():
    check_compatible(Spec(), TARGET, taps=TapLayers(layer_ids=(2, 3, 4)), where="store")
    check_compatible(Spec(), TARGET, where="live")
    check_compatible(Spec(target=None), replace(TARGET, config_hash="other"), where="unknown identity")


def test_every_difference_is_named_with_where_and_hint():
    bad = Spec(vocab_size=100, target_hidden_size=32, tap_layers=TapLayers(layer_ids=(1, 2)))
    with pytest.raises(ModelError) as info:
        check_compatible(bad, TARGET, taps=TapLayers(layer_ids=(2, 3, 4)), where="distill --store s",
                         hint="do this")
    msg = str(info.value)
    assert msg.startswith("distill --store s: the drafter was converted for another target")
    for part in ("vocab_size drafter 100 vs target 384", "target_hidden_size drafter 32 vs target 64",
                 "num_taps drafter 2 vs store 3", "tap layers drafter [1, 2] vs store [2, 3, 4]"):
        assert part in msg
    assert msg.endswith("; do this")


def test_live_target_checks_tap_range_and_identity_unless_allowed():
    with pytest.raises(ModelError, match=r"tap layers \[7\] outside the target's 0..6"):
        check_compatible(Spec(tap_layers=TapLayers(layer_ids=(2, 7))), TARGET, where="live")
    other = replace(TARGET, config_hash="d" * 64)
    with pytest.raises(ModelError, match="target config_hash drafter cccccccccccc vs dddddddddddd"):
        check_compatible(Spec(), other, where="live")
    check_compatible(Spec(), other, where="live", check_identity=False)
    with pytest.raises(ModelError, match="tokenizer_hash"):
        check_compatible(Spec(), replace(TARGET, tokenizer_hash="x" * 64), taps=TapLayers(layer_ids=(2, 3, 4)),
                         where="store")
