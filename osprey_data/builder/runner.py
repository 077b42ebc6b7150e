"""``run(config)``: the builder's main loop — inputs in, a feature store out.

Order of work: read and check every input first (a malformed line fails before a multi-GB
model is loaded), check that the store location accepts writes, load the backend, open the
store (refusing, with the differing setting named, a store built with another
content-affecting config), then process this worker's samples in fixed batches: generate the
assistant turns round by round, lay out the sequence + mask, apply the length policy, prefill
for features, write.

Layout: a sample whose final assistant turn was generated is stored as the prompt ids the target
was fed for it followed by the generated ids verbatim (stop token included, no template closing
tokens), so the store holds what the target produced; its loss mask is every generated id plus
the template mask of earlier assistant turns inside the prompt. Other samples are the rendered
conversation with the template mask.

Resume: batches are fixed slices of this worker's sample list, independent of what is already
done, so a rerun after a crash skips the batches whose samples are all committed and recomputes
at most the one batch that was being written — with exactly the same batch composition, hence
bit-identical features. Only samples not yet committed are written: nothing lost, nothing twice.

Interruption: SIGINT (Ctrl-C) or SIGTERM stops the work in progress, hands every finished sample
to the writer and commits them (the open shard is committed short: a partial shard is a shard),
then raises :class:`~osprey_data.errors.Interrupted` saying how many samples were kept. The
batch being generated is lost and recomputed by the rerun. A second signal stops at once (the
store stays valid; the open shard is then recomputed too).

Cheap checks come first: options, inputs, ``--out`` (never a stranger's folder), ``--layers``
against the target's config and the content settings against an existing store's header — all
before the target's weights load.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from osprey_data.builder.backends import BACKENDS, GenerationRequest, SamplingParams, TargetBackend, request_seed
from osprey_data.builder.backends.vllm import check_vllm_venv
from osprey_data.builder.config import BuildConfig
from osprey_data.builder.dialogue import Dialogue, combine_finish_reasons, plan_dialogue
from osprey_data.builder.features import make_record, non_finite_reason
from osprey_data.builder.input_index import InputIndex, index_inputs, stream_batches
from osprey_data.builder.output import check_output, replace_output
from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_data.conversation.template_markers import describe_markers, find_markers, special_markers
from osprey_data.conversation import (ChatRenderer, InputSample, RenderedSample, read_chat_template,
                                      use_chat_template)
from osprey_data.errors import (InputError, Interrupted, ManifestMismatchError, ModelError,
                                StoreNotFoundError)
from osprey_data.interrupt import GracefulStop, StopRequested, signal_name
from osprey_data.store import StoreHeader, StoreReader, StoreWriter
from osprey_data.store.fs import StoreFS
from osprey_data.store.worker_lock import WorkerLock
from osprey_data.store.writer import worker_name
from osprey_data.target_model import (TapLayers, chat_template_hash, check_chat_template, default_tap_layers,
                                     peek_model_config)

__all__ = ["run", "BuildSummary", "BUILDER_VERSION", "SEQUENCE_LAYOUT", "make_header", "SKIP_REASONS"]

# Bump when the builder's output for the same config changes meaning (part of the header).
# 2: a regenerated final turn is stored as the prompt ids fed to the target + the generated ids
#    verbatim (v1 re-tokenized the decoded response inside the rendered conversation).
BUILDER_VERSION = "osprey-builder/2"

# How a regenerated sample's tokens are laid out (fingerprinted: an old-layout store is refused).
SEQUENCE_LAYOUT = "prompt+generated-ids"

# Reasons a sample is not written (summary keys, prefixes of errors-file reasons).
SKIP_REASONS = ("input_error", "too_long", "non_finite")

# Samples with chat-template markers warned about by name; the rest are counted in the summary.
_MARKER_WARNINGS_SHOWN = 5


@dataclass
class BuildSummary:
    """What one ``run`` did."""

    store: str
    worker_index: int
    num_workers: int
    samples_written: int = 0
    tokens_written: int = 0
    generated_tokens: int = 0
    """Tokens the target generated (all regenerated turns, including samples later skipped)."""
    already_done: int = 0
    """Samples of this worker found committed by an earlier run (resume)."""
    already_skipped: int = 0
    """Samples an earlier run already reported in the errors file (not retried)."""
    truncated: int = 0
    """Written samples cut to ``max_length``."""
    template_markers: int = 0
    """Samples of this run whose input content holds a chat-template marker (each warned about
    on stderr, the first few by name; see ``osprey_data.conversation.template_markers``)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Reason -> samples not written (each also in the store's errors file)."""
    bytes_per_token: float | None = None
    """Stored bytes per token over this worker's shards."""
    wall_s: float = 0.0
    """Whole run, model loading included."""
    load_s: float = 0.0
    """Reading inputs and loading the target (excluded from the rates)."""

    @property
    def work_s(self) -> float:
        return max(self.wall_s - self.load_s, 0.0)

    @property
    def samples_per_s(self) -> float:
        return self.samples_written / self.work_s if self.work_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / self.work_s if self.work_s > 0 else 0.0

    def format(self) -> str:
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        bpt = f"{self.bytes_per_token:.1f}" if self.bytes_per_token is not None else "n/a"
        worker = f" (worker {self.worker_index}/{self.num_workers})" if self.num_workers > 1 else ""
        return (f"built {self.store}{worker}: {self.samples_written} samples written, "
                f"{self.tokens_written} tokens ({self.generated_tokens} generated), {self.already_done} already done"
                f"{f' ({self.already_skipped} skipped before)' if self.already_skipped else ''}, "
                f"{self.truncated} truncated, skipped: {skipped}; "
                f"{f'{self.template_markers} with chat-template markers in their content (see the warnings); ' if self.template_markers else ''}"
                f"{bpt} bytes/token; "
                f"{self.wall_s:.1f} s wall, {self.load_s:.1f} s loading; {self.samples_per_s:.2f} samples/s, "
                f"{self.tokens_per_s:.1f} tokens/s")

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__},
                "samples_per_s": self.samples_per_s, "tokens_per_s": self.tokens_per_s}


# --- header ---------------------------------------------------------------------------------


def make_header(config: BuildConfig, backend: TargetBackend, identity: Any = None):
    """The store header of this build: identity (default: the backend's), taps, codec and the
    content-affecting config."""
    identity = backend.identity if identity is None else identity
    if config.layers is not None:
        taps = _checked_layers(config.layers, identity.num_layers)
    else:
        taps = default_tap_layers(identity.num_layers)
    build_config = config.content_settings()
    # "auto" resolved: the precision the target actually ran in (bf16-autocast has float32 weights)
    precision = getattr(backend, "precision", None)
    build_config["dtype"] = precision.name if precision is not None else identity.dtype
    build_config["layers"] = list(taps.layer_ids)
    build_config["sequence_layout"] = SEQUENCE_LAYOUT
    template_hash = chat_template_hash(backend.tokenizer)
    fingerprint_doc = {"build_config": build_config, "target": identity.to_dict(), "taps": taps.to_dict(),
                       "chat_template_hash": template_hash, "builder_version": BUILDER_VERSION}
    fingerprint = hashlib.sha256(json.dumps(fingerprint_doc, sort_keys=True).encode()).hexdigest()
    return StoreHeader(
        target=identity, taps=taps, topk=config.topk, hidden_codec=config.hidden_codec,
        has_final_hidden=config.final_hidden, chat_template_hash=template_hash,
        generation=config.generation_dict(), build_fingerprint=fingerprint,
        build_config=build_config, builder_version=BUILDER_VERSION,
    )


def _checked_layers(layers: tuple[int, ...], num_layers: int, source: str | None = None) -> TapLayers:
    return TapLayers.for_target(layers, num_layers, option="--taps", source=source)


def _setting_differences(old: dict[str, Any], new: dict[str, Any], keys: Any) -> list[str]:
    return [f"setting --{key.replace('_', '-')} differs (store: {old.get(key)!r}, this run: {new.get(key)!r})"
            for key in sorted(keys) if old.get(key) != new.get(key)]


def _refuse_mismatch(config: BuildConfig, diffs: list[str]) -> None:
    raise ManifestMismatchError(
        f"{config.out}: store was built with a different configuration: {'; '.join(diffs) or 'header differs'}. "
        f"Rerun with the store's settings to resume, build into another --out, or pass --overwrite to "
        f"replace the store.")


def _existing_header(config: BuildConfig) -> StoreHeader | None:
    try:
        return StoreReader(config.out, storage_options=config.storage_options).header
    except StoreNotFoundError:
        return None


def _check_before_loading(config: BuildConfig, inputs: InputIndex) -> str:
    """Every check that needs no model: ``--out``, ``--taps`` against the target's config.json, the
    chat template's presence (for conversation inputs), and the content settings against an
    existing store. Returns :func:`check_output`'s verdict."""
    verdict = check_output(config.out, overwrite=config.overwrite)
    if config.backend == "vllm":
        check_vllm_venv()   # imports vLLM in its venv: a venv without it fails now, not at engine start
    shape = peek_model_config(config.target, config.gguf_file)
    if shape is not None and shape.num_layers is not None:
        if config.layers is not None:
            _checked_layers(config.layers, shape.num_layers, shape.path)
        else:
            default_tap_layers(shape.num_layers)   # a target too shallow for the default taps
    if config.chat_template is None and inputs.has_conversations:
        check_chat_template(config.target, config.gguf_file)
    if verdict == "store":
        # another live process writing as this worker: say so now, not after the model loads (the
        # writer takes the lock for good when it opens the store) -- also for a fresh store whose
        # first builder has not published a manifest yet
        lock = WorkerLock(StoreFS(config.out, storage_options=config.storage_options, read_only=False),
                          worker_name(config.worker_index, config.num_workers))
        lock.acquire()
        lock.release()
        old = _existing_header(config)
        if old is not None:
            new = config.content_settings()
            # known before loading: everything but an "auto" dtype and default taps
            keys = [k for k in new if not (k == "dtype" and new[k] == "auto")
                    and not (k == "layers" and new[k] is None)]
            diffs = _setting_differences(old.build_config, new, keys)
            if diffs:
                _refuse_mismatch(config, diffs)
    # Refused writes (read-only credentials or mount) fail now, not after loading the target;
    # last, as the probe creates --out.
    StoreFS(config.out, storage_options=config.storage_options, read_only=False).check_writable()
    return verdict


def _same_local_target(old: Any, new: Any) -> bool:
    """Whether two target identities differ only in how one local folder is spelled
    (``work/llama`` vs ``./work/../work/llama`` vs its absolute path): same hashes, same folder."""
    a, b = old.to_dict(), new.to_dict()
    pa, pb = str(a.pop("name_or_path")), str(b.pop("name_or_path"))
    if a != b or "://" in pa + pb:
        return False
    return pa == pb or (Path(pa).exists() and Path(pa).resolve() == Path(pb).resolve())


def _check_existing_store(config: BuildConfig, header: Any, backend: TargetBackend | None = None) -> Any:
    """Refuse to resume into a store built with other content settings, naming them; returns the
    header to write with (with the store's own spelling of the target when this run names the same
    local folder otherwise)."""
    old = _existing_header(config)
    if old is None or old == header:
        return header
    if backend is not None and old.target != header.target and _same_local_target(old.target, header.target):
        header = make_header(config, backend, identity=old.target)
        if old == header:
            return header
    diffs = _setting_differences(old.build_config, header.build_config,
                                 set(old.build_config) | set(header.build_config))
    if old.target != header.target:
        fields = [k for k, v in old.target.to_dict().items() if header.target.to_dict()[k] != v]
        diffs.append(f"the target differs in {', '.join(fields)} (store: {old.target.name_or_path!r}, "
                     f"this run: {header.target.name_or_path!r})")
    if old.chat_template_hash != header.chat_template_hash:
        diffs.append("the chat template differs (the target's own, or --chat-template FILE)")
    if old.builder_version != header.builder_version:
        diffs.append(f"builder version differs (store: {old.builder_version}, this run: {header.builder_version})")
    for name in ("topk", "hidden_codec", "has_final_hidden", "taps"):
        if getattr(old, name) != getattr(header, name) and not any(name in d for d in diffs):
            diffs.append(f"{name} differs (store: {getattr(old, name)!r}, this run: {getattr(header, name)!r})")
    _refuse_mismatch(config, diffs)
    return header


# --- one batch ------------------------------------------------------------------------------


class _Progress:
    """The progress bar counts SAVED samples: those handed to the store writer, which an
    interruption commits (a batch's samples reach the writer together, after its prefill). Inside
    a batch, the postfix shows how many of its samples are generated and the generated tokens/s,
    so a slow batch is seen moving; those are lost if the build is stopped before the batch ends."""

    def __init__(self, bar: Any, todo: set[str]) -> None:
        self.bar, self.todo = bar, todo
        self.counted: set[str] = set()
        self.generated_in_batch: set[str] = set()
        self.batch_size = 0
        self.tokens = 0
        self.t0 = time.perf_counter()

    def start_batch(self, size: int) -> None:
        self.generated_in_batch.clear()
        self.batch_size = size
        self._postfix()

    def sample_generated(self, sample_id: str) -> None:
        if sample_id in self.todo:   # not a sample recomputed only to keep its batch's composition
            self.generated_in_batch.add(sample_id)
        self._postfix()

    def sample_done(self, sample_id: str) -> None:
        """The sample reached the writer (or was skipped and recorded): it survives Ctrl-C."""
        if sample_id in self.todo and sample_id not in self.counted:
            self.counted.add(sample_id)
            self.bar.update(1)

    def generated(self, n: int) -> None:
        self.tokens += n
        self._postfix()

    def _postfix(self) -> None:
        rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"batch: {len(self.generated_in_batch)}/{self.batch_size} generated, not yet "
                                 f"saved; {self.tokens} tokens generated, {rate:.1f} tok/s", refresh=False)


def _at_sample(s: InputSample, exc: ModelError) -> ModelError:
    """``exc`` prefixed with the file, line and sample where the template failed."""
    return ModelError(f"{s.file}:{s.line} (sample {s.sample_id!r}): {exc}")


class _BatchProcessor:
    """Generation rounds, rendering, length policy and prefill for one batch of samples."""

    def __init__(self, config: BuildConfig, backend: TargetBackend, renderer: ChatRenderer, header: Any,
                 progress: _Progress | None = None):
        self.config, self.backend, self.renderer, self.header = config, backend, renderer, header
        self.progress = progress
        self.generated_tokens = 0
        self.markers = special_markers(backend.tokenizer)
        self.marker_warnings: dict[str, str] = {}
        """Sample id -> warning line, for the samples of the last batch whose content holds a marker."""
        self.params = SamplingParams(max_new_tokens=config.max_new_tokens,
                                     temperature=config.temperature, top_p=config.top_p)

    def _generate(self, dialogues: list[Dialogue], on_sample_error) -> None:
        cfg = self.config
        while True:
            requests: list[tuple[Dialogue, int, GenerationRequest]] = []
            for d in dialogues:
                j = d.next_turn
                if j is None or d.skip_reason is not None:
                    continue
                try:
                    prompt = self.renderer.generation_prompt_ids(d.messages[:j])
                except InputError as exc:  # the template refuses this conversation: one sample
                    d.skip_reason = on_sample_error(d.sample, exc)
                    continue
                except ModelError as exc:  # the template itself is unusable: stop, naming where it showed
                    raise _at_sample(d.sample, exc) from None
                if len(prompt) >= cfg.max_length:
                    if cfg.overflow == "skip":
                        d.skip_reason = f"too_long: prompt of turn {j} has {len(prompt)} tokens >= --max-length {cfg.max_length}"
                    elif any(m["role"] == "assistant" for m in d.messages[:j]):
                        # nothing from this turn on can fit: drop it and the later turns
                        d.messages, d.pending, d.truncated = d.messages[:j], [], True
                    else:
                        d.skip_reason = (f"too_long: the first prompt has {len(prompt)} tokens >= "
                                         f"--max-length {cfg.max_length}, no room for a response")
                    continue
                seed = request_seed(cfg.seed, d.sample.sample_id, j)
                requests.append((d, j, GenerationRequest(prompt_ids=tuple(prompt), seed=seed)))
            if not requests:
                return
            results = self.backend.generate([r for _, _, r in requests], self.params,
                                            on_step=self._on_step(requests))
            self.generated_tokens += sum(len(r.token_ids) for r in results)
            for (d, j, req), res in zip(requests, results):
                d.messages[j] = {"role": "assistant", "content": self.renderer.decode_response(res.token_ids)}
                d.generated[j] = (list(req.prompt_ids), res.generated_ids)
                d.finish_reasons.append(res.finish_reason)
                d.pending.pop(0)

    def _on_step(self, requests: list[tuple[Dialogue, int, GenerationRequest]]):
        """The backend's progress callback for one generation round (None without progress)."""
        progress = self.progress
        if progress is None:
            return None

        def on_step(finished: list[int], new_tokens: int) -> None:
            progress.generated(new_tokens)
            for i in finished:
                d = requests[i][0]
                if len(d.pending) <= 1:  # its last turn to generate: only the batch's prefill is left
                    progress.sample_generated(d.sample.sample_id)

        return on_step

    def _render(self, d: Dialogue) -> RenderedSample:
        cfg = self.config
        s = d.sample
        last = len(d.messages) - 1
        if s.is_text:
            rendered = self.renderer.render_preformatted(s.text)
        elif last in d.generated:
            # The final turn was generated: store the prompt ids the target was fed and the ids it
            # generated verbatim (stop token included, no template closing tokens), so the stored
            # sequence is exactly what the target produced.
            prompt_ids, generated_ids = d.generated[last]
            prompt = self.renderer.render_prompt(d.messages[:last])
            if prompt.token_ids.tolist() != prompt_ids:
                raise ModelError("re-rendering the final prompt gave other ids than the ones the target was fed; "
                                 "the chat template is not deterministic")
            rendered = prompt.with_response(generated_ids, d.messages[last]["content"])
        else:
            rendered = self.renderer.render(d.messages)
        if rendered.num_tokens > cfg.max_length:
            if cfg.overflow == "skip":
                d.skip_reason = f"too_long: {rendered.num_tokens} tokens > --max-length {cfg.max_length}"
                return rendered
            rendered = rendered.truncate(cfg.max_length)
            d.truncated = True
        if not rendered.loss_mask.any():
            d.skip_reason = (f"too_long: no assistant token left within --max-length {cfg.max_length}")
        return rendered

    def process(self, samples: list[InputSample], on_sample_error) -> list[tuple[InputSample, Any, str | None]]:
        """Returns (sample, record or None, skip reason or None) for every sample, in order."""
        cfg = self.config
        dialogues: list[Dialogue] = []
        results: dict[int, tuple[Any, str | None]] = {}
        self.marker_warnings = {}
        for k, s in enumerate(samples):
            found = [] if s.is_text else find_markers(s.conversation, self.markers)
            if found:  # pre-formatted text is templated on purpose; a conversation is not
                self.marker_warnings[s.sample_id] = describe_markers(f"{s.file}:{s.line} (sample {s.sample_id!r})", found)
            try:
                dialogues.append(plan_dialogue(s, regenerate=cfg.regenerate, last_turn_only=cfg.last_turn_only))
            except InputError as exc:
                results[k] = (None, on_sample_error(s, exc))
                dialogues.append(None)  # type: ignore[arg-type]
        live = [d for d in dialogues if d is not None]
        self._generate(live, on_sample_error)
        rendered: dict[int, RenderedSample] = {}
        for k, d in enumerate(dialogues):
            if d is None:
                continue
            if d.skip_reason is None:
                try:
                    r = self._render(d)
                except InputError as exc:
                    results[k] = (None, on_sample_error(d.sample, exc))
                    continue
                except ModelError as exc:  # the template itself is unusable: stop, naming where it showed
                    raise _at_sample(d.sample, exc) from None
                if d.skip_reason is None:
                    rendered[k] = r
            if d.skip_reason is not None:
                results[k] = (None, d.skip_reason)
        order = sorted(rendered)
        feats = self.backend.features([rendered[k].token_ids for k in order], taps=self.header.taps.layer_ids,
                                      topk=cfg.topk, final_hidden=cfg.final_hidden)
        for k, f in zip(order, feats):
            d = dialogues[k]
            reason = non_finite_reason(f)
            if reason is not None:
                results[k] = (None, f"non_finite: {reason}")
                continue
            s = d.sample
            conversation = [{"role": "text", "content": s.text}] if s.is_text else d.messages
            record = make_record(sample_id=s.sample_id, domain=s.domain, source=s.source,
                                 conversation=conversation, rendered=rendered[k], features=f,
                                 finish_reason=combine_finish_reasons(d))
            results[k] = (record, None)
        return [(s, *results[k]) for k, s in enumerate(samples)]


# --- main loop ------------------------------------------------------------------------------


def run(config: BuildConfig) -> BuildSummary:
    """Build (or resume building) the store ``config.out``; returns the summary.

    Raises:
        Interrupted: SIGINT/SIGTERM arrived; every finished sample was committed first.
    """
    t0 = time.perf_counter()
    inputs = index_inputs(config)   # every record checked; this worker's kept compactly
    verdict = _check_before_loading(config, inputs)
    with GracefulStop() as stop, torch_threads(config.threads, note_to_stderr if config.progress else None):
        try:
            backend = BACKENDS[config.backend](config)
            try:
                if config.chat_template is not None:   # before the header: its hash is this template's
                    use_chat_template(backend.tokenizer, read_chat_template(config.chat_template))
                return _build(config, backend, inputs, verdict, stop, t0)
            finally:
                backend.close()
        except StopRequested as exc:  # outside the sample loop: nothing unsaved
            raise Interrupted(f"build of {config.out} interrupted by {signal_name(exc.signum)}; every sample "
                              f"finished before it is committed. Rerun the same command to resume.",
                              signum=exc.signum) from None


def _build(config: BuildConfig, backend: TargetBackend, inputs: InputIndex, verdict: str, stop: GracefulStop,
           t0: float) -> BuildSummary:
    renderer = ChatRenderer(backend.tokenizer, stop_ids=backend.stop_ids,
                            template_kwargs=config.chat_template_kwargs)
    header = make_header(config, backend)
    if verdict == "replace":
        replace_output(config.out)
    else:
        header = _check_existing_store(config, header, backend)
    summary = BuildSummary(store=config.out, worker_index=config.worker_index, num_workers=config.num_workers,
                           load_s=time.perf_counter() - t0)
    skipped: Counter[str] = Counter()
    writer: StoreWriter | None = None
    processor: _BatchProcessor | None = None
    committed: set[str] = set()
    interrupted: int | None = None
    try:
        with stop.deferred():  # opening (and recovering) the store is not cut in half
            writer = StoreWriter(config.out, header, worker_index=config.worker_index,
                                 num_workers=config.num_workers, shard_max_tokens=config.shard_max_tokens,
                                 storage_options=config.storage_options)
            committed = writer.done_sample_ids()
            # a resumed run meets the same bad input again: its file:line is recorded once
            for e in inputs.errors.messages():
                writer.record_error(**e)
            for file, line in inputs.errors.lines():
                writer.record_error(sample_id=None, file=file, line=line, reason="input_error")
        if inputs.errors:
            skipped["input_error"] += len(inputs.errors)

        def on_sample_error(s: InputSample, exc: Exception) -> str:
            if config.on_error == "raise":
                raise InputError(f"{s.file}:{s.line} (sample {s.sample_id!r}): {exc}") from exc
            return f"input_error: {exc}"

        summary.already_done = sum(sid in committed for sid in inputs.ids)
        # Samples an earlier run skipped while building them count as handled too (a line once
        # malformed that parses now was fixed: it is built)
        built_skips = tuple(r for r in SKIP_REASONS if r != "input_error")
        skipped_before = {sid for k, sid in enumerate(inputs.ids)
                          if sid not in committed and writer.is_skipped(*inputs.where(k), codes=built_skips)}
        summary.already_skipped = len(skipped_before)
        done = committed | skipped_before
        todo = {sid for sid in inputs.ids if sid not in done}
        bar = tqdm(total=len(todo), unit="sample", disable=not config.progress, dynamic_ncols=True,
                   desc=f"build w{config.worker_index}/{config.num_workers}, samples saved")
        progress = _Progress(bar, todo)
        processor = _BatchProcessor(config, backend, renderer, header, progress)
        with bar:
            for batch in stream_batches(config, inputs):   # the inputs read again, batch by batch
                if all(s.sample_id in done for s in batch):
                    continue
                progress.start_batch(sum(s.sample_id not in done for s in batch))
                results = processor.process(batch, on_sample_error)
                with stop.deferred():  # a batch's finished samples reach the writer together
                    for s, record, reason in results:
                        if s.sample_id in done:
                            continue  # committed by an earlier run; recomputed only for batch identity
                        if s.sample_id in processor.marker_warnings:
                            summary.template_markers += 1
                            if summary.template_markers <= _MARKER_WARNINGS_SHOWN:
                                note_to_stderr(processor.marker_warnings[s.sample_id])
                        if record is not None:
                            writer.add(record)
                            summary.samples_written += 1
                            summary.tokens_written += int(record.token_ids.shape[0])
                            summary.truncated += record.finish_reason == "truncated"
                        else:
                            skipped[reason.split(":", 1)[0]] += 1
                            writer.record_error(sample_id=s.sample_id, file=s.file, line=s.line, reason=reason)
                        progress.sample_done(s.sample_id)
    except StopRequested as exc:
        if writer is None:
            raise
        interrupted = exc.signum
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    with stop.deferred(raise_after=False):
        writer.close()  # commits the open shard: after an interruption a partial shard is a shard
    summary.generated_tokens = processor.generated_tokens if processor is not None else 0
    shards = writer.committed_shards()
    tokens = sum(s.num_tokens for s in shards)
    summary.bytes_per_token = sum(s.num_bytes for s in shards) / tokens if tokens else None
    summary.skipped = dict(skipped)
    summary.wall_s = time.perf_counter() - t0
    if interrupted is not None:
        now_done = writer.done_sample_ids()
        publish = ("" if config.num_workers == 1 else
                   f"; when every worker is done, run `osprey data merge {config.out}`")
        raise Interrupted(
            f"build of {config.out} interrupted by {signal_name(interrupted)}: {len(now_done - committed)} "
            f"finished sample(s) of this run committed, {len(now_done & set(inputs.ids))} of this "
            f"worker's {len(inputs)} samples now in the store; the batch in progress was dropped. Rerun the "
            f"same command to resume{publish}.", signum=interrupted)
    return summary
