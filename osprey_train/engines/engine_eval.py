"""``osprey eval engine``: a drafter served by a real engine, its counters beside Osprey's own figures.

One run, on one prompt file:

1. **export**: the drafter is exported with ``osprey export --format vllm|sglang`` into
   ``OUT/export`` (or ``exports`` names exports made elsewhere, each checked against the drafter
   they came from: this is how a broken export, a wrong tap order or ``d2t``, shows up);
2. **offline**: a store is built from the same prompts (greedy, the target's own responses, the
   drafter's taps, in the engine's dtype; ``OUT/store``, reused when it is complete) and our
   offline walk (:mod:`~osprey_train.evaluation.acceptance`) gives every prompt's verify rounds;
3. **live**: our live harness (:mod:`~osprey_train.evaluation.live`) decodes the prompts with the
   drafter (optional), in the engine's dtype;
4. **engine**: one engine process in the engine's venv (:mod:`rig`, :mod:`vllm_driver` or
   :mod:`sglang_driver`) decodes the prompts greedily without speculation, then with each export,
   one request at a time (the engine's per-request counters) and then all together (batched
   speed; SGLang's counters are per request there too);
5. **report** (:mod:`engine_report`): per prompt and in total, the engine's rounds and accepted
   drafts per position against ours, reconciled by the end-of-request overcount
   (:mod:`compare`), greedy outputs identical or not (speculative = plain: the engine is
   lossless, or its acceptance figures check nothing), tokens/s with and without speculation.

Precision: vLLM runs float32 for exact parity. SGLang's CPU engine runs bfloat16 only (its
RMSNorm and AMX attention kernels have no float32), so there the store and the live harness run
in bfloat16 too; bf16 kernels round differently from ours, a near-tie can flip a greedy token,
and a prompt whose outputs differ is reported as not comparable, not as agreement. SGLang's CPU
speculative decoding is moreover not lossless at the rig's snapshot (../shared/wheels/README.md):
the report says so and its acceptance figures then check nothing. On CUDA SGLang runs float32.

Prompts are rendered on our side (:mod:`~osprey_train.evaluation.live_prompts`, the builder's
renderer) and handed to the engine as token ids, so all three see the same ids.

Legend: S draft steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from osprey_data.builder import BuildConfig
from osprey_data.builder.runner import run as build_store
from osprey_data.conversation import iter_inputs, stop_token_ids
from osprey_data.errors import BackendUnavailableError, ConfigError
from osprey_data.store import StoreReader
from osprey_data.target_model import check_compatible, resolve_precision
from osprey_train.drafters.registry import drafter_spec
from osprey_train.drafters.spec import DrafterSpec
from osprey_train.engines.compare import PromptComparison, first_difference, reconcile
from osprey_train.engines.engine_report import EngineReport, ExportSummary, summarize_export
from osprey_train.engines.rig import ENGINES, find_rig, run_driver
from osprey_train.evaluation.acceptance import acceptance_walk, has_verify_round, offline_drafts
from osprey_train.evaluation.early_checks import check_drafter_on_target
from osprey_train.evaluation.live import LiveConfig
from osprey_train.evaluation.live import run as run_live
from osprey_train.evaluation.live_prompts import LivePrompt, load_prompts
from osprey_train.export import ExportConfig
from osprey_train.export import run as run_export
from osprey_train.models import load_drafter

__all__ = ["EngineEvalConfig", "run", "engine_env", "sglang_env", "sglang_engine_kwargs", "cpu_has_amx",
           "SGLANG_CPU_NEEDS_AMX", "DTYPES", "DRIVERS"]

DTYPES = ("auto", "float32", "bfloat16")
DRIVERS = {"vllm": "osprey_train.engines.vllm_driver", "sglang": "osprey_train.engines.sglang_driver"}
# Seen on an AMD EPYC (AVX-512, no AMX): SGLang replaces the intel_amx attention backend asked for
# with torch_native, and its EAGLE worker then refuses to start ("EAGLE is not supported in decode
# attention backend torch_native"), after a minute of loading.
SGLANG_CPU_NEEDS_AMX = ("SGLang's CPU engine speculates only with its intel_amx attention backend, which needs a CPU "
                        "with Intel AMX tiles; this CPU has none (torch.cpu._is_amx_tile_supported() is False), so "
                        "SGLang would fall back to torch_native attention, which refuses EAGLE drafters")


def cpu_has_amx() -> bool:
    """Whether this CPU has Intel AMX tiles, the test SGLang applies before its intel_amx backend."""
    return bool(torch.cpu._is_amx_tile_supported())


@dataclass(kw_only=True)
class EngineEvalConfig:
    """Options of ``osprey eval engine``."""

    engine: str
    """Engine: 'vllm' or 'sglang'."""
    drafter: Path
    """Drafter folder (Osprey or EAGLE-3, ``save_drafter`` output)."""
    target: str
    """Target HF folder (the drafter's target), as the engine loads it."""
    inputs: tuple[str, ...]
    """Prompt files (builder input formats); every prompt is decoded."""
    out: Path
    """Folder for the export, the store, the engine's log and the report (report.md, report.json)."""
    steps: int = 3
    """Draft tokens per verify round (vLLM's num_speculative_tokens)."""
    max_new_tokens: int = 64
    """Generated tokens per prompt at most (a stop token ends earlier)."""
    exports: tuple[Path, ...] = ()
    """Exports of ``drafter`` (in the engine's format) made elsewhere to check; empty = export now."""
    dtype: str = "auto"
    """Engine dtype, also of our store and live harness: float32 for exact parity, bfloat16 for speed;
    auto = float32, except bfloat16 for SGLang on CPU (its only dtype there)."""
    device: str = "auto"
    """SGLang's device: cpu (its CPU engine), cuda, or auto (cuda where present). vLLM: its venv's build."""
    threads: int = 1
    """CPU threads of the engine and of our own decoding."""
    live: bool = True
    """Also decode with our live harness."""
    venv: str | None = None
    """The engine's venv (default ``$OSPREY_VLLM_VENV`` or ``.venv-vllm``, ``$OSPREY_SGLANG_VENV`` or
    ``.venv-sglang``)."""
    max_model_len: int = 2048
    """Engine context length (prompt + response)."""
    timeout_s: float = 3600.0
    """Engine run limit."""
    progress: bool = True
    """Print what each phase is doing."""
    store_overrides: dict = field(default_factory=dict)
    """Extra BuildConfig fields for the offline store (tests: smaller top-k, batch size)."""

    def __post_init__(self) -> None:
        self.drafter, self.out = Path(self.drafter), Path(self.out)
        self.exports = tuple(Path(p) for p in self.exports)
        if isinstance(self.inputs, str):
            self.inputs = (self.inputs,)
        self.inputs = tuple(str(p) for p in self.inputs)
        if self.engine not in ENGINES:
            raise ConfigError(f"eval engine: --engine must be one of {sorted(ENGINES)}, got {self.engine!r}")
        if not self.inputs:
            raise ConfigError("eval engine: give at least one --input prompt file")
        for path in self.inputs:
            if not Path(path).exists():
                raise ConfigError(f"eval engine: --input {path!r} does not exist")
        if not self.drafter.is_dir():
            raise ConfigError(f"eval engine: drafter folder {self.drafter} does not exist")
        for path in self.exports:
            if not (path / "config.json").is_file():
                raise ConfigError(f"eval engine: --export {path} is not an export folder (no config.json)")
        if not Path(self.target).is_dir():
            raise ConfigError(f"eval engine: --target {self.target!r} must be a local HF folder (the engine "
                              "loads the same weights)")
        if self.steps < 1:
            raise ConfigError(f"eval engine: --steps must be >= 1, got {self.steps}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"eval engine: --max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"eval engine: --dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"eval engine: --device must be auto, cpu or cuda, got {self.device!r}")
        if self.device == "auto":
            self.device = "cuda" if self.engine == "sglang" and torch.cuda.is_available() else "cpu"
        sglang_cpu = self.engine == "sglang" and self.device == "cpu"
        if self.dtype == "auto":
            self.dtype = "bfloat16" if sglang_cpu else "float32"
        if sglang_cpu and self.dtype != "bfloat16":
            raise ConfigError(f"eval engine: SGLang's CPU engine runs bfloat16 only (its RMSNorm and AMX attention "
                              f"kernels have no float32), got --dtype {self.dtype}; pass --dtype bfloat16 or auto")
        if sglang_cpu and not cpu_has_amx():
            raise BackendUnavailableError(f"eval engine: {SGLANG_CPU_NEEDS_AMX}. Run it on a CPU with AMX (Intel "
                                          "Xeon 4th generation or newer), on a GPU (--device cuda), or with "
                                          "--engine vllm, whose CPU build serves every drafter here")
        if self.threads < 1:
            raise ConfigError(f"eval engine: --threads must be >= 1, got {self.threads}")


def engine_env(rig_venv: Path, threads: int) -> dict[str, str]:
    """The engine process's settings: the thread budget, vLLM's bundled OpenMP, one process.

    ``LD_PRELOAD`` of vLLM's bundled ``libiomp5.so`` is what vLLM advises on CPU; the engine core
    and the worker run inside the driver process (no extra spawned interpreters: each would import
    torch and vLLM again, minutes on a busy 2-core machine); no core pinning, the machine is shared.
    """
    env = {"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    iomp = rig_venv / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = " ".join(p for p in (os.environ.get("LD_PRELOAD"), str(iomp.resolve())) if p)
    return env


def sglang_env(threads: int, arch: str | None, device: str) -> dict[str, str]:
    """SGLang's process settings: the CPU engine and its cores, and what serving the drafter ``arch``
    needs (its registry entry's ``serving_env``: for Osprey, ``SGLANG_EXTERNAL_MODEL_PACKAGE``, where
    SGLang finds our external class).

    ``SGLANG_CPU_OMP_THREADS_BIND`` gives the cores of the engine's one rank (``0-N``); unset,
    SGLang binds a whole NUMA node.
    """
    env = {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    if device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    if arch is not None:
        env.update(drafter_spec(arch).serving_env)
    return env


def sglang_engine_kwargs(device: str, prompts: list[LivePrompt], max_new_tokens: int) -> dict:
    """``sglang.Engine`` arguments beside the model and the dtype.

    CPU: the AMX attention backend, no overlap scheduler (the rig's README), a KV pool for all
    prompts at once (with a core binding SGLang cannot size it from a NUMA node's memory). CUDA:
    triton attention (FlashInfer has no float32), no CUDA graphs, a small memory share. Both: no
    radix cache, so each request is prefilled whole, as in our runs (a cached prefix would be
    computed by another kernel call and can round differently).
    """
    kwargs: dict = {"disable_radix_cache": True, "log_level": "warning"}
    if device == "cpu":
        tokens = sum(len(p.prompt_ids) + max_new_tokens for p in prompts)
        kwargs.update(device="cpu", attention_backend="intel_amx", disable_overlap_schedule=True,
                      max_total_tokens=max(4096, 2 * tokens))
    else:
        kwargs.update(attention_backend="triton", disable_cuda_graph=True, mem_fraction_static=0.3)
    return kwargs


def _log(config: EngineEvalConfig, text: str) -> None:
    if config.progress:
        print(f"[eval engine] {text}", flush=True)


def _offline(config: EngineEvalConfig, drafter, prompts: list[LivePrompt]) -> dict[str, dict]:
    """Per prompt id: the store's response ids and our offline walk, from a store of the same prompts."""
    store = config.out / "store"
    taps = tuple(drafter.config.tap_layers.layer_ids)
    build = BuildConfig(target=config.target, inputs=config.inputs, out=str(store), max_new_tokens=config.max_new_tokens,
                        temperature=0.0, layers=taps, last_turn_only=True, dtype=config.dtype, device="cpu",
                        progress=config.progress, **{"topk": 8, "batch_size": 4, **config.store_overrides})
    build_store(build)
    reader = StoreReader(str(store))
    check_compatible(drafter.config, reader.header.target, taps=reader.header.taps,
                     where=f"eval engine: drafter {config.drafter} on store {store}")
    dtype = next(drafter.parameters()).dtype
    draft_at_every_position = offline_drafts(drafter)
    wanted = {p.sample_id for p in prompts}
    out: dict[str, dict] = {}
    for i in range(len(reader)):
        s = reader.sample(i, as_torch=True)
        if s.sample_id not in wanted:
            continue
        ids = s.token_ids.tolist()
        walk = []
        if has_verify_round(s):
            drafts = draft_at_every_position(drafter, s.token_ids, s.hidden_TLD.to(dtype), config.steps).cpu()
            walk = acceptance_walk(ids, s.prompt_length, drafts.tolist())
        out[s.sample_id] = {"prompt_ids": ids[:s.prompt_length], "response_ids": ids[s.prompt_length:], "walk": walk}
    missing = wanted - set(out)
    if missing:
        raise ConfigError(f"eval engine: the store {store} lacks prompts {sorted(missing)[:3]}; remove it and rerun")
    return out


def _exports(config: EngineEvalConfig) -> list[Path]:
    if config.exports:
        return list(config.exports)
    out = config.out / "export"
    _log(config, f"exporting {config.drafter} -> {out} (--format {config.engine}, {config.dtype})")
    run_export(ExportConfig(drafter=config.drafter, format=config.engine, out=out, dtype=config.dtype,
                            overwrite=True))
    return [out]


def run(config: EngineEvalConfig) -> EngineReport:
    """Export, offline walk, live decoding, the engine's runs, and the report (written to ``out``)."""
    # a missing venv fails before any work (SGLang probed with the run's settings: CPU engine or not)
    probe = sglang_env(config.threads, None, config.device) if config.engine == "sglang" else None
    rig = find_rig(config.engine, config.venv, env=probe)
    # the drafter's sizes against the target's config.json: before --out is made or any model loads
    check_drafter_on_target(config.drafter, config.target, command="eval engine")
    config.out.mkdir(parents=True, exist_ok=True)
    list(iter_inputs(config.inputs))  # a malformed prompt file fails before any model loads
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(config.target)
    try:
        generation = GenerationConfig.from_pretrained(config.target)
    except OSError:
        generation = None
    stops = sorted(stop_token_ids(tokenizer, generation))
    prompts = load_prompts(config.inputs, tokenizer)
    # the engine's precision: the offline walk drafts in it (the store's taps are in it too)
    drafter = resolve_precision(config.dtype, "cpu").prepare(load_drafter(config.drafter).eval())
    exports = _exports(config)
    before = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        _log(config, f"offline: store of the {len(prompts)} prompts, walk with S={config.steps}")
        offline = _offline(config, drafter, prompts)
        live = None
        if config.live:
            _log(config, "live: our harness decodes the prompts with the drafter")
            report = run_live(LiveConfig(drafter=str(config.drafter), target=config.target, inputs=config.inputs,
                                         steps=config.steps, max_new_tokens=config.max_new_tokens, device="cpu",
                                         baseline=False, threads=config.threads, progress=config.progress,
                                         # the engine's precision: "auto" would pick bf16 on an AMX CPU
                                         precision=config.dtype))
            live = {s["id"]: s for s in report.samples}
    finally:
        torch.set_num_threads(before)
    for p in prompts:
        if offline[p.sample_id]["prompt_ids"] != p.prompt_ids:
            raise ConfigError(f"eval engine: prompt {p.sample_id}: the store's prompt ids differ from the rendered "
                              "prompt; remove OUT/store (built from other prompts?) and rerun")
    runs = [{"name": "plain", "speculative": None}]
    runs += [{"name": f"spec{i}", "speculative": _speculative(config, path, drafter_spec(drafter.config.arch))}
             for i, path in enumerate(exports)]
    if config.engine == "vllm":
        engine_kwargs, env = {"distributed_executor_backend": "uni"}, engine_env(rig.venv, config.threads)
    else:
        engine_kwargs = sglang_engine_kwargs(config.device, prompts, config.max_new_tokens)
        env = sglang_env(config.threads, drafter.config.arch, config.device)
    request = {"target": str(Path(config.target).resolve()), "dtype": config.dtype, "threads": config.threads,
               "max_model_len": config.max_model_len, "max_tokens": config.max_new_tokens, "stop_token_ids": stops,
               "prompts": [{"id": p.sample_id, "prompt_ids": p.prompt_ids} for p in prompts], "runs": runs,
               "engine_kwargs": engine_kwargs}
    _log(config, f"{config.engine}: plain + {len(exports)} speculative run(s) in {rig.venv}")
    result = run_driver(rig, DRIVERS[config.engine], request, config.out / "engine", env=env,
                        timeout_s=config.timeout_s, log=(lambda t: _log(config, t)))
    plain = result["runs"][0]
    summaries = [_compare_export(config, path, run, plain, offline, live, prompts)
                 for path, run in zip(exports, result["runs"][1:])]
    version = result.get("engine_version") or result.get("vllm_version", "?")
    report = EngineReport(engine=config.engine, engine_version=version,
                          torch_version=result.get("torch_version", "?"), target=config.target,
                          drafter=str(config.drafter), arch=drafter.config.arch, steps=config.steps,
                          dtype=config.dtype, threads=config.threads, max_new_tokens=config.max_new_tokens,
                          num_prompts=len(prompts), plain=_speed(plain), exports=summaries,
                          engine_wall_s=result["wall_s"])
    report.write(config.out)
    return report


def _speculative(config: EngineEvalConfig, export: Path, spec: DrafterSpec) -> dict:
    """One export's speculative settings, in the engine's own names (greedy, S drafts per round), with the
    method the architecture names for that engine."""
    if config.engine == "vllm":
        return {"model": str(export.resolve()), "method": spec.vllm_method, "num_speculative_tokens": config.steps}
    return {"speculative_algorithm": spec.sglang_algorithm, "speculative_draft_model_path": str(export.resolve()),
            "speculative_num_steps": config.steps, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": config.steps + 1}


def _speed(run: dict) -> dict:
    tokens = sum(len(s["output_ids"]) for s in run["samples"])
    seconds = sum(s["seconds"] for s in run["samples"])
    return {"load_s": run["load_s"], "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            "batched_tokens_per_s": run["batched"]["tokens"] / run["batched"]["seconds"] if run["batched"]["seconds"]
            else 0.0}


def _rows(config: EngineEvalConfig, samples: list[dict], plain: list[dict], offline: dict, live: dict | None,
          prompts: list[LivePrompt]) -> list[PromptComparison]:
    """Each prompt's engine counters reconciled with our walk, and its outputs compared.

    ``spec_vs_plain`` is the engine's losslessness (speculative output = its own plain output);
    ``plain_vs_store`` the engine's plain output against the store's (transformers, our dtype).
    """
    rows: list[PromptComparison] = []
    plain_by_id = {s["id"]: s for s in plain}
    for p, sample in zip(prompts, samples):
        assert sample["id"] == p.sample_id
        ours = offline[p.sample_id]
        spec_ids, plain_ids = sample["output_ids"], plain_by_id[p.sample_id]["output_ids"]
        identical = {"spec_vs_plain": spec_ids == plain_ids, "plain_vs_store": plain_ids == ours["response_ids"]}
        live_acc = None
        if live is not None:
            live_acc = live[p.sample_id]["accepted"]
            identical["live_vs_plain"] = live[p.sample_id].get("output_ids") == plain_ids
        row = reconcile(sample_id=p.sample_id, domain=p.domain, steps=config.steps, tokens=len(spec_ids),
                        engine=sample, walk=ours["walk"], live_accepted=live_acc, identical=identical)
        notes = [row.why]
        if not identical["spec_vs_plain"]:
            notes.append(f"NOT LOSSLESS: speculative output leaves the engine's plain output at token "
                         f"{first_difference(spec_ids, plain_ids)}")
        if not identical["plain_vs_store"]:
            notes.append(f"engine output leaves the store's (transformers) at token "
                         f"{first_difference(plain_ids, ours['response_ids'])}")
        row.why = "; ".join(w for w in notes if w)
        rows.append(row)
    return rows


def _compare_export(config: EngineEvalConfig, path: Path, run: dict, plain: dict, offline: dict, live: dict | None,
                    prompts: list[LivePrompt]) -> ExportSummary:
    rows = _rows(config, run["samples"], plain["samples"], offline, live, prompts)
    batched = None
    if "samples" in run["batched"] and "samples" in plain["batched"]:  # per-request counters when batched (SGLang)
        batched = _rows(config, run["batched"]["samples"], plain["batched"]["samples"], offline, None, prompts)
    return summarize_export(str(path), rows, _speed(run), engine=config.engine, batched_rows=batched)
