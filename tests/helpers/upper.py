"""A stand-in for an existing converter script, run by the `command` job's tests on the
Compute Engine stand-in: INPUT OUTPUT_DIR SEED -> OUTPUT_DIR/upper.txt (the input upper-cased)
and OUTPUT_DIR/stats.json. It knows nothing of fleet."""

import json
import os
import sys

src, out, seed = sys.argv[1], sys.argv[2], sys.argv[3]
with open(src, "rb") as f:
    data = f.read()
with open(os.path.join(out, "upper.txt"), "wb") as f:
    f.write(data.upper())
with open(os.path.join(out, "stats.json"), "w") as f:
    json.dump({"bytes": len(data), "lines": data.count(b"\n"), "seed": int(seed)}, f, sort_keys=True)
