"""Tap layers: default taps and both directions of each engine's numbering."""

from __future__ import annotations

import pytest

from osprey_data.errors import ConfigError
from osprey_data.target_model import TapLayers, default_tap_layers


def test_default_tap_layers():
    assert default_tap_layers(30).layer_ids == (2, 15, 27)
    assert default_tap_layers(32).layer_ids == (2, 16, 29)
    assert default_tap_layers(7).layer_ids == (2, 3, 4)
    # where [2, L//2, L-3] would repeat a layer: three distinct layers within 1..L-1
    assert default_tap_layers(6).layer_ids == (1, 3, 5)
    assert default_tap_layers(4).layer_ids == (1, 2, 3)
    assert default_tap_layers(30).convention == "hf_hidden_states"
    with pytest.raises(ConfigError, match="--taps"):
        default_tap_layers(3)


@pytest.mark.parametrize("ids, message", [
    ((), "at least one"),
    ((0, 2, 3), ">= 1"),
    ((3, 2, 4), "strictly increasing"),
    ((2, 2, 4), "strictly increasing"),
])
def test_tap_layers_are_validated_where_they_enter(ids, message):
    with pytest.raises(ConfigError, match=message):
        TapLayers(layer_ids=ids)
    TapLayers(layer_ids=(1, 3, 5)).check_target(6)
    with pytest.raises(ConfigError, match="outside 1..5"):
        TapLayers(layer_ids=(1, 3, 6)).check_target(6)  # hidden_states[L] is the final normed state


def test_engine_conventions_both_ways():
    taps = TapLayers(layer_ids=(2, 15, 27))
    # SGLang adds 1 to explicit ids and captures the input of that layer: ours minus one.
    assert taps.to_sglang() == [1, 14, 26]
    # vLLM captures hidden + residual before running layer idx = hidden_states[idx].
    assert taps.to_vllm() == [2, 15, 27]
    assert TapLayers.from_sglang([1, 14, 26]) == taps
    assert TapLayers.from_vllm([2, 15, 27]) == taps
    assert taps.num_taps == 3
    with pytest.raises(ConfigError, match="embedding"):
        TapLayers(layer_ids=(0, 3)).to_sglang()


def test_checks_and_json_round_trip():
    with pytest.raises(ConfigError):
        TapLayers(layer_ids=())
    with pytest.raises(ConfigError):
        TapLayers(layer_ids=(1,), convention="vllm")
    with pytest.raises(ConfigError, match="layer_ids"):
        TapLayers.from_dict({"ids": [1]})
    taps = TapLayers(layer_ids=(1, 3, 4))
    assert taps.to_dict() == {"layer_ids": [1, 3, 4], "convention": "hf_hidden_states"}
    assert TapLayers.from_dict(taps.to_dict()) == taps
