"""Stage 2: target-agnostic next-token pretraining of a pruned backbone on a tokenized corpus.

The model is any HF ``AutoModelForCausalLM`` folder (normally Stage 1's pruned backbone); the
corpus is a folder written by ``osprey data tokenize-corpus`` with the SAME tokenizer (checked
by content hash). Training samples are fixed-length windows of ``seq_len + 1`` tokens (inputs
and shifted targets) cut from the training part of the token stream; documents are packed
back to back, separated by EOS (standard LM pretraining packing, no cross-document masking).

Data order: optimizer step ``s`` consumes the global samples ``[s*G, (s+1)*G)`` with
``G = world_size * grad_accum * batch_size``; rank ``r``'s micro-batch ``m`` takes slot
``m * world_size + r`` of them. Sample ``i`` is a pure function of ``(seed, i)``
(:class:`WindowSampler`), so ranks never share a window within an epoch, resume is exact, and
N ranks with accumulation A see the same global batch as 1 rank with accumulation N*A.

The last ``heldout_fraction`` of the stream (from a document start) is never trained on; the
held-out perplexity ``exp(mean NLL)`` over up to ``eval_windows`` consecutive windows of it is
logged at ``eval_every`` steps, at step 0 (the freshly pruned model) and at the end.

Legend: B batch, T tokens, V vocab.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from osprey_data.corpus import TokenCorpus, WindowSampler, load_tokenizer, tokenizer_identity
from osprey_data.errors import CheckpointError, ConfigError, InputError
from osprey_train.stages.defaults import pretrain_optim
from osprey_train.trainer import LoopConfig, OptimConfig, config_json
from osprey_train.trainer.checkpoint import latest_checkpoint, read_trainer_state
from osprey_train.trainer.loop import TrainResult, train

__all__ = ["PretrainConfig", "PretrainResult", "PretrainTask", "run"]


@dataclass(kw_only=True)
class PretrainConfig:
    """Options of ``osprey train pretrain``."""

    model: Path
    """HF causal-LM folder to train (Stage 1 output), with its tokenizer."""
    corpus: Path
    """Tokenized corpus folder (``osprey data tokenize-corpus``) made with the model's tokenizer."""
    loop: LoopConfig
    """The trainer's loop: run folder (``out_dir``: checkpoints/, metrics, final/ = the trained HF
    model), steps, gradient accumulation, logging, eval and save periods, seed, devices. Held-out
    perplexity is always also measured at step 0 (``PretrainResult.initial_ppl``)."""
    optim: OptimConfig = field(default_factory=pretrain_optim)
    """AdamW and schedule (the paper's pretraining recipe, see ``stages/defaults.py``)."""
    seq_len: int = 1024
    """Tokens per training window (inputs; targets are shifted by one)."""
    batch_size: int = 8
    """Windows per micro-batch per process."""
    heldout_fraction: float = 0.01
    """Fraction of the corpus (its end) held out for perplexity; never trained on."""
    eval_windows: int = 64
    """Held-out windows (of seq_len + 1 tokens) per evaluation."""
    eval_batch_size: int = 8
    """Windows per forward pass during evaluation."""

    def __post_init__(self) -> None:
        self.model, self.corpus = Path(self.model), Path(self.corpus)
        for name in ("seq_len", "batch_size", "eval_windows", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"pretrain: {name} must be an integer >= 1, got {value!r}")
        if not 0.0 < self.heldout_fraction < 0.5:
            raise ConfigError(f"pretrain: heldout_fraction must be in (0, 0.5), got {self.heldout_fraction}")

    def trainer_loop(self) -> LoopConfig:
        """``loop`` as the trainer runs it: evaluated at step 0, the stage config recorded."""
        return dataclasses.replace(self.loop, eval_at_start=True,
                                   extra={"stage": "pretrain", "config": config_json(self)})


@dataclass
class PretrainResult:
    """What a pretraining run reports."""

    final_dir: Path | None
    """The trained model (HF folder, loadable with AutoModelForCausalLM); None on ranks > 0."""
    initial_ppl: float | None
    """Held-out perplexity before training (None when resuming past step 0)."""
    final_ppl: float | None
    """Held-out perplexity after the last step."""
    tokens_per_s: float
    """Training throughput of this invocation (all ranks)."""
    plot_path: Path | None
    """metrics.png (loss and perplexity curves)."""
    train: TrainResult = field(repr=False)
    """The trainer's full result."""


class PretrainTask:
    """:class:`osprey_train.trainer.loop.TrainTask` for next-token prediction on corpus windows."""

    def __init__(self, cfg: PretrainConfig) -> None:
        self.cfg = cfg
        self.corpus = TokenCorpus(cfg.corpus)
        if not (cfg.model / "config.json").is_file():
            raise InputError(f"{cfg.model}: no config.json, not a HF model folder; pass the output of "
                             "`osprey train prune`")
        self.tokenizer = load_tokenizer(str(cfg.model))
        ident = tokenizer_identity(self.tokenizer, str(cfg.model))
        if ident["hash"] != self.corpus.tokenizer["hash"]:
            raise ConfigError(f"{cfg.corpus} was tokenized with {self.corpus.tokenizer['name_or_path']} "
                              f"(hash {self.corpus.tokenizer['hash'][:12]}) but {cfg.model} has another tokenizer "
                              f"(hash {ident['hash'][:12]}); tokenize the corpus with --tokenizer {cfg.model}")
        (tr0, tr1), (ho0, ho1) = self.corpus.split(cfg.heldout_fraction, min_heldout=cfg.seq_len + 1)
        self.train_range, self.heldout_range = (tr0, tr1), (ho0, ho1)
        self.sampler = WindowSampler(self.corpus, tr0, tr1, cfg.seq_len + 1, cfg.loop.seed)
        self.eval_starts = self._heldout_starts()

    def _heldout_starts(self) -> list[int]:
        ho0, ho1 = self.heldout_range
        length = self.cfg.seq_len + 1
        n = min((ho1 - ho0) // length, self.cfg.eval_windows)
        if n < 1:
            raise InputError(f"{self.cfg.corpus}: held-out part ({ho1 - ho0} tokens) is shorter than one window "
                             f"({length}); raise --heldout-fraction or lower --seq-len")
        return [ho0 + k * length for k in range(n)]

    # -- TrainTask --
    def build_model(self) -> nn.Module:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(self.cfg.model, dtype=torch.float32)
        except Exception as exc:   # transformers raises many types for a bad folder
            raise InputError(f"{self.cfg.model}: cannot load as AutoModelForCausalLM ({type(exc).__name__}: {exc})") \
                from None
        emb = model.get_input_embeddings().num_embeddings
        if self.corpus.tokenizer["vocab_size"] > emb:
            raise ConfigError(f"{self.cfg.corpus}: tokenizer has {self.corpus.tokenizer['vocab_size']} tokens but "
                              f"{self.cfg.model} embeds only {emb}")
        model.config.use_cache = False
        return model

    def batch(self, step: int, micro: int, rank: int, world_size: int) -> torch.Tensor:
        per_slot = self.cfg.batch_size
        global_batch = world_size * self.cfg.loop.grad_accum * per_slot
        first = step * global_batch + (micro * world_size + rank) * per_slot
        return torch.from_numpy(self.sampler.batch(first, per_slot))   # ids_BT (B, seq_len + 1)

    @staticmethod
    def _nll_sum(model: nn.Module, ids_BT: torch.Tensor) -> tuple[torch.Tensor, int]:
        logits_BTV = model(input_ids=ids_BT[:, :-1]).logits
        targets_BT = ids_BT[:, 1:]
        nll = F.cross_entropy(logits_BTV.float().reshape(-1, logits_BTV.shape[-1]), targets_BT.reshape(-1),
                              reduction="sum")
        return nll, targets_BT.numel()

    def loss(self, model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        nll, count = self._nll_sum(model, batch)
        return nll / count, {"tokens": float(count)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        device = next(model.parameters()).device
        length = self.cfg.seq_len + 1
        total, count = 0.0, 0
        for i in range(0, len(self.eval_starts), self.cfg.eval_batch_size):
            starts = self.eval_starts[i:i + self.cfg.eval_batch_size]
            ids = torch.stack([torch.from_numpy(self.corpus.tokens(s, length)) for s in starts]).to(device)
            nll, n = self._nll_sum(model, ids)
            total += float(nll)
            count += n
        loss = total / count
        return {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 80.0)), "eval_tokens": float(count)}

    def save_model(self, model: nn.Module, out_dir: Path) -> None:
        model.config.use_cache = True
        model.save_pretrained(out_dir, safe_serialization=True)
        model.config.use_cache = False
        self.tokenizer.save_pretrained(out_dir)
        for extra in ("generation_config.json", "prune_info.json", "chat_template.jinja"):
            src = self.cfg.model / extra
            if src.is_file() and not (Path(out_dir) / extra).exists():
                shutil.copy2(src, Path(out_dir) / extra)
        info = {"stage": "pretrain", "source_model": str(self.cfg.model.resolve()),
                "corpus": str(self.cfg.corpus.resolve()), "corpus_tokenizer": self.corpus.tokenizer,
                "train_tokens_range": list(self.train_range), "heldout_tokens_range": list(self.heldout_range),
                "steps": self.cfg.loop.max_steps, "seq_len": self.cfg.seq_len, "seed": self.cfg.loop.seed}
        (Path(out_dir) / "pretrain_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")


# Settings that define the data stream and the model: a resume must not change them.
_RESUME_FIXED = ("model", "corpus", "seq_len", "batch_size", "heldout_fraction")


def _check_resume(cfg: PretrainConfig) -> None:
    ckpt = latest_checkpoint(cfg.loop.out_dir / "checkpoints")
    if not cfg.loop.resume or ckpt is None:
        return
    saved = read_trainer_state(ckpt).get("extra", {}).get("config", {})
    now = config_json(cfg)
    diffs = [f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in _RESUME_FIXED if k in saved and saved[k] != now[k]]
    if diffs:
        raise CheckpointError(f"{ckpt}: cannot resume with different data/model settings ({'; '.join(diffs)}); "
                              "use the original options or a fresh --out")


def run(cfg: PretrainConfig) -> PretrainResult:
    """Pretrain ``cfg.model`` on ``cfg.corpus``; the trained model lands in ``cfg.loop.out_dir/final``."""
    task = PretrainTask(cfg)
    _check_resume(cfg)
    result = train(task, cfg.trainer_loop(), cfg.optim)
    initial = next((h["eval_ppl"] for h in result.eval_history if h["step"] == 0), None)
    final = result.last_eval.get("eval_ppl")
    return PretrainResult(final_dir=result.final_dir, initial_ppl=initial, final_ppl=final,
                          tokens_per_s=result.tokens_per_s, plot_path=result.plot_path, train=result)
