"""vLLM backend: generation and feature capture by vLLM itself, in a process of the vLLM venv.

vLLM pins its own torch and transformers, so it lives in a venv of its own
(``engines/setup_vllm.sh`` makes ``.venv-vllm``); the builder runs in ours and drives one
long-lived engine process there (``vllm_rig/driver.py``, started by path: it needs nothing of
Osprey installed in that venv) over JSON lines, with the features handed over as one safetensors
file per sequence in a private work folder that the backend deletes.

What vLLM computes (read from vLLM 0.32's source and checked by the contract test):

* generation: ``LLM.generate`` on token ids (the chat template, the stop ids and the loss mask
  stay ours), greedy;
* taps: the ``extract_hidden_states`` speculative method with
  ``eagle_aux_hidden_state_layer_ids`` = our taps. vLLM's aux id i is the residual stream entering
  decoder layer i (``hidden + residual``), which is HF's ``hidden_states[i]``, our convention: no
  conversion. A KV connector writes each request's stacked states to a file
  (``vllm_rig/osprey_sync_connector.py``: vLLM's example connector with a synchronous write,
  since its asynchronous one needs CUDA streams);
* top-k: ``prompt_logprobs=K`` (full softmax of the raw logits, ranked), with ``max_logprobs = K``,
  plus the log-probs of a one-token completion for the last position.

Captures are a second, prefill-only pass over each finished sequence (``max_tokens=1``), not the
states recorded while generating: the runner renders the final sequence (closing template
tokens, later turns) only after generation. Prefix caching is off so that every position is
computed in that pass.

Refused: sampled regeneration (``--temperature > 0``; see :data:`SAMPLING_REFUSED`, measured),
``--final-hidden`` (vLLM's last aux state is before the final norm) and GGUF
targets. Tap ids are ``1..L-1`` (:class:`~osprey_data.target_model.TapLayers`), so the post-norm
``hidden_states[L]`` never has to be captured.

Legend: T tokens, L taps, D hidden, K top-k.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from safetensors.torch import load_file

from osprey_data.builder.backends.base import (
    GenerationRequest, GenerationResult, SamplingParams, SequenceFeatures, StepCallback, TargetBackend,
)
from osprey_data.conversation.chat_template import stop_token_ids
from osprey_data.errors import BackendUnavailableError, ConfigError
from osprey_data.target_model import (check_target_exists, default_tap_layers, identify_target, resolve_device,
                                      resolve_precision, text_config)

if TYPE_CHECKING:  # pragma: no cover
    from osprey_data.builder.config import BuildConfig

__all__ = ["VLLMBackend", "find_vllm_python", "check_vllm_venv", "vllm_available", "engine_env", "DRIVER", "VENV_ENV", "SAMPLING_REFUSED"]

VENV_ENV = "OSPREY_VLLM_VENV"
DEFAULT_VENV = ".venv-vllm"
DRIVER = Path(__file__).resolve().parent / "vllm_rig" / "driver.py"
_SETUP = "engines/setup_vllm.sh"
_LOG_TAIL = 200
# Measured (vLLM 0.32, CPU; engines/vllm_capture_sampling.py): with the extract_hidden_states
# method on, temperature sampling does not follow the target's distribution (the drafted token, the
# one just sampled, is accepted far too often: 59 % of tokens repeat the previous one, 0 % in the
# plain engine from the same seeds), and the same seeds give other tokens on a rerun. Greedy is
# exact (a draft is accepted only when it is the argmax).
SAMPLING_REFUSED = ("--backend vllm regenerates greedily only (--temperature 0): vLLM 0.32's capture path "
                    "(extract_hidden_states) does not sample from the target's distribution; use --temperature 0, "
                    "--no-regenerate, or --backend hf for sampled responses")


def find_vllm_python(venv: str | os.PathLike | None = None) -> Path:
    """The vLLM venv's interpreter: ``venv``, else ``$OSPREY_VLLM_VENV``, else ``./.venv-vllm``."""
    where = Path(venv or os.environ.get(VENV_ENV) or DEFAULT_VENV).expanduser().absolute()
    python = where / "bin" / "python"
    if not python.is_file():
        raise BackendUnavailableError(f"--backend vllm needs vLLM's venv: {where} has no bin/python; create it with "
                                      f"`{_SETUP}` in the Osprey checkout, or set {VENV_ENV} to one")
    return python


def check_vllm_venv(venv: str | os.PathLike | None = None, *, timeout: float = 300.0) -> Path:
    """The vLLM venv's interpreter, once ``import vllm`` has succeeded in it (a few seconds); else
    :class:`BackendUnavailableError` naming the venv, the import's own error and the way out.

    ``osprey data build --backend vllm`` runs it before the target loads: a venv without vLLM (or
    with a vLLM that cannot import) would otherwise pass and fail only at engine start."""
    python = find_vllm_python(venv)
    where = python.parent.parent
    try:
        probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True,
                               timeout=timeout, env=_clean_env({}))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailableError(f"--backend vllm: could not run {python} to import vLLM ({exc}); repair the "
                                      f"venv with `{_SETUP}`, or set {VENV_ENV} to a working one") from None
    if probe.returncode != 0:
        lines = [x.strip() for x in (probe.stderr or probe.stdout).splitlines() if x.strip()]
        cause = lines[-1] if lines else f"exit status {probe.returncode}"
        raise BackendUnavailableError(f"--backend vllm: `import vllm` fails in the venv {where} ({cause}); install "
                                      f"vLLM there with `{_SETUP}`, or set {VENV_ENV} to a venv that has it")
    return python


def vllm_available(venv: str | os.PathLike | None = None) -> bool:
    """True when the vLLM venv exists and holds a ``vllm`` package (found, not imported: seconds)."""
    try:
        python = find_vllm_python(venv)
    except BackendUnavailableError:
        return False
    probe = subprocess.run([str(python), "-c", "import importlib.util, sys; "
                            "sys.exit(importlib.util.find_spec('vllm') is None)"], env=_clean_env({}))
    return probe.returncode == 0


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    """Our environment without what would leak our venv into vLLM's, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


def engine_env(python: Path, threads: int, device: str = "cpu") -> dict[str, str]:
    """The engine process's settings: its thread budget, one process, vLLM's bundled OpenMP, offline.

    The engine core runs inside the driver (no extra interpreter importing torch and vLLM again,
    minutes on a busy small machine); no core pinning on a shared machine; ``LD_PRELOAD`` of the
    venv's ``libiomp5.so`` is what vLLM advises on CPU.
    """
    env = {"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           # GiB of KV cache (taps included) on CPU; a set value is the user's choice
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    if device.startswith("cuda:"):  # vLLM takes the first visible GPU
        env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = " ".join(p for p in (os.environ.get("LD_PRELOAD"), str(iomp.resolve())) if p)
    return env


def log_cause(log_path: Path) -> str:
    """The engine log's last exception line (vLLM prefixes worker lines with ``[rank0]: ``)."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-_LOG_TAIL:]
    except FileNotFoundError:
        return "no engine log"
    for line in reversed(lines):
        text = line.split("]: ")[-1].strip()
        head = text.split(":")[0]
        if head.endswith(("Error", "Exception", "Exit", "Interrupt")) and " " not in head:
            return text
    return (lines[-1].strip() if lines else "the engine log is empty") or "?"


def _load_meta_identity(target: str, tokenizer: Any, dtype: Any):
    """The target's identity, generation config and position limit from its config, without its
    weights (a meta-device model)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(target)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    limit = getattr(text_config(cfg), "max_position_embeddings", None)
    return identify_target(model, tokenizer, target), getattr(model, "generation_config", None), limit


class VLLMBackend(TargetBackend):
    """Generation and features from one vLLM engine in the vLLM venv."""

    name = "vllm"

    def __init__(self, config: "BuildConfig") -> None:
        from transformers import AutoTokenizer, GenerationConfig

        if config.gguf_file is not None or config.target.endswith(".gguf"):
            raise ConfigError("--backend vllm loads HF folders only; convert the GGUF model or use --backend hf")
        if config.final_hidden:
            raise ConfigError("--backend vllm cannot store --final-hidden (vLLM captures the residual stream "
                              "before the final norm); drop --final-hidden or use --backend hf")
        if config.regenerate and config.temperature > 0:
            raise ConfigError(SAMPLING_REFUSED)
        device = resolve_device(config.device)  # auto: CUDA where our torch sees one, else the CPU
        if config.dtype in ("bf16-autocast",) or (device == "cpu" and config.dtype == "float16"):
            raise ConfigError(f"--backend vllm runs float32 or bfloat16 on CPU (no {config.dtype}); pass --dtype "
                              f"float32 or bfloat16, or use --backend hf")
        python = find_vllm_python()
        folder, _ = check_target_exists(config.target)
        target = str(Path(folder).expanduser().absolute()) if Path(folder).expanduser().exists() else folder
        self.precision = resolve_precision(config.dtype, device, what="--dtype")  # what the header records
        self.tokenizer = AutoTokenizer.from_pretrained(target)
        self.identity, gen_config, max_positions = _load_meta_identity(target, self.tokenizer, self.precision.weights)
        if gen_config is None:
            try:
                gen_config = GenerationConfig.from_pretrained(target)
            except OSError:
                gen_config = None
        self.stop_ids = stop_token_ids(self.tokenizer, gen_config)
        self.taps = tuple(config.layers) if config.layers is not None else \
            default_tap_layers(self.identity.num_layers).layer_ids
        self.topk = config.topk
        self._proc: subprocess.Popen | None = None
        self._work = Path(tempfile.mkdtemp(prefix="osprey-vllm-"))
        self.log_path = self._work / "engine.log"
        settings = {"target": target, "dtype": self.precision.name, "taps": list(self.taps), "topk": self.topk,
                    "capture_dir": str(self._work / "capture"), "seed": config.seed,
                    # longest prompt + answer; the runner cuts stored sequences at max_length
                    "max_model_len": min(config.max_length + config.max_new_tokens, max_positions or 1 << 30),
                    "max_num_seqs": config.batch_size, "threads": config.threads or 1}
        settings_path = self._work / "settings.json"
        settings_path.write_text(json.dumps(settings), encoding="utf-8")
        self._log: IO[str] = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - lives with the process
        self._proc = subprocess.Popen([str(python), str(DRIVER), str(settings_path)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=str(self._work),
                                      env=_clean_env(engine_env(python, config.threads or 1, device)),
                                      # a Ctrl-C reaches the builder alone, which finishes its batch and
                                      # closes the engine; a killed builder closes the driver's stdin
                                      start_new_session=True)
        try:
            ready = self._answer("start vLLM")
        except BackendUnavailableError:
            self.close()  # the process is gone or going; its log stays (named in the error)
            raise
        self.engine_info = ready
        if device.startswith("cuda") != (ready.get("device_type") == "cuda"):
            self.close()
            raise BackendUnavailableError(f"--device {config.device}: the vLLM in {python.parent.parent} runs on "
                                          f"{ready.get('device_type')}; use a vLLM build for that device")

    # --- the engine process -----------------------------------------------------------------

    def _answer(self, what: str) -> dict:
        """The driver's next answer, or a one-line error naming the engine log."""
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            self._keep_log = True
            raise BackendUnavailableError(f"vLLM engine exited ({code}) during {what}: {log_cause(self.log_path)} "
                                          f"(the whole log: {self.log_path})")
        answer = json.loads(line)
        if "error" in answer:
            self._keep_log = True
            raise BackendUnavailableError(f"vLLM engine failed to {what}: {answer['error']} "
                                          f"(the whole log: {self.log_path})")
        return answer

    def _call(self, what: str, call: dict) -> dict:
        if self._proc is None:
            raise BackendUnavailableError("the vLLM backend is closed")
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(call) + "\n")
        self._proc.stdin.flush()
        return self._answer(what)

    # --- the backend interface ----------------------------------------------------------------

    def generate(self, requests: list[GenerationRequest], params: SamplingParams, *,
                 on_step: StepCallback | None = None) -> list[GenerationResult]:
        if not params.greedy:
            raise ConfigError(SAMPLING_REFUSED)
        if not requests:
            return []
        answer = self._call("generate", {
            "op": "generate", "requests": [{"prompt_ids": list(r.prompt_ids), "seed": r.seed} for r in requests],
            "max_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "stop_token_ids": sorted(self.stop_ids)})
        results = [GenerationResult(token_ids=r["token_ids"], finish_reason=r["finish_reason"],
                                    stop_token_id=r["stop_token_id"]) for r in answer["results"]]
        if on_step is not None:  # the engine answers the whole batch at once
            on_step(list(range(len(results))), sum(len(r.generated_ids) for r in results))
        return results

    def features(self, sequences: list[np.ndarray], *, taps: tuple[int, ...], topk: int,
                 final_hidden: bool) -> list[SequenceFeatures]:
        if not sequences:
            return []
        # the engine captures the taps and top-k it was started with (the store header's)
        assert tuple(taps) == self.taps and topk == self.topk and not final_hidden, (taps, topk, final_hidden)
        out_dir = Path(tempfile.mkdtemp(dir=self._work, prefix="batch-"))
        try:
            answer = self._call("capture features", {"op": "capture", "out": str(out_dir),
                                                     "sequences": [np.asarray(s).tolist() for s in sequences]})
            feats = []
            for seq, path in zip(sequences, answer["files"]):
                data = load_file(path)
                assert data["hidden_TLD"].shape[0] == len(seq), (data["hidden_TLD"].shape, len(seq))
                feats.append(SequenceFeatures(hidden_TLD=data["hidden_TLD"], topk_ids_TK=data["topk_ids_TK"].numpy(),
                                              topk_logprobs_TK=data["topk_logprobs_TK"].numpy()))
            return feats
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    def close(self) -> None:
        proc, self._proc = getattr(self, "_proc", None), None
        if proc is not None:
            try:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                    proc.stdin.close()
                proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
        work = getattr(self, "_work", None)
        if work is not None and not getattr(self, "_keep_log", False):
            shutil.rmtree(work, ignore_errors=True)
