#!/bin/bash
# One simulated job shipped as the deployed path ships it: its log split by host, one
# `holmes agent --once` per host into a real `holmes serve` on loopback; prints the service's
# database size and writes its verdict (`holmes jobs JOB --analyze --json`).
#
# usage: scripts/agents_by_host.sh SIM_DIR PORT OUT_JSON
#   SIM_DIR   a `holmes simulate ... --out SIM_DIR` directory (its ops.parquet is split)
#   PORT      a free loopback port
#   OUT_JSON  where the verdict goes
# For comparing two commits, run it with PYTHONPATH set to a worktree of the other one and
# compare the two OUT_JSON without their `version` and `computed_at`. This is how the store's
# packed layout was checked:
#   holmes simulate --gpus 128 --iterations 30 --fault nic_slow:rank=9,severity=2 --out sim128
#   scripts/agents_by_host.sh sim128 18770 verdict.json
set -euo pipefail
SIM=$1; PORT=$2; OUT=$3
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
HOLMES=${HOLMES:-$HERE/.venv/bin/holmes}
W=$(mktemp -d)
trap 'kill $SP 2>/dev/null || true; rm -rf "$W"' EXIT
"$PY" - "$SIM" "$W" <<'PYEOF'
import os, sys
import pandas as pd
ops = pd.read_parquet(os.path.join(sys.argv[1], "ops.parquet"))
for host, part in ops.groupby("host", observed=True):
    os.makedirs(os.path.join(sys.argv[2], "logs", str(host)))
    part.to_parquet(os.path.join(sys.argv[2], "logs", str(host), "ops.parquet"))
PYEOF
"$HOLMES" serve --db "$W/s.db" --port "$PORT" --analyze-every 3600 > "$W/serve.log" 2>&1 &
SP=$!
for _ in $(seq 50); do grep -q "listening on" "$W/serve.log" && break; sleep 0.2; done
for d in "$W"/logs/*; do
  "$HOLMES" agent --follow "$d" --server "http://127.0.0.1:$PORT" --job j \
    --source "$(basename "$d")" --once > /dev/null
done
"$HOLMES" jobs j --server "http://127.0.0.1:$PORT" --analyze --json > "$OUT"
kill $SP; wait $SP 2>/dev/null || true
"$PY" -c "
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1]); db.execute('PRAGMA wal_checkpoint(TRUNCATE)'); db.close()
print(f'database: {os.path.getsize(sys.argv[1]):,} bytes after a checkpoint')" "$W/s.db"
