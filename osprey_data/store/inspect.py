"""``inspect_store``: what is in a store and what it costs, from metadata only (fast).

Reads the manifest, each shard's commit record (file sizes) and table; never decodes hidden
states. Bytes per token are reported per logical array (``hidden`` = all its codec parts) and
compression ratios against the uncompressed logical size (bf16 for hidden states, 4 bytes for
top-k ids/log-probs).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from osprey_data.store.reader import StoreReader
from osprey_data.store.shard import TABLE_FILE, ZARR_DIR
from osprey_data.text import printable

__all__ = ["inspect_store", "format_inspection"]

_LOGICAL_ITEMSIZE = {"bfloat16": 2, "float32": 4, "int32": 4}


def _logical_array(stored_name: str) -> str:
    for base in ("final_hidden", "hidden"):
        if stored_name == base or stored_name.startswith(base + "_"):
            return base
    return stored_name


def inspect_store(url: str, storage_options: dict | None = None) -> dict[str, Any]:
    """Summary of the store at ``url`` as a JSON-ready dict."""
    r = StoreReader(url, storage_options=storage_options)
    m, h = r.manifest, r.header
    stored = defaultdict(int)
    table_bytes = other_bytes = 0
    domains: dict[str, dict[str, int]] = defaultdict(lambda: {"samples": 0, "tokens": 0})
    finish: dict[str, int] = defaultdict(int)
    loss_tokens = 0
    for k in range(r.num_shards):
        shard = r.shard(k)
        for rel, f in shard.commit["files"].items():
            if rel == TABLE_FILE:
                table_bytes += f["bytes"]
            elif rel.startswith(ZARR_DIR + "/") and rel.count("/") >= 2:
                stored[_logical_array(rel.split("/")[1])] += f["bytes"]
            else:
                other_bytes += f["bytes"]
        t = shard.table()
        for dom, n, fr, mask in zip(t.column("domain").to_pylist(), t.column("num_tokens").to_pylist(),
                                    t.column("finish_reason").to_pylist(), t.column("loss_mask").to_pylist()):
            domains[dom]["samples"] += 1
            domains[dom]["tokens"] += n
            finish[fr] += 1
            loss_tokens += sum(mask)
    N = max(1, m.num_tokens)
    arrays = {}
    for name, spec in m.arrays().items():
        per_tok = 1
        for s in spec["per_token_shape"]:
            per_tok *= s
        raw = per_tok * _LOGICAL_ITEMSIZE[spec["dtype"]] * m.num_tokens
        arrays[name] = {
            "codec": spec["codec"], "dtype": spec["dtype"], "per_token_shape": spec["per_token_shape"],
            "stored_bytes": stored[name], "bytes_per_token": stored[name] / N,
            "raw_bytes_per_token": raw / N,
            "compression_ratio": (raw / stored[name]) if stored[name] else None,
        }
    total = sum(s.num_bytes for s in m.shards)
    return {
        "url": url,
        "format_version": m.format_version,
        "target": h.target.to_dict(),
        "taps": {**h.taps.to_dict(), "sglang_ids": _safe(h.taps.to_sglang), "vllm_ids": h.taps.to_vllm()},
        "topk": h.topk, "hidden_codec": h.hidden_codec, "has_final_hidden": h.has_final_hidden,
        "generation": h.generation, "builder_version": h.builder_version,
        "build_fingerprint": h.build_fingerprint,
        "num_shards": len(m.shards), "num_samples": m.num_samples, "num_tokens": m.num_tokens,
        "loss_tokens": loss_tokens, "num_errors": m.num_errors,
        "domains": {k: dict(v) for k, v in sorted(domains.items())},
        "finish_reasons": dict(sorted(finish.items())),
        "arrays": arrays,
        "table_bytes": table_bytes, "metadata_bytes": other_bytes,
        "total_bytes": total, "bytes_per_token": total / N,
    }


def _safe(fn):
    try:
        return fn()
    except Exception as exc:  # tap 0 has no SGLang id
        return f"n/a ({exc})"


def format_inspection(d: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`inspect_store`'s dict (control characters of the store's
    strings — domains, names — escaped, so a crafted store cannot forge lines or drive the terminal)."""
    t = d["target"]
    lines = [
        f"store        {d['url']}  (format v{d['format_version']})",
        f"target       {t['name_or_path']} [{t['model_type']}] vocab={t['vocab_size']} "
        f"hidden={t['hidden_size']} layers={t['num_layers']} dtype={t['dtype']}",
        f"taps         {d['taps']['layer_ids']} ({d['taps']['convention']}); "
        f"SGLang ids {d['taps']['sglang_ids']}, vLLM ids {d['taps']['vllm_ids']}",
        f"codec        hidden={d['hidden_codec']} top-k={d['topk']} final_hidden={d['has_final_hidden']}",
        f"contents     {d['num_samples']} samples, {d['num_tokens']} tokens "
        f"({d['loss_tokens']} with loss), {d['num_shards']} shards, {d['num_errors']} build errors",
        f"size         {d['total_bytes']:,} bytes = {d['bytes_per_token']:.1f} bytes/token",
        "domains      " + ", ".join(f"{k}: {v['samples']} samples / {v['tokens']} tokens"
                                    for k, v in d["domains"].items()),
        "finish       " + ", ".join(f"{k}: {v}" for k, v in d["finish_reasons"].items()),
        "arrays:",
    ]
    for name, a in d["arrays"].items():
        ratio = f"{a['compression_ratio']:.2f}x" if a["compression_ratio"] else "-"
        lines.append(f"  {name:<14} {a['codec']:<10} {a['bytes_per_token']:>10.1f} B/token "
                     f"(raw {a['raw_bytes_per_token']:.0f}, compression {ratio})")
    return "\n".join(printable(line) for line in lines)
