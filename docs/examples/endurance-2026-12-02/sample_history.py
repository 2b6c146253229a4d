"""Make history-sample.jsonl.gz from a run's history.jsonl: every nemesis,
monitor and harness op whole, and one request in 20 (its invoke and its
completion) without the bulky stream fields. A sample to read, not a
history to re-judge (no chunk trailers, most requests left out).

    python sample_history.py RUN_DIR/history.jsonl history-sample.jsonl.gz
"""

import gzip
import json
import sys

BULKY = ("stream", "itl_ms", "token_ids", "text", "chunks")
EVERY = 20


def main(src: str, dst: str) -> None:
    kept = seen = 0
    with open(src, encoding="utf-8") as f, gzip.open(dst, "wt", encoding="utf-8") as out:
        for line in f:
            try:
                op = json.loads(line)
            except ValueError:
                continue
            if "chunk" in op and "crc32c" in op:
                continue  # a chunk trailer
            seen += 1
            process = op.get("process")
            if isinstance(process, int):
                if process % EVERY:
                    continue
                op["value"] = {k: v for k, v in (op.get("value") or {}).items()
                               if k not in BULKY}
            out.write(json.dumps(op, separators=(",", ":")) + "\n")
            kept += 1
    print(f"{kept} of {seen} ops kept in {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
