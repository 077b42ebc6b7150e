"""A store shared through object storage, end to end over a real S3 protocol endpoint.

Two builder workers in two processes write one ``s3://`` store at the same time (one is
SIGKILLed right before a shard commit and resumed), merges race, then a reader whose credentials cannot write validates,
inspects, distills and evaluates from it — and every result equals the same build on local
disk. Credentials live only in the environment: no file written anywhere and no output
contains them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from osprey_cli.main import cli
from osprey_data.builder import BuildConfig
from osprey_data.builder.runner import run
from osprey_data.store import merge_store, validate_store
from osprey_data.store.fs import StoreFS
from tests.data.conftest import PROMPTS, write_jsonl
from tests.helpers.s3_server import use_identity
from tests.train.evaluation.store_util import make_drafter_dir

ROOT = Path(__file__).resolve().parents[2]


def _objects(url: str) -> dict[str, bytes]:
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    base = url[len("s3://"):]
    return {p[len(base) + 1:]: fs.cat_file(p) for p in fs.find(base)}


def _invoke(args: list[str], outputs: list[str]):
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    outputs.append(res.output)
    return res


def test_two_workers_kill_resume_merge_then_read_only_training_equals_local(
        s3_url, s3_endpoint, tiny_llama_dir, tmp_path, monkeypatch):
    records = [{**p, "id": f"{p['id']}-{k}"} for k in range(2) for p in PROMPTS]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    kw = dict(target=str(tiny_llama_dir), inputs=[str(inputs)], device="cpu", max_new_tokens=6, topk=8,
              batch_size=2, shard_max_tokens=90, progress=False, num_workers=2)
    outputs: list[str] = []

    # The same build on local disk: the reference.
    local = tmp_path / "local-store"
    for k in (0, 1):
        run(BuildConfig(**{**kw, "out": str(local), "worker_index": k}))
    merge_store(str(local))

    # Two workers on the endpoint at once, in two processes: worker 1 in a child process (it dies
    # by SIGKILL right before its 2nd commit record), worker 0 in this one once worker 1 has
    # opened the store (its journal exists), so both are writing at the same time.
    env = {**os.environ, **s3_endpoint.env("writer"), "OSPREY_TEST_KILL_BEFORE_COMMIT": "2"}
    worker1 = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.killable", "tests.cli._build_worker",
         json.dumps({**kw, "out": s3_url, "worker_index": 1})],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    fs = StoreFS(s3_url, read_only=True)
    deadline = time.time() + 120
    while not fs.exists("workers/w001of002.json") and worker1.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    outputs.append(run(BuildConfig(**{**kw, "out": s3_url, "worker_index": 0})).format())
    outputs += worker1.communicate(timeout=300)
    assert worker1.returncode == -9, outputs[-2:]

    objs = _objects(s3_url)
    leftover = "shards/w001of002-000001/"
    assert any(o.startswith(leftover + "tokens.zarr/") for o in objs)  # written in place ...
    assert leftover + "_COMMIT.json" not in objs                       # ... never committed
    report = validate_store(s3_url)
    assert report.ok and any("w001of002-000001" in n for n in report.notes), report.format()

    summary = run(BuildConfig(**{**kw, "out": s3_url, "worker_index": 1}))  # resume worker 1
    outputs.append(summary.format())
    assert summary.already_done > 0 and summary.samples_written > 0
    # the dead shard's objects were deleted and the shard written again: nothing stale left in it
    objs = _objects(s3_url)
    commit = json.loads(objs[leftover + "_COMMIT.json"])
    assert {o[len(leftover):] for o in objs if o.startswith(leftover)} == {*commit["files"], "_COMMIT.json"}

    # Two merges racing, then the command.
    threads = [threading.Thread(target=merge_store, args=(s3_url,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _invoke(["data", "merge", s3_url], outputs).exit_code == 0

    # Byte-identical to the local build: same shards, same commit records (hence same files).
    remote_manifest = json.loads(_objects(s3_url)["manifest.json"])
    assert remote_manifest == json.loads((local / "manifest.json").read_text())
    assert remote_manifest["num_samples"] == len(records)

    # --- a consumer whose credentials cannot write ---------------------------------------------
    use_identity(monkeypatch, s3_endpoint, "reader")
    res = _invoke(["data", "validate", s3_url], outputs)
    assert res.exit_code == 0 and "OK" in res.output, res.output
    remote_info = json.loads(_invoke(["data", "inspect", s3_url, "--json"], outputs).output)
    local_info = json.loads(_invoke(["data", "inspect", str(local), "--json"], outputs).output)
    assert {k: v for k, v in remote_info.items() if k != "url"} == {k: v for k, v in local_info.items() if k != "url"}

    drafter = make_drafter_dir(tmp_path / "drafter", store=local)
    finals, reports = {}, {}
    for name, store in (("remote", s3_url), ("local", str(local))):
        out = tmp_path / f"run-{name}"
        res = _invoke(["train", "distill", "--drafter", str(drafter), "--store", store, "--out", str(out),
                       "--steps", "3", "--ttt-steps", "2", "--tokens-per-batch", "64", "--device", "cpu",
                       "--no-progress", "--attention", "sdpa"], outputs)
        assert res.exit_code == 0, res.output
        finals[name] = load_file(out / "final" / "model.safetensors")
        res = _invoke(["eval", "acceptance", "--drafter", str(out / "final"), "--store", store, "--steps", "3",
                       "--json"], outputs)
        assert res.exit_code == 0, res.output
        reports[name] = {k: v for k, v in json.loads(res.output).items() if k != "store"}
    assert finals["remote"].keys() == finals["local"].keys()
    for key, value in finals["local"].items():  # trained on the same bytes in the same order
        assert torch.equal(finals["remote"][key], value), key
    assert reports["remote"] == reports["local"]
    assert any((tmp_path / "store-cache").rglob("_COMMIT.json"))  # training read through the cache

    # Commands that must write get a clear refusal naming the store, exit 2, before any work.
    res = _invoke(["data", "merge", s3_url], [])
    outputs.append(res.output)
    assert res.exit_code == 2 and s3_url in res.output and "read-only for this process" in res.output, res.output
    res = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input", str(inputs),
                                   "--out", s3_url, "--device", "cpu"])
    outputs.append(res.output)
    assert res.exit_code == 2 and s3_url in res.output and "read-only for this process" in res.output, res.output

    # No credential anywhere: not in the bucket, not in any file written, not in any output.
    use_identity(monkeypatch, s3_endpoint, "writer")
    written = list(_objects(s3_url).values())
    written += [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    for secret in s3_endpoint.secrets():
        assert not any(secret.encode() in blob for blob in written), "a credential was written to disk/bucket"
        assert not any(secret in text for text in outputs), "a credential was printed"
