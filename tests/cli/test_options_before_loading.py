"""Every option is checked before any model loads (issue 25, "What to build" 4).

Each command runs in-process with one malformed option against inputs that name nothing real (a
target, drafter or store that does not exist, so any attempt to load would fail with another
message). The run must exit 2 with one ``error:`` line that names the bad option, print no
traceback, and leave no output folder behind.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli

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
