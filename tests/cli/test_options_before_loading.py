"""Every option is checked before any model loads (issue 25, "What to build" 4; issue 37, item 5).

Each command runs in-process with one malformed option against inputs that name nothing real (a
target, drafter or store that does not exist, so any attempt to load would fail with another
message). The run must exit 2 with one ``error:`` line that names the bad option, print no
traceback, and leave no output folder behind.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.target_model import TapLayers

MISSING = "/nonexistent/osprey-test"


def _commands(tmp):
    """(command line, with OUT for the output folder) per command."""
    return {
        "data build": ["data", "build", "--target", f"{MISSING}/model", "--input", f"{MISSING}/chat.jsonl",
                       "--out", "OUT"],
        "train distill": ["train", "distill", "--drafter", f"{MISSING}/init", "--store", f"{MISSING}/store",
                          "--out", "OUT"],
        "train pretrain": ["train", "pretrain", "--model", f"{MISSING}/pruned", "--corpus", f"{MISSING}/corpus",
                           "--out", "OUT"],
        "train convert": ["train", "convert", "--backbone", f"{MISSING}/backbone", "--store", f"{MISSING}/store",
                          "--out", "OUT"],
        "eval acceptance": ["eval", "acceptance", "--drafter", f"{MISSING}/drafter", "--store", f"{MISSING}/store"],
        "eval live": ["eval", "live", "--drafter", str(tmp), "--target", f"{MISSING}/model",
                      "--input", str(tmp / "prompts.jsonl"), "--out", "OUT/live.json"],
        "eval matrix": ["eval", "matrix", "--drafter", f"a={MISSING}/drafter", "--store", f"a={MISSING}/store",
                        "--out", "OUT"],
        "eval sweep": ["eval", "sweep", "--drafter", f"{MISSING}/drafter", "--store", f"{MISSING}/store",
                       "--out", "OUT"],
        "export": ["export", "--drafter", f"{MISSING}/drafter", "--format", "sglang", "--out", "OUT"],
    }


BAD = [
    ("data build", ["--device", "gpu"], "--device"), ("data build", ["--threads", "0"], "--threads"),
    ("data build", ["--batch-size", "0"], "--batch-size"), ("data build", ["--max-new-tokens", "0"], "--max-new-tokens"),
    ("data build", ["--top-p", "0"], "--top-p"), ("data build", ["--taps", "2,x"], "--taps"),
    ("train distill", ["--device", "gpu"], "device"), ("train distill", ["--steps", "0"], "max_steps"),
    ("train distill", ["--threads", "0"], "--threads"), ("train distill", ["--ttt-steps", "0"], "--ttt-steps"),
    ("train distill", ["--lr", "-1"], "lr"),
    ("train pretrain", ["--device", "gpu"], "device"), ("train pretrain", ["--steps", "0"], "max_steps"),
    ("train pretrain", ["--threads", "0"], "--threads"), ("train pretrain", ["--seq-len", "0"], "seq_len"),
    ("train convert", ["--threads", "0"], "--threads"), ("train convert", ["--draft-vocab", "0"], "--draft-vocab"),
    ("train convert", ["--arch", "gpt"], "--arch"),
    ("eval acceptance", ["--device", "gpu"], "--device"), ("eval acceptance", ["--steps", "0"], "--steps"),
    ("eval acceptance", ["--threads", "0"], "--threads"), ("eval acceptance", ["--temperature", "-1"], "--temperature"),
    ("eval acceptance", ["--tree", "5,x,8"], "5,x,8"),
    ("eval live", ["--device", "gpu"], "--device"), ("eval live", ["--steps", "0"], "--steps"),
    ("eval live", ["--threads", "0"], "--threads"), ("eval live", ["--max-new-tokens", "0"], "--max-new-tokens"),
    ("eval live", ["--tree", "5,x,8"], "5,x,8"),
    ("eval matrix", ["--device", "gpu"], "--device"), ("eval matrix", ["--steps", "0"], "--steps"),
    ("eval matrix", ["--threads", "0"], "--threads"),
    ("eval sweep", ["--device", "gpu"], "--device"), ("eval sweep", ["--threads", "0"], "--threads"),
    ("eval sweep", ["--grid-steps", "0"], "--grid-steps"), ("eval sweep", ["--cost", "draft_step=x"], "draft_step"),
    ("export", ["--threads", "0"], "--threads"), ("export", ["--dtype", "fp7"], "--dtype"),
    ("export", ["--format", "onnx"], "--format"),
]


@pytest.mark.parametrize("command,bad,named", BAD, ids=[f"{c} {' '.join(b)}" for c, b, _ in BAD])
def test_a_malformed_option_fails_first_with_one_line(tmp_path, monkeypatch, command, bad, named):
    (tmp_path / "prompts.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    out = tmp_path / "out"
    args = [a.replace("OUT", str(out)) for a in _commands(tmp_path)[command]]
    # an option given twice: click keeps the last, so the malformed value replaces a good one
    res = CliRunner().invoke(cli, [*args, *bad])
    text = res.output
    assert res.exit_code == 2, f"exit {res.exit_code}: {text}"
    assert "Traceback" not in text and res.exception is None or isinstance(res.exception, SystemExit), text
    errors = [line for line in text.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1, text
    assert named in errors[0], f"the error does not name {named}: {errors[0]}"
    assert MISSING not in errors[0], f"a path was looked at before the option: {errors[0]}"
    assert not out.exists(), "the command created its output folder before refusing an option"


# --- issue 37: what config.json and the tokenizer files tell is checked before any weights load ---
#
# Each command runs on real tiny models (tests/helpers/tiny.py) with one setting that the configs
# refute. The functions that load weights -- transformers' ``PreTrainedModel.from_pretrained``
# (every ``AutoModel*`` load ends there) and the safetensors read of ``load_drafter`` -- are
# replaced by ones that record the call and raise: the command must exit 2 with one error line
# naming the option and the config file, and must not have called them.


class _WeightsLoaded(RuntimeError):
    pass


@pytest.fixture
def no_weights(monkeypatch):
    """Record (and refuse) every weight load; the list of what was asked for."""
    from transformers import PreTrainedModel

    import osprey_train.models.io as drafter_io

    calls: list[str] = []

    def refuse_model(cls, name, *args, **kwargs):
        calls.append(f"model {name}")
        raise _WeightsLoaded(f"weights of {name} loaded")

    def refuse_drafter(path, *args, **kwargs):
        calls.append(f"drafter {path}")
        raise _WeightsLoaded(f"weights {path} loaded")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse_model))
    monkeypatch.setattr(drafter_io, "load_file", refuse_drafter)
    return calls


@pytest.fixture(scope="module")
def early_store(tmp_path_factory, tiny_llama_dir):
    """A store of the tiny Llama (taps 2,3,4), built before any test patches the loaders."""
    from tests.train.evaluation.store_util import make_store

    return make_store(tmp_path_factory.mktemp("early") / "store", tiny_llama_dir, num_samples=3, max_new_tokens=4)


def _drafter(tmp_path, name="d", preset="tiny", **overrides):
    from osprey_train.models import DrafterConfig, save_drafter
    from osprey_train.models.io import build_drafter

    return save_drafter(build_drafter(DrafterConfig.from_name(preset, **overrides)), tmp_path / name)


def _refused_early(args, calls, *named):
    res = CliRunner().invoke(cli, [str(a) for a in args])
    text = res.output
    assert not calls, f"weights loaded before the check: {calls}\n{text}"
    assert res.exit_code == 2, f"exit {res.exit_code}: {text}"
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    for word in named:
        assert word in errors[0], f"the error does not name {word!r}: {errors[0]}"
    return errors[0]


def test_build_taps_beyond_the_target(tmp_path, tiny_llama_dir, no_weights):
    (tmp_path / "chat.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    line = _refused_early(["data", "build", "--target", tiny_llama_dir, "--input", tmp_path / "chat.jsonl",
                           "--out", tmp_path / "out", "--taps", "2,3,99", "--device", "cpu"], no_weights,
                          "--taps", str(tiny_llama_dir / "config.json"), "outside 1..5", "choose ids within 1..5")
    assert "[99]" in line and not (tmp_path / "out").exists()


def test_build_target_without_config_json(tmp_path, tiny_tokenizer_dir, no_weights):
    (tmp_path / "chat.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    _refused_early(["data", "build", "--target", tiny_tokenizer_dir, "--input", tmp_path / "chat.jsonl",
                    "--out", tmp_path / "out", "--device", "cpu"], no_weights, "--target", "no config.json")


def test_build_target_without_chat_template(tmp_path, tiny_llama_dir, no_weights):
    import shutil

    target = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    doc = json.loads((target / "tokenizer_config.json").read_text())
    doc.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(doc))
    (tmp_path / "chat.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    _refused_early(["data", "build", "--target", target, "--input", tmp_path / "chat.jsonl", "--out",
                    tmp_path / "out", "--device", "cpu"], no_weights,
                   "--target", "no chat template", "tokenizer_config.json", "--chat-template")
    # pre-formatted text needs no template: the check lets it through to the (refused) load
    (tmp_path / "text.jsonl").write_text('{"text": "hello there"}\n')
    res = CliRunner().invoke(cli, ["data", "build", "--target", str(target), "--input", str(tmp_path / "text.jsonl"),
                                   "--out", str(tmp_path / "out2"), "--device", "cpu"])
    assert no_weights and isinstance(res.exception, _WeightsLoaded), res.output


def test_prune_more_layers_than_the_source(tmp_path, tiny_llama_dir, no_weights):
    _refused_early(["train", "prune", "--source", tiny_llama_dir, "--layers", "99", "--out", tmp_path / "p"],
                   no_weights, "--layers 99", str(tiny_llama_dir / "config.json"), "--layers 1..6")


def test_convert_taps_beyond_the_target(tmp_path, tiny_llama_dir, no_weights):
    _refused_early(["train", "convert", "--backbone", tiny_llama_dir, "--target", tiny_llama_dir, "--taps", "1,2,99",
                    "--out", tmp_path / "d"], no_weights, "--taps", str(tiny_llama_dir / "config.json"), "[99]")


def test_convert_backbone_of_an_unsupported_family(tmp_path, tiny_llama_dir, no_weights):
    import shutil

    backbone = tmp_path / "backbone"
    shutil.copytree(tiny_llama_dir, backbone)
    doc = json.loads((backbone / "config.json").read_text())
    (backbone / "config.json").write_text(json.dumps({**doc, "model_type": "gpt2"}))
    _refused_early(["train", "convert", "--backbone", backbone, "--target", tiny_llama_dir, "--out", tmp_path / "d"],
                   no_weights, str(backbone / "config.json"), "model_type 'gpt2'")


def test_convert_draft_vocab_larger_than_the_target(tmp_path, tiny_llama_dir, early_store, no_weights):
    for arch in (["--backbone", tiny_llama_dir], ["--arch", "eagle3", "--target", tiny_llama_dir]):
        _refused_early(["train", "convert", *arch, "--store", early_store, "--draft-vocab", "100000",
                        "--out", tmp_path / "d"], no_weights, "--draft-vocab 100000", str(early_store), "384")


def test_live_drafter_of_another_target(tmp_path, tiny_llama_dir, no_weights):
    drafter = _drafter(tmp_path, target_hidden_size=32, tap_layers=TapLayers(layer_ids=(2, 3, 9)))
    (tmp_path / "p.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    line = _refused_early(["eval", "live", "--drafter", drafter, "--target", tiny_llama_dir, "--input",
                           tmp_path / "p.jsonl", "--device", "cpu"], no_weights,
                          "--drafter", "--target", str(tiny_llama_dir / "config.json"), str(drafter / "config.json"))
    assert "target_hidden_size drafter 32 vs target 64" in line and "[9]" in line


def test_live_pre_formatted_text_prompt(tmp_path, tiny_llama_dir, no_weights):
    (tmp_path / "p.jsonl").write_text('{"text": "hello"}\n')
    _refused_early(["eval", "live", "--drafter", _drafter(tmp_path), "--target", tiny_llama_dir, "--input",
                    tmp_path / "p.jsonl", "--device", "cpu"], no_weights, "p.jsonl:1", "conversation")


def test_engine_drafter_of_another_target(tmp_path, tiny_llama_dir, no_weights, monkeypatch):
    import osprey_train.engines.engine_eval as engine_eval

    monkeypatch.setattr(engine_eval, "find_rig", lambda *a, **k: None)   # this machine has no engine venv
    (tmp_path / "p.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    _refused_early(["eval", "engine", "--drafter", _drafter(tmp_path, vocab_size=500, draft_vocab_size=500),
                    "--target", tiny_llama_dir, "--input", tmp_path / "p.jsonl", "--out", tmp_path / "run"],
                   no_weights, "eval engine", str(tiny_llama_dir / "config.json"), "vocab_size drafter 500 vs target 384")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["acceptance", "sweep", "matrix"])
def test_eval_drafter_of_another_store(tmp_path, early_store, no_weights, command):
    drafter = _drafter(tmp_path, tap_layers=TapLayers(layer_ids=(1, 2, 3)))
    store, named = (["--store", early_store], "store")
    if command == "matrix":
        drafter, store = f"a={drafter}", ["--store", f"s={early_store}", "--out", tmp_path / "m"]
    elif command == "sweep":
        store = [*store, "--out", tmp_path / "s"]
    _refused_early(["eval", command, "--drafter", drafter, *store, "--device", "cpu"], no_weights,
                   named, "config.json", "tap layers drafter [1, 2, 3] vs store [2, 3, 4]")


def test_export_a_drafter_the_format_cannot_serve(tmp_path, no_weights):
    drafter = _drafter(tmp_path, preset="tiny-qwen3")
    _refused_early(["export", "--drafter", drafter, "--format", "vllm", "--out", tmp_path / "e"], no_weights,
                   "--format vllm", "'qwen3'")


def test_demo_prune_more_layers_than_the_source(tmp_path, tiny_llama_dir, no_weights):
    # the demo is a study: the check runs once the source model is on disk, before the first store
    # (which loads the target) and before the prune stage
    _refused_early(["demo", "--quick", "--target", tiny_llama_dir, "--source", tiny_llama_dir, "--prune-layers", "99",
                    "--device", "cpu", "--out", tmp_path / "demo"], no_weights,
                   "--layers 99", str(tiny_llama_dir / "config.json"), "--layers 1..6")
    assert not list((tmp_path / "demo" / "work" / "stages").glob("store-*"))
