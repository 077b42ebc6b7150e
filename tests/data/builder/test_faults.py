"""Faults and bad input around ``osprey data build``: signals, foreign --out folders, options that
can be checked before the target loads, progress during generation, a full disk, deep JSON.

Each test reproduces one case of issue #12 and fails on the code before it was fixed.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.builder.runner import run
from osprey_data.builder import runner as runner_module
from osprey_data.builder.backends import hf as hf_module
from osprey_data.errors import ConfigError, InputError, Interrupted, ManifestMismatchError
from osprey_data.store import StoreReader, validate_store
from tests.data.builder.test_runner import assert_same_samples
from tests.data.builder.test_runner import config as _config
from tests.data.conftest import PROMPTS, write_jsonl

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture()
def no_model_loads(monkeypatch):
    """Fail the test if the target's weights are ever loaded."""
    def refuse(*args, **kwargs):
        raise AssertionError("the target model was loaded before a cheap check failed")

    monkeypatch.setattr(hf_module, "load_hf_target", refuse)


# --- item 2: SIGINT / SIGTERM keep every finished sample -------------------------------------

_SLOW_BUILD = """
import sys, time, torch
torch.set_num_threads(1)
from osprey_cli.main import main
from osprey_data.builder.backends import hf
calls = sys.argv[1]
original = hf.HFBackend.features
def slow(self, *a, **k):  # one call per batch, after its generation: marks batches as they finish
    with open(calls, "a") as f:
        f.write("x")
    time.sleep(0.3)
    return original(self, *a, **k)
hf.HFBackend.features = slow
main(sys.argv[2:])
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_commits_every_finished_sample(tiny_llama_dir, tmp_path, sig):
    seed = random.randrange(10**6)
    random.seed(seed)
    after = random.randint(2, 4)   # batches whose features started: a random point of the build
    records = [{**p, "id": f"{p['id']}-{k}"} for k in range(2) for p in PROMPTS]  # 12 samples, 6 batches
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    args = ["data", "build", "--target", str(tiny_llama_dir), "--input", str(inputs), "--device", "cpu",
            "--max-new-tokens", "6", "--topk", "8", "--batch-size", "2"]
    store, calls = tmp_path / "store", tmp_path / "calls"
    script = tmp_path / "slow_build.py"
    script.write_text(_SLOW_BUILD)
    # the default shard size (65,536 tokens) holds the whole build: before the fix nothing was kept
    proc = subprocess.Popen([sys.executable, str(script), str(calls), *args, "--out", str(store)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if calls.exists() and len(calls.read_text()) >= after:  # batches 1 .. after-1 handed to the writer
            break
        time.sleep(0.02)
    time.sleep(random.uniform(0, 0.4))   # in the batch's slowed prefill or past it, into the next one
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert "Traceback" not in err
    kept = len(StoreReader(str(store)))
    assert 2 * (after - 1) <= kept < len(records), (seed, err)
    assert f"interrupted by {signal.Signals(sig).name}: {kept} finished sample(s) of this run committed" in err
    assert "Rerun the same command to resume" in err
    assert validate_store(str(store)).problems == []
    # the rerun redoes only what was not committed, and ends where an uninterrupted build ends
    summary = run(_config(tiny_llama_dir, [inputs], store))
    assert (summary.already_done, summary.samples_written) == (kept, len(records) - kept)
    run(_config(tiny_llama_dir, [inputs], tmp_path / "ref"))
    assert_same_samples(tmp_path / "ref", store, exact=True)


def test_sigterm_mid_generation_keeps_finished_samples(tiny_llama_dir, tmp_path, monkeypatch):
    records = [{**p, "id": f"{p['id']}-{k}"} for k in range(2) for p in PROMPTS]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    original, batches = hf_module.HFBackend.generate, []

    def generate(self, requests, *args, **kwargs):
        batches.append(len(requests))
        if len(batches) == 3:  # a real SIGTERM to this process while the third batch generates
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, requests, *args, **kwargs)

    monkeypatch.setattr(hf_module.HFBackend, "generate", generate)
    with pytest.raises(Interrupted, match=r"interrupted by SIGTERM: 4 finished sample\(s\) of this run committed") as exc:
        run(_config(tiny_llama_dir, [inputs], tmp_path / "s", regenerate=True, last_turn_only=True))
    assert exc.value.exit_code == 143
    assert len(StoreReader(str(tmp_path / "s"))) == 4 and validate_store(str(tmp_path / "s")).problems == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_shard_max_tokens_is_an_option(tiny_llama_dir, prompts_file, tmp_path):
    out = tmp_path / "s"
    result = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input", str(prompts_file),
                                      "--out", str(out), "--device", "cpu", "--max-new-tokens", "4", "--topk", "4",
                                      "--shard-max-tokens", "40"])
    assert result.exit_code == 0, result.output
    assert StoreReader(str(out)).num_shards >= 3
    result = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input", str(prompts_file),
                                      "--out", str(tmp_path / "t"), "--shard-max-tokens", "0"])
    assert result.exit_code == 2 and "--shard-max-tokens must be >= 1" in result.output


# --- item 4: a folder that is not a store ------------------------------------------------------

def test_non_store_out_is_refused_unless_overwrite(tiny_llama_dir, prompts_file, tmp_path, no_model_loads):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("precious")
    with pytest.raises(ConfigError, match="not an Osprey store.*--overwrite"):
        run(_config(tiny_llama_dir, [prompts_file], folder))
    a_file = tmp_path / "file.bin"
    a_file.write_bytes(b"x")
    with pytest.raises(ConfigError, match="is a file"):
        run(_config(tiny_llama_dir, [prompts_file], a_file))
    assert (folder / "notes.txt").read_text() == "precious" and a_file.read_bytes() == b"x"
    with pytest.raises(ConfigError, match="--overwrite cannot be combined with --num-workers"):
        _config(tiny_llama_dir, [prompts_file], folder, overwrite=True, num_workers=2, worker_index=0)


def test_overwrite_replaces_the_folder_and_empty_folders_are_fine(tiny_llama_dir, prompts_file, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("old")
    run(_config(tiny_llama_dir, [prompts_file], folder, overwrite=True, limit=2))
    assert not (folder / "notes.txt").exists() and len(StoreReader(str(folder))) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine.old")]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(_config(tiny_llama_dir, [prompts_file], empty, limit=1)).samples_written == 1
    # --overwrite of a store with other settings starts afresh instead of refusing
    summary = run(_config(tiny_llama_dir, [prompts_file], folder, overwrite=True, topk=4, limit=3))
    assert summary.already_done == 0 and StoreReader(str(folder)).header.topk == 4


# --- item 5: cheap checks before the target loads ----------------------------------------------

def test_layers_beyond_the_target_fail_before_loading(tiny_llama_dir, prompts_file, tmp_path, no_model_loads):
    with pytest.raises(ConfigError, match=r"--taps: .*\[99\] outside 1..5 for a target of 6 layers"):
        run(_config(tiny_llama_dir, [prompts_file], tmp_path / "s", layers=(2, 3, 99)))
    result = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input", str(prompts_file),
                                      "--out", str(tmp_path / "s"), "--taps", "2,15,99"])
    assert result.exit_code == 2 and "[15, 99] outside 1..5 for a target of 6 layers" in result.output
    assert not (tmp_path / "s").exists()


def test_changed_settings_are_refused_before_loading(tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    store = tmp_path / "s"
    run(_config(tiny_llama_dir, [prompts_file], store, limit=1))
    monkeypatch.setattr(hf_module, "load_hf_target", lambda *a, **k: pytest.fail("target loaded"))
    with pytest.raises(ManifestMismatchError, match=r"--topk differs \(store: 8, this run: 4\)"):
        run(_config(tiny_llama_dir, [prompts_file], store, topk=4))


# --- item 6: progress per sample while generating --------------------------------------------

class _RecordingBar:
    """Stands in for tqdm: notes when each update and postfix happens."""

    instances: list["_RecordingBar"] = []

    def __init__(self, *args, total=None, desc="", **kwargs):
        self.total, self.desc, self.updates, self.postfix = total, desc, [], []
        _RecordingBar.instances.append(self)

    def update(self, n=1):
        self.updates.append(_generating["now"])

    def set_postfix_str(self, text, refresh=True):
        self.postfix.append((_generating["now"], text))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_generating = {"now": False}


def test_the_bar_counts_saved_samples_and_the_batch_moves_in_its_postfix(tiny_llama_dir, tmp_path, monkeypatch):
    """Issue #25: the bar showed 6/17 while Ctrl-C kept 0 samples (it counted generated samples of
    a batch not yet handed to the writer). Now it counts saved samples and says so; generation
    inside a batch shows in the postfix."""
    original = hf_module.HFBackend.generate

    def generate(self, *args, **kwargs):
        _generating["now"] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            _generating["now"] = False

    monkeypatch.setattr(hf_module.HFBackend, "generate", generate)
    monkeypatch.setattr(runner_module, "tqdm", _RecordingBar)
    _RecordingBar.instances.clear()
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"Say something about {i}."}
                                                  for i in range(4)])
    # different budgets finish rows at different steps: the postfix must move inside generate()
    run(_config(tiny_llama_dir, [prompts], tmp_path / "s", batch_size=4, max_new_tokens=8, progress=True))
    bar = _RecordingBar.instances[-1]
    assert bar.total == 4 and len(bar.updates) == 4 and "samples saved" in bar.desc
    assert not any(bar.updates), "the bar counted a sample before it reached the writer"
    during = [text for now, text in bar.postfix if now]
    assert any("batch: 1/4 generated, not yet saved" in t for t in during), bar.postfix
    assert "tok/s" in during[-1]


# --- item 14: a full disk while the worker journal is written --------------------------------

def test_full_disk_writing_the_journal_is_one_line_and_leaves_no_temp_file(tiny_llama_dir, prompts_file,
                                                                            tmp_path, monkeypatch):
    store = tmp_path / "s"
    real_open = os.open
    journal_fds: set[int] = set()

    def tracking_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if "workers" in str(path) and ".tmp-" in str(path):
            journal_fds.add(fd)
        return fd

    class FullDisk:  # a journal temp file on a disk that is full
        def __init__(self, f):
            self._f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()
            return False

    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return FullDisk(f) if fd in journal_fds else f

    monkeypatch.setattr(os, "open", tracking_open)
    monkeypatch.setattr(os, "fdopen", fdopen)
    args = ["data", "build", "--target", str(tiny_llama_dir), "--input", str(prompts_file), "--out", str(store),
            "--device", "cpu", "--max-new-tokens", "4", "--topk", "4"]
    result = CliRunner().invoke(cli, args)
    monkeypatch.undo()
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "workers" in lines[0] and "No space left on device" in lines[0], result.output
    assert "Traceback" not in result.output
    leftovers = [p.name for p in (store / "workers").iterdir() if ".tmp-" in p.name]
    assert leftovers == []
    again = run(_config(tiny_llama_dir, [prompts_file], store, max_new_tokens=4, topk=4))  # resumes
    assert again.already_done + again.samples_written == len(PROMPTS)
    assert validate_store(str(store)).problems == [] and len(StoreReader(str(store))) == len(PROMPTS)


# --- item 14: deeply nested JSON in an input line -----------------------------------------------

def test_deeply_nested_input_line_is_an_error_or_a_counted_skip(tiny_llama_dir, prompts_file, tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text(json.dumps({"id": "ok", "prompt": "hello"}) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputError, match=r"deep.jsonl:2: not valid JSON \(nested deeper than 100 levels"):
        run(_config(tiny_llama_dir, [deep], tmp_path / "raise"))
    summary = run(_config(tiny_llama_dir, [deep], tmp_path / "skip", on_error="skip"))
    assert summary.samples_written == 1 and summary.skipped == {"input_error": 1}
