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

Knowledge distillation (``teacher``): the unpruned source model's next-token distribution is the
soft target (still target-agnostic: the teacher is the source LM, not the serving target), as
pruning work such as Minitron and Sheared-LLaMA does to recover a pruned model. The loss is
``kd_weight * tau^2 * KL(softmax(t / tau) || softmax(s / tau)) + (1 - kd_weight) * CE(s, next token)``,
``t`` and ``s`` the teacher's and student's logits, averaged over tokens; ``tau^2`` keeps the
gradient scale of the soft term independent of the temperature (Hinton et al.). The teacher runs
in inference mode on the same windows, is never trained or checkpointed, and must use the
corpus's tokenizer. Held-out perplexity is always the student's on the true next tokens, so the
two Stage-2 variants are compared on one scale; evaluations also log the held-out KL and (once)
the teacher's own perplexity.

Legend: B batch, T tokens, V vocab.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from osprey_data.corpus import TokenCorpus, WindowSampler, load_tokenizer, tokenizer_identity
from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_data.errors import ConfigError, InputError
from osprey_data.target_model import load_hf_target, peek_model_config
from osprey_train.stages.configs import PretrainConfig
from osprey_train.trainer.loop import TrainResult, check_resume_request, train
from osprey_train.trainer.resume_check import check_resume_config
from osprey_train.trainer.run_lock import run_lock

__all__ = ["PretrainConfig", "PretrainResult", "PretrainTask", "run"]


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
        # the metric that is a per-token cross-entropy (metrics.png's perplexity): the KD loss is not
        self.perplexity_of = "ce" if cfg.teacher is not None else "loss"
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
        self._check_before_loading()
        self.teacher = self._load_teacher() if cfg.teacher is not None else None
        self._teacher_eval: dict[str, float] | None = None

    def _check_before_loading(self) -> None:
        """What config.json and the tokenizers tell, before the teacher's or the model's weights load:
        the corpus's vocabulary fits the model's, the teacher's vocabulary and tokenizer are the model's."""
        cfg = self.cfg
        model = peek_model_config(str(cfg.model), option="--model")
        if model is not None and model.vocab_size is not None:
            self._check_embeds_corpus(model.vocab_size, where=model.path)
        if cfg.teacher is None:
            return
        teacher = peek_model_config(cfg.teacher, option="--teacher")
        if model is not None and teacher is not None and None not in (model.vocab_size, teacher.vocab_size):
            self._check_same_vocab(model.vocab_size, teacher.vocab_size, where=f"{model.path} vs {teacher.path}")
        if Path(cfg.teacher).expanduser().is_dir():   # a folder's tokenizer loads without its weights
            self._check_teacher_tokenizer(load_tokenizer(str(Path(cfg.teacher).expanduser())))

    def _check_embeds_corpus(self, embedded: int, *, where: str) -> None:
        if self.corpus.tokenizer["vocab_size"] > embedded:
            raise ConfigError(f"{self.cfg.corpus}: tokenizer has {self.corpus.tokenizer['vocab_size']} tokens but "
                              f"{self.cfg.model} embeds only {embedded} ({where}); tokenize the corpus with "
                              f"--tokenizer {self.cfg.model}")

    def _check_same_vocab(self, student_v: int, teacher_v: int, *, where: str) -> None:
        if student_v != teacher_v:
            raise ConfigError(f"pretrain --teacher {self.cfg.teacher}: its LM head has {teacher_v} rows, "
                              f"{self.cfg.model}'s has {student_v} ({where}); the logits must cover the same "
                              "vocabulary: pass the unpruned source the backbone was pruned from")

    def _check_teacher_tokenizer(self, tokenizer: Any) -> None:
        ident = tokenizer_identity(tokenizer, self.cfg.teacher)
        if ident["hash"] != self.corpus.tokenizer["hash"]:
            raise ConfigError(f"pretrain --teacher {self.cfg.teacher}: its tokenizer (hash {ident['hash'][:12]}) is "
                              f"not the corpus's ({self.cfg.corpus}, hash {self.corpus.tokenizer['hash'][:12]}); "
                              "the teacher must be the unpruned source the backbone was pruned from")

    def _load_teacher(self) -> nn.Module:
        teacher, tokenizer = load_hf_target(self.cfg.teacher, device="cpu")
        self._check_teacher_tokenizer(tokenizer)
        teacher.config.use_cache = False
        for p in teacher.parameters():
            p.requires_grad_(False)
        return teacher.eval()

    def _teacher_logits(self, ids_BT: torch.Tensor) -> torch.Tensor:
        device = ids_BT.device
        if next(self.teacher.parameters()).device != device:
            self.teacher = self.teacher.to(device)
        with torch.no_grad():
            return self.teacher(input_ids=ids_BT).logits.float()

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
        self._check_embeds_corpus(model.get_input_embeddings().num_embeddings, where="its input embedding")
        if self.teacher is not None:
            self._check_same_vocab(model.get_output_embeddings().weight.shape[0],
                                   self.teacher.get_output_embeddings().weight.shape[0], where="loaded LM heads")
        model.config.use_cache = False
        return model

    def batch(self, step: int, micro: int, rank: int, world_size: int) -> torch.Tensor:
        per_slot = self.cfg.batch_size
        global_batch = world_size * self.cfg.loop.grad_accum * per_slot
        first = step * global_batch + (micro * world_size + rank) * per_slot
        return torch.from_numpy(self.sampler.batch(first, per_slot))   # ids_BT (B, seq_len + 1)

    @staticmethod
    def _nll_sum(logits_BTV: torch.Tensor, ids_BT: torch.Tensor) -> torch.Tensor:
        """Summed next-token NLL of ``logits`` (computed on ``ids[:, :-1]``) against ``ids[:, 1:]``."""
        return F.cross_entropy(logits_BTV.float().reshape(-1, logits_BTV.shape[-1]), ids_BT[:, 1:].reshape(-1),
                               reduction="sum")

    def _kl_sum(self, student_BTV: torch.Tensor, teacher_BTV: torch.Tensor) -> torch.Tensor:
        """Summed tau^2 * KL(teacher || student) over the tokens, both at temperature tau."""
        tau = self.cfg.kd_temperature
        log_q = F.log_softmax(student_BTV.float() / tau, dim=-1)
        log_p = F.log_softmax(teacher_BTV / tau, dim=-1)
        return tau * tau * (log_p.exp() * (log_p - log_q)).sum()

    def loss(self, model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        logits_BTV = model(input_ids=batch[:, :-1]).logits
        count = batch[:, 1:].numel()
        if self.teacher is None:
            return self._nll_sum(logits_BTV, batch) / count, {"tokens": float(count)}
        kd = self._kl_sum(logits_BTV, self._teacher_logits(batch[:, :-1])) / count
        w = self.cfg.kd_weight
        with torch.set_grad_enabled(w < 1.0 and torch.is_grad_enabled()):   # pure KD: CE is a metric only
            ce = self._nll_sum(logits_BTV, batch) / count
        loss = kd if w == 1.0 else w * kd + (1.0 - w) * ce
        return loss, {"tokens": float(count), "ce": float(ce.detach()), "kd": float(kd.detach())}

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        device = next(model.parameters()).device
        length = self.cfg.seq_len + 1
        total, kl, teacher_total, count = 0.0, 0.0, 0.0, 0
        for i in range(0, len(self.eval_starts), self.cfg.eval_batch_size):
            starts = self.eval_starts[i:i + self.cfg.eval_batch_size]
            ids = torch.stack([torch.from_numpy(self.corpus.tokens(s, length)) for s in starts]).to(device)
            logits_BTV = model(input_ids=ids[:, :-1]).logits
            total += float(self._nll_sum(logits_BTV, ids))
            count += ids[:, 1:].numel()
            if self.teacher is not None:
                teacher_BTV = self._teacher_logits(ids[:, :-1])
                kl += float(self._kl_sum(logits_BTV, teacher_BTV))
                if self._teacher_eval is None:
                    teacher_total += float(self._nll_sum(teacher_BTV, ids))
        loss = total / count
        out = {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 80.0)), "eval_tokens": float(count)}
        if self.teacher is not None:
            if self._teacher_eval is None:   # the teacher does not change: measured once
                self._teacher_eval = {"teacher_eval_ppl": math.exp(min(teacher_total / count, 80.0))}
            out.update({"eval_kd": kl / count, **self._teacher_eval})
        return out

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
                "steps": self.cfg.loop.max_steps, "seq_len": self.cfg.seq_len, "seed": self.cfg.loop.seed,
                "teacher": self.cfg.teacher, "kd_temperature": self.cfg.kd_temperature, "kd_weight": self.cfg.kd_weight}
        (Path(out_dir) / "pretrain_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")


def run(cfg: PretrainConfig) -> PretrainResult:
    """Pretrain ``cfg.model`` on ``cfg.corpus``; the trained model lands in ``cfg.loop.out_dir/final``."""
    # the lock before anything is read or written in the run folder
    with run_lock(cfg.loop.out_dir), torch_threads(cfg.threads, note_to_stderr if cfg.loop.progress else None):
        check_resume_request(cfg.loop)
        check_resume_config(cfg)
        task = PretrainTask(cfg)
        result = train(task, cfg.trainer_loop(), cfg.optim)
    initial = next((h["eval_ppl"] for h in result.eval_history if h["step"] == 0), None)
    final = result.last_eval.get("eval_ppl")
    return PretrainResult(final_dir=result.final_dir, initial_ppl=initial, final_ppl=final,
                          tokens_per_s=result.tokens_per_s, plot_path=result.plot_path, train=result)
