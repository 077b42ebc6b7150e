"""Builder inputs at scale: memory of N input records, journal of N skipped records (issue #25).

Measured in one run, each figure against the way it was done before, in the same run:

* **memory**: peak RSS of holding this worker's N tiny prompt records (one short ``prompt`` each)
  as the builder does now (:func:`osprey_data.builder.input_index.index_inputs`: ids, files and
  lines in compact arrays, then the records read again batch by batch by ``stream_batches``, both
  passes inside the peak) vs as it did before (every
  record a full ``InputSample`` in a list: ``list(iter_inputs(...))``). Each in a fresh
  subprocess; the figure is peak RSS minus the RSS after imports, per record.
* **journal**: N consecutive malformed lines recorded by a ``StoreWriter`` (the builder's path for
  ``--on-error skip``) vs the same N entries written in the previous journal format (every entry
  in full, ``json.dumps(indent=1)``): journal bytes, and the wall time of ``osprey data merge``
  (``merge_store``) on each store (best of 3; merge reads and schema-checks every journal).

``--quick`` (< 60 s): N = 20,000. Default N = 100,000 (10^6 works, ``--records 1000000``, but
takes minutes for the baseline on a busy 2-core machine). Ends with one ``RESULT`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_MEASURE = r"""
import resource, sys
from osprey_data.builder.config import BuildConfig
from osprey_data.builder.input_index import index_inputs, stream_batches
from osprey_data.conversation import iter_inputs
def rss_kb():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:"))
mode, path = sys.argv[1], sys.argv[2]
before = rss_kb()
if mode == "before":
    held = list(iter_inputs([path]))
else:
    cfg = BuildConfig(target="unused", inputs=(path,), out=path + ".store")
    held = index_inputs(cfg)
    for batch in stream_batches(cfg, held):   # the second pass, as the build loop runs it
        pass
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before, peak, len(held))
"""


def write_prompts(path: Path, n: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"prompt": f"What is {i} plus {i}?", "domain": "math"}) + "\n")


def measure_memory(path: Path, mode: str) -> tuple[float, int]:
    """(bytes per record over the post-import RSS, records held) in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, mode, str(path)], check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    before_kb, peak_kb, n = (int(x) for x in out.stdout.split())
    return (peak_kb - before_kb) * 1024 / n, n


def journal_stores(root: Path, n: int) -> tuple[str, str]:
    """Two one-shard stores whose journal records ``n`` skipped lines: the current format and the
    previous one (every entry in full)."""
    from osprey_data.store import StoreWriter
    from tests.data.store.helpers import make_header, make_record

    new, old = str(root / "new"), str(root / "old")
    writer = StoreWriter(new, make_header(), shard_max_tokens=60)
    for line in range(1, n + 1):
        writer.record_error(sample_id=f"id{line:07d}", file="/data/prompts.jsonl", line=line,
                            reason=f"input_error: /data/prompts.jsonl:{line}: not valid JSON (Expecting value)")
    writer.add(make_record(0))
    writer.close()
    shutil.copytree(new, old)
    journal = Path(old) / "workers" / "w000of001.json"
    doc = json.loads(journal.read_text())
    doc.pop("skipped"), doc.pop("num_errors")
    doc["errors"] = [{"sample_id": f"id{line:07d}", "file": "/data/prompts.jsonl", "line": line,
                      "reason": f"input_error: /data/prompts.jsonl:{line}: not valid JSON (Expecting value)"}
                     for line in range(1, n + 1)]
    journal.write_text(json.dumps(doc, indent=1))   # exactly how the previous writer wrote it
    return new, old


def merge_seconds(url: str, repeats: int) -> float:
    from osprey_data.store.merge import merge_store

    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        merge_store(url)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000, help="N: input records and skipped records")
    ap.add_argument("--quick", action="store_true", help="N = 20,000 (< 60 s)")
    args = ap.parse_args()
    n = 20_000 if args.quick else args.records
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="osprey-input-bench-") as tmp:
        root = Path(tmp)
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, n)
        file_bytes = prompts.stat().st_size / n
        t0 = time.perf_counter()
        before_b, _ = measure_memory(prompts, "before")
        t_before = time.perf_counter() - t0
        t0 = time.perf_counter()
        after_b, _ = measure_memory(prompts, "after")
        t_after = time.perf_counter() - t0
        print(f"memory of {n} tiny records ({file_bytes:.0f} bytes each in the file), peak RSS over imports:")
        print(f"  before (every record a full InputSample): {before_b:7.0f} B/record ({t_before:.1f} s)")
        print(f"  now    (compact index, read again later): {after_b:7.0f} B/record ({t_after:.1f} s, both passes)")
        new, old = journal_stores(root, n)
        new_bytes = (Path(new) / "workers" / "w000of001.json").stat().st_size
        old_bytes = (Path(old) / "workers" / "w000of001.json").stat().st_size
        new_s, old_s = merge_seconds(new, 3), merge_seconds(old, 3)
        print(f"journal of {n} skipped records:")
        print(f"  before (every entry in full): {old_bytes / 1e6:9.3f} MB, merge {old_s:7.3f} s")
        print(f"  now    (runs + 20 messages):  {new_bytes / 1e6:9.3f} MB, merge {new_s:7.3f} s")
    print(f"(load average {load:.1f} on {os.cpu_count()} cores at the start)")
    print(f"RESULT records={n} mem_before_B={before_b:.0f} mem_after_B={after_b:.0f} "
          f"mem_ratio={before_b / after_b:.2f} journal_before_B={old_bytes} journal_after_B={new_bytes} "
          f"journal_ratio={old_bytes / new_bytes:.0f} merge_before_s={old_s:.3f} merge_after_s={new_s:.3f} "
          f"merge_ratio={old_s / max(new_s, 1e-9):.1f} load={load:.1f}")


if __name__ == "__main__":
    main()
