"""Stage 1 prune: the pruned checkpoint computes the source truncated after N blocks."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from osprey_data.errors import ConfigError
from osprey_train.stages.prune import PruneConfig, prune_model, run


def _truncated_reference(source_dir, ids, n):
    """Run the SOURCE's embedding + first n layers (HF hidden_states[n]) + final norm + LM head."""
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(source_dir).eval()
    with torch.no_grad():
        out = source(input_ids=ids, output_hidden_states=True)
        assert len(out.hidden_states) == source.config.num_hidden_layers + 1
        return source.lm_head(source.model.norm(out.hidden_states[n])), source


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_pruned_logits_equal_truncated_source(request, tmp_path, fixture):
    from transformers import AutoModelForCausalLM

    source_dir = request.getfixturevalue(fixture)
    result = run(PruneConfig(source=str(source_dir), layers=2, out=tmp_path / "pruned"))
    assert result.source_layers == 6 and result.kept_layers == 2
    pruned = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    assert pruned.config.num_hidden_layers == 2 and len(pruned.model.layers) == 2
    ids = torch.randint(0, pruned.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    expected, source = _truncated_reference(source_dir, ids, 2)
    with torch.no_grad():
        got = pruned(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # the full source differs (so the check is meaningful)
    with torch.no_grad():
        assert not torch.allclose(source(input_ids=ids).logits, expected, atol=1e-3)
    assert pruned.config.tie_word_embeddings == source.config.tie_word_embeddings
    info = json.loads((tmp_path / "pruned" / "prune_info.json").read_text())
    assert info["kept_layers"] == 2 and "num_hidden_layers" in info["patched_config_keys"]
    assert (tmp_path / "pruned" / "tokenizer.json").exists()


def test_per_layer_config_lists_are_cut():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         layer_types=["full_attention", "sliding_attention"] * 2, sliding_window=8,
                         use_sliding_window=True, max_window_layers=3)
    model = Qwen3ForCausalLM(config)
    patched = prune_model(model, 3)
    assert model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    assert model.config.num_hidden_layers == 3 and model.config.max_window_layers == 3
    assert "layer_types" in patched
    with pytest.raises(ConfigError, match="cannot keep 5"):
        prune_model(model, 5)


def test_prune_config_checks(tmp_path):
    with pytest.raises(ConfigError, match="--layers"):
        PruneConfig(source="x", layers=0, out=tmp_path / "o")
    (tmp_path / "o").mkdir()
    with pytest.raises(ConfigError, match="exists"):
        PruneConfig(source="x", layers=1, out=tmp_path / "o")


def test_cli_prune(tiny_llama_dir, tmp_path):
    from osprey_cli.main import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["train", "prune", "--source", str(tiny_llama_dir), "--layers", "3",
                              "--out", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "p" / "config.json").read_text())["num_hidden_layers"] == 3
    res = runner.invoke(cli, ["train", "prune", "--source", str(tiny_llama_dir), "--layers", "9",
                              "--out", str(tmp_path / "q")])
    assert res.exit_code == 2 and "cannot keep 9" in res.output
    res = runner.invoke(cli, ["train", "prune", "--source", str(tmp_path / "missing"), "--layers", "1",
                              "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "no such folder" in res.output


def test_an_existing_out_is_refused_unless_overwrite_as_the_help_says(tmp_path, tiny_llama_dir):
    """A second prune into the same --out refuses (a careful user's earlier run is not lost by a
    repeated command line); --overwrite replaces it. The help of --out must say so, not 'replaced'."""
    from osprey_cli.main import cli

    help_text = " ".join(CliRunner().invoke(cli, ["train", "prune", "--help"]).output.split())
    assert "refused unless --overwrite" in help_text and "replaced if it exists" not in help_text, help_text
    out = tmp_path / "pruned"
    run(PruneConfig(source=str(tiny_llama_dir), layers=2, out=out))
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        run(PruneConfig(source=str(tiny_llama_dir), layers=3, out=out))
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2   # untouched
    run(PruneConfig(source=str(tiny_llama_dir), layers=3, out=out, overwrite=True))
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
