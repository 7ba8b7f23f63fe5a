#!/usr/bin/env bash
# hookbox against its floor, in one run on this machine: pgbench running the SQL hookbox runs
# per new event and per replay, then a release `hookbox serve` taking fresh and replayed Stripe
# deliveries at 1, 8, 32 and 128 connections. Prints throughput, latency, errors, the server's
# peak RSS, and each hookbox/floor ratio.
#
#   bench/run.sh                          # PostgreSQL at 127.0.0.1:5432, user postgres
#   SECONDS_EACH=3 CONNECTIONS="1 32" bench/run.sh     # shorter (CI runs a smoke like this)
#   DATABASE_URL=postgres://postgres:secret@127.0.0.1:5433/postgres bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH="${SECONDS_EACH:-10}"
CONNECTIONS="${CONNECTIONS:-1 8 32 128}"
FLOOR_CLIENTS="${FLOOR_CLIENTS:-32}"
BENCH_NAME=run
# shellcheck source=bench/common.sh
. bench/common.sh
cat > "$work/hookbox.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
[database]
url = "$db_url"
pool_size = ${POOL_SIZE:-8}
[sources.stripe]
scheme = "stripe"
secrets = ["$secret"]
TOML
"$hookbox" migrate --config "$work/hookbox.toml" >/dev/null

# The floor: the statements hookbox sends for one new event and for one replay (see
# inbox/mod.rs), with a body of the same size, through pgbench's prepared statements.
payload=$(printf 'x%.0s' $(seq 1 1500))
# Every value that differs per event in hookbox differs per transaction here too (built from
# :n), so the server parses and stores as much as it does for hookbox.
cat > "$work/fresh.sql" <<SQL
\set n random(1, 1000000000000)
INSERT INTO events (source, event_id, event_type, fingerprint, received_at, payload, headers, response_status, response_content_type, response_body) VALUES ('stripe', 'evt_floor_' || :client_id || '_' || :n, 'payment_intent.succeeded', sha256(:n::text::bytea), now(), convert_to('$payload' || :n, 'UTF8'), ('{"content-type": "application/json", "stripe-signature": "t=' || :n || ',v1=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}')::jsonb, 200, 'application/json', convert_to('{"event_id":"evt_floor_' || :n || '","event_type":"payment_intent.succeeded","received_at":"2026-12-02T10:00:00.000000Z","source":"stripe","status":"processed"}', 'UTF8')) ON CONFLICT (source, event_id) DO NOTHING RETURNING id;
SQL
cat > "$work/replay.sql" <<SQL
\set n random(1, 256)
SELECT fingerprint, received_at, response_status, response_content_type, response_body FROM events WHERE source = 'stripe' AND event_id = 'evt_floor_seed_' || :n LIMIT 1;
SQL
psql "$db_url" -qc "INSERT INTO events (source, event_id, fingerprint, payload, headers, response_status, response_content_type, response_body) SELECT 'stripe', 'evt_floor_seed_' || g, sha256(g::text::bytea), convert_to('$payload', 'UTF8'), '{}', 200, 'application/json', convert_to('{}', 'UTF8') FROM generate_series(1, 256) g"

floor() {
  pgbench -n -M prepared -c "$FLOOR_CLIENTS" -j 2 -T "$SECONDS_EACH" -f "$1" "$db_url" 2>/dev/null \
    | sed -nE 's/^tps = ([0-9.]+).*/\1/p'
}
echo "floor: pgbench, $FLOOR_CLIENTS clients, $SECONDS_EACH s each..." >&2
floor_fresh=$(floor "$work/fresh.sql")
floor_replay=$(floor "$work/replay.sql")
psql "$db_url" -qc "TRUNCATE events, deliveries" >/dev/null

start_server
"$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections 8 --seconds 2 >/dev/null

field() { sed -E "s/.*\"$1\":([0-9.]+).*/\1/"; }
ratio() { echo "scale=2; $1 / $2" | bc; }

printf '%-8s %5s %9s %9s %9s %7s %7s\n' mode conns "req/s" "p50 ms" "p99 ms" errors "/floor"
printf '%-8s %5s %9.0f %9s %9s %7s %7s\n' floor "$FLOOR_CLIENTS" "$floor_fresh" - - - "(fresh)"
printf '%-8s %5s %9.0f %9s %9s %7s %7s\n' floor "$FLOOR_CLIENTS" "$floor_replay" - - - "(lookup)"
for mode in fresh replay; do
  for c in $CONNECTIONS; do
    out=$("$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections "$c" --seconds "$SECONDS_EACH" --mode "$mode")
    rps=$(echo "$out" | field rps)
    floor_value=$floor_fresh; [ "$mode" = replay ] && floor_value=$floor_replay
    printf '%-8s %5s %9.0f %9s %9s %7s %7s\n' "$mode" "$c" "$rps" "$(echo "$out" | field p50_ms)" \
      "$(echo "$out" | field p99_ms)" "$(echo "$out" | field errors)" "$(ratio "$rps" "$floor_value")"
  done
done
echo "server peak RSS: $(awk '/VmHWM/ {printf "%.1f MB", $2/1024}' "/proc/$server_pid/status")"
