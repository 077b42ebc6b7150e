"""Synthetic headers and records for store tests (tiny sizes, deterministic)."""

from __future__ import annotations

import numpy as np

from osprey_data.store import SampleRecord, StoreHeader, TapLayers, TargetIdentity

VOCAB, D, K, TAPS = 500, 64, 8, (2, 3, 5)


def make_header(codec: str = "bf16-blosc", *, final_hidden: bool = False, config_hash: str = "cfg",
                topk: int = K) -> StoreHeader:
    target = TargetIdentity(name_or_path="tiny-llama", model_type="llama", config_hash=config_hash,
                            tokenizer_hash="tok", vocab_size=VOCAB, hidden_size=D, num_layers=6,
                            dtype="float32")
    return StoreHeader(target=target, taps=TapLayers(layer_ids=TAPS), topk=topk, hidden_codec=codec,
                       has_final_hidden=final_hidden, chat_template_hash="tmpl",
                       generation={"greedy": True, "max_new_tokens": 16, "seed": 0},
                       build_fingerprint="fp", build_config={"n": 1}, builder_version="test")


def make_record(i: int, *, T: int | None = None, final_hidden: bool = False, seed: int = 0,
                domain: str | None = None, outliers: bool = False) -> SampleRecord:
    rng = np.random.default_rng(seed * 100_003 + i)
    T = T or int(rng.integers(3, 30))
    hidden = rng.standard_normal((T, len(TAPS), D)).astype(np.float32) * 2.0
    if outliers:  # massive-activation channels like real LLMs
        hidden[:, :, 7] = 26624.0 * np.sign(rng.standard_normal((T, len(TAPS))))
        hidden[:, :, 40] = -900.0
    lp = -np.sort(rng.random((T, K)).astype(np.float32) * 6, axis=1)
    return SampleRecord(
        sample_id=f"sample-{i:05d}", domain=domain or ("chat", "code", "math")[i % 3], source="synthetic",
        conversation=[{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "ok"}],
        token_ids=rng.integers(0, VOCAB, T).astype(np.int32), loss_mask=rng.random(T) > 0.4,
        prompt_length=min(2, T), finish_reason="stop", hidden_TLD=hidden,
        topk_ids_TK=rng.integers(0, VOCAB, (T, K)).astype(np.int32), topk_logprobs_TK=lp,
        final_hidden_TD=rng.standard_normal((T, D)).astype(np.float32) if final_hidden else None,
    )


def bf16_round(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).to(torch.float32).numpy()


def check_content(reader, ids_expected) -> None:
    """The reader holds exactly the samples ``ids_expected`` (sample ids), with their values."""
    ids = [s.sample_id for s in reader.iter_samples()]
    assert sorted(ids) == sorted(ids_expected) and len(set(ids)) == len(ids)
    for s in reader.iter_samples():
        ref = make_record(int(s.sample_id.split("-")[1]))
        np.testing.assert_array_equal(s.token_ids, ref.token_ids)
        np.testing.assert_array_equal(s.hidden_TLD, bf16_round(ref.hidden_TLD))
        np.testing.assert_array_equal(s.topk_logprobs_TK, ref.topk_logprobs_TK)


def write_records(url: str, indices, *, worker: int = 0, num_workers: int = 1, shard_tokens: int = 60) -> None:
    """Write ``make_record(i)`` for ``i`` in ``indices`` as one worker (bf16 header)."""
    from osprey_data.store import StoreWriter

    with StoreWriter(url, make_header("bf16"), worker_index=worker, num_workers=num_workers,
                     shard_max_tokens=shard_tokens) as w:
        for i in indices:
            w.add(make_record(i))


def ids(indices) -> list[str]:
    return [make_record(i).sample_id for i in indices]
