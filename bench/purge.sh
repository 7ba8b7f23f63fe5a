#!/usr/bin/env bash
# Delivery throughput while `hookbox purge` removes a million expired events, against the same
# load without the purge, in one run on this machine. Prints both and their ratio.
#
#   bench/purge.sh                     # PostgreSQL at 127.0.0.1:5432, user postgres
#   ROWS=200000 CONNECTIONS=16 bench/purge.sh
#   DATABASE_URL=postgres://postgres:secret@127.0.0.1:5433/postgres bench/purge.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS="${ROWS:-1000000}"
CONNECTIONS="${CONNECTIONS:-32}"
SECONDS_BASE="${SECONDS_BASE:-10}"
BENCH_NAME=purge
# shellcheck source=bench/common.sh
. bench/common.sh
cat > "$work/hookbox.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
[database]
url = "$db_url"
pool_size = 16
[retention]
window = "72h"
purge_interval = "24h"
[sources.stripe]
scheme = "stripe"
secrets = ["$secret"]
TOML

start_server

load() { "$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections "$CONNECTIONS" "$@"; }
rps() { sed -E 's/.*"rps":([0-9.]+).*/\1/'; }

echo "warming up..." >&2
load --seconds 3 >/dev/null

echo "baseline: $SECONDS_BASE s of fresh deliveries at $CONNECTIONS connections, no purge" >&2
base=$(load --seconds "$SECONDS_BASE")
echo "without purge: $base"

echo "inserting $ROWS expired events (~1.5 KB each)..." >&2
psql "$db_url" -q <<SQL
INSERT INTO events (source, event_id, fingerprint, received_at, payload, headers,
                    response_status, response_content_type, response_body)
SELECT 'stripe', 'evt_expired_' || g, sha256(g::text::bytea), now() - interval '10 days',
       convert_to(repeat('x', 1500), 'UTF8'), '{"content-type": "application/json"}',
       200, 'application/json', convert_to('{"status":"processed"}', 'UTF8')
FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE events;
SQL

echo "purging $ROWS expired events under the same load..." >&2
start=$(date +%s.%N)
"$hookbox" purge --config "$work/hookbox.toml" >"$work/purge.out" 2>"$work/purge.log" &
purge_pid=$!
during=$(load --while-pid "$purge_pid")
wait "$purge_pid"
end=$(date +%s.%N)
echo "during purge:  $during"
echo "purge:         $(tail -n 1 "$work/purge.out") — wall $(echo "$end - $start" | bc) s"

ratio=$(echo "scale=3; $(echo "$during" | rps) / $(echo "$base" | rps)" | bc)
echo "throughput during purge / without: $ratio"
