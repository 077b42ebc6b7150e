"""Choosing the prompts of a study's train and held-out stores.

Two ways, both deterministic: a seeded random subset of a prompt file (``sample_prompts``; more
samples keep the ones chosen before, so growing a study only adds prompts), and the demo's split of
one file into train and held-out prompts (``split_prompts``: the held-out ones are the last of each
domain, taken round-robin over domains, and do not depend on how many train prompts are asked for).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

from osprey_data.conversation import read_records
from osprey_data.errors import InputError

__all__ = ["sample_prompts", "split_prompts"]


def sample_prompts(records: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` records (all if fewer) chosen by a seeded hash of their id, kept in file order."""

    def rank(i: int) -> str:
        ident = records[i].get("id", json.dumps(records[i], sort_keys=True))
        return hashlib.sha256(f"{seed}:{ident}".encode()).hexdigest()

    chosen = sorted(range(len(records)), key=rank)[:n]
    return [records[i] for i in sorted(chosen)]


def split_prompts(path: str | Path, train_n: int, eval_n: int) -> tuple[list[dict], list[dict]]:
    """Held-out eval prompts = the last ones of each domain; both picked round-robin over domains."""
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for record in read_records(path):
        by_domain[str(record.get("domain") or "default")].append(record)
    trains = {d: list(v) for d, v in by_domain.items()}

    def round_robin(pools: dict[str, list[dict]], n: int, take_last: bool) -> list[dict]:
        out: list[dict] = []
        while len(out) < n and any(pools.values()):
            for d in by_domain:
                if pools[d] and len(out) < n:
                    out.append(pools[d].pop() if take_last else pools[d].pop(0))
        return out

    eval_records = round_robin(trains, eval_n, take_last=True)  # removes them from the train pools
    train_records = round_robin(trains, train_n, take_last=False)
    if not train_records or not eval_records:
        raise InputError(f"{path}: {sum(map(len, by_domain.values()))} prompts are too few for "
                         f"{train_n} train + {eval_n} eval")
    return train_records, eval_records
