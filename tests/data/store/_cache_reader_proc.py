"""Child process for the shared-cache test: read a store through a cache in random order.

Usage: python -m tests.data.store._cache_reader_proc STORE CACHE PASSES SEED
Exit 0 when every sample read has the values written (see ``helpers.make_record``).
"""

from __future__ import annotations

import random
import sys

import numpy as np

from osprey_data.store import StoreReader
from tests.data.store.helpers import bf16_round, make_record


def main() -> None:
    url, cache, passes, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    for _ in range(passes):
        r = StoreReader(url, cache=cache)
        order = list(range(len(r)))
        rng.shuffle(order)
        for i in order:
            s = r.sample(i)
            ref = make_record(int(s.sample_id.split("-")[1]))
            np.testing.assert_array_equal(s.hidden_TLD, bf16_round(ref.hidden_TLD))


if __name__ == "__main__":
    main()
