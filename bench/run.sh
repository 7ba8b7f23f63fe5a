#!/usr/bin/env bash
# hookbox against its floor, in one run on this machine, on each store. PostgreSQL: pgbench
# running the SQL hookbox runs per new event and per replay, then a release `hookbox serve`
# taking fresh and replayed Stripe deliveries at 1, 8, 32 and 128 connections, then fresh
# deliveries of each representative scheme (PayPal RSA, Square, Braintree form, an Adyen batch of
# ten items, a GoCardless batch of one event, SendGrid's ECDSA P-256 over a batch of one event,
# Standard Webhooks' Ed25519 v1a) beside Stripe's, at 32 connections, each with its ratio to Stripe's in the same step (deliveries a second: an Adyen
# delivery is ten events). SQLite: the same Stripe
# deliveries against a release `hookbox serve` on a fresh SQLite file in the work directory,
# with a floor from the sqlite3 CLI when it is installed (the same INSERT and SELECT, in WAL
# mode with synchronous=FULL; none otherwise, and the table says so). Prints throughput,
# latency, errors, each server's peak RSS, and each hookbox/floor ratio.
#
#   bench/run.sh                          # PostgreSQL at 127.0.0.1:5432, user postgres
#   SECONDS_EACH=3 CONNECTIONS="1 32" bench/run.sh     # shorter (CI runs a smoke like this)
#   DATABASE_URL=postgres://postgres:secret@127.0.0.1:5433/postgres bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH="${SECONDS_EACH:-10}"
# The scheme rows: this many fresh deliveries per scheme, built and signed before the clock
# starts (PayPal's RSA signature would otherwise be paid for on the cores the server shares).
SCHEME_REQUESTS="${SCHEME_REQUESTS:-$((2000 * SECONDS_EACH))}"
SCHEME_CONNECTIONS="${SCHEME_CONNECTIONS:-32}"
CONNECTIONS="${CONNECTIONS:-1 8 32 128}"
FLOOR_CLIENTS="${FLOOR_CLIENTS:-32}"
BENCH_NAME=run
# shellcheck source=bench/common.sh
. bench/common.sh
# The loadgen serves PayPal's certificate here for the paypal rows: below both the server's
# port range and the ephemeral ports the load generator's own connections take.
cert_port=$((10000 + $$ % 10000))
# SendGrid's rows sign with a P-256 key made for this run; the source lists its public half, as
# SendGrid's dashboard shows it (base64 DER). The Standard Webhooks v1a rows sign with an
# Ed25519 key made likewise; the source lists it as whpk_ + base64 of its 32 bytes.
openssl ecparam -name prime256v1 -genkey -noout -out "$work/sendgrid.pem" 2>/dev/null
sendgrid_key=$(openssl ec -in "$work/sendgrid.pem" -pubout -outform DER 2>/dev/null | base64 -w0)
openssl genpkey -algorithm ed25519 -out "$work/v1a.pem" 2>/dev/null
v1a_key=$(openssl pkey -in "$work/v1a.pem" -pubout -outform DER | tail -c 32 | base64 -w0)
# The server's config, the same on both stores but for the database URL. The loadgen signs
# each source's deliveries from this same file, as `hookbox send --config` does.
config_for() {
  cat <<TOML
[server]
listen = "127.0.0.1:$port"
[database]
url = "$1"
pool_size = ${POOL_SIZE:-8}
[sources.stripe]
scheme = "stripe"
secrets = ["$secret"]
[sources.paypal]
scheme = "paypal"
webhook_id = "1BENCH0WEBHOOK0ID"
cert_urls = ["http://127.0.0.1:$cert_port/certs/"]
[sources.square]
scheme = "square"
secrets = ["sq-bench-signature-key"]
public_url = "http://127.0.0.1:$port/webhooks/square"
[sources.braintree]
scheme = "braintree"
secrets = ["bt-bench-private-key"]
public_key = "btbenchpublickey"
[sources.adyen]
scheme = "adyen"
secrets = ["44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"]
[sources.gocardless]
scheme = "gocardless"
secrets = ["gc-bench-webhook-secret"]
[sources.sendgrid]
scheme = "sendgrid"
public_keys = ["$sendgrid_key"]
[sources.standard]
scheme = "standard"
public_keys = ["whpk_$v1a_key"]
TOML
}
config_for "$db_url" > "$work/hookbox.toml"
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

field() { sed -E "s/.*\"$1\":([0-9.]+).*/\1/"; }
ratio() { printf "%.2f" "$(echo "scale=4; $1 / $2" | bc)"; }
rss() { awk '/VmHWM/ {printf "%.1f MB", $2/1024}' "/proc/$server_pid/status"; }

# One row of the table: store, mode, connections, req/s, p50, p99, errors, ratio to the floor.
row() { printf '%-8s %-8s %5s %9.0f %9s %9s %7s %7s\n' "$@"; }
# The loadgen runs of one store against the server on $port: fresh, then replay, at each
# connection count. $2 and $3 are the fresh and lookup floors ("" for none).
deliveries() {
  local store=$1 floor_fresh=$2 floor_replay=$3 mode c out rps floor_value
  for mode in fresh replay; do
    for c in $CONNECTIONS; do
      out=$("$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections "$c" --seconds "$SECONDS_EACH" --mode "$mode")
      rps=$(echo "$out" | field rps)
      floor_value=$floor_fresh; [ "$mode" = replay ] && floor_value=$floor_replay
      row "$store" "$mode" "$c" "$rps" "$(echo "$out" | field p50_ms)" "$(echo "$out" | field p99_ms)" \
        "$(echo "$out" | field errors)" "$([ -n "$floor_value" ] && ratio "$rps" "$floor_value" || echo -)"
    done
  done
}

# The scheme rows, on the server on $port: SCHEME_REQUESTS fresh deliveries of each source at
# SCHEME_CONNECTIONS, Stripe's first, each signed by the provider's signing code in the library
# from the server's own config; each row's ratio is to Stripe's row of this step.
schemes() {
  local store=$1 source out rps stripe_rps="" signing
  for source in stripe paypal square braintree adyen gocardless sendgrid standard; do
    signing=()
    [ "$source" = paypal ] && signing=(--serve-cert "127.0.0.1:$cert_port")
    [ "$source" = sendgrid ] && signing=(--key "$work/sendgrid.pem")
    [ "$source" = standard ] && signing=(--key "$work/v1a.pem")
    out=$("$loadgen" --to "http://127.0.0.1:$port" --config "$work/hookbox.toml" --source "$source" \
      --connections "$SCHEME_CONNECTIONS" --prebuilt "$SCHEME_REQUESTS" ${signing[@]+"${signing[@]}"})
    rps=$(echo "$out" | field rps)
    [ -n "$stripe_rps" ] || stripe_rps=$rps
    printf '%-8s %-9s %5s %9.0f %9s %9s %7s %8s\n' "$store" "$source" "$SCHEME_CONNECTIONS" "$rps" \
      "$(echo "$out" | field p50_ms)" "$(echo "$out" | field p99_ms)" "$(echo "$out" | field errors)" \
      "$(ratio "$rps" "$stripe_rps")"
  done
}

start_server
"$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections 8 --seconds 2 >/dev/null

printf '%-8s %-8s %5s %9s %9s %9s %7s %7s\n' store mode conns "req/s" "p50 ms" "p99 ms" errors "/floor"
row postgres floor "$FLOOR_CLIENTS" "$floor_fresh" - - - "(fresh)"
row postgres floor "$FLOOR_CLIENTS" "$floor_replay" - - - "(lookup)"
deliveries postgres "$floor_fresh" "$floor_replay"
echo
printf '%-8s %-9s %5s %9s %9s %9s %7s %8s\n' store scheme conns "req/s" "p50 ms" "p99 ms" errors "/stripe"
schemes postgres
echo
pg_rss=$(rss)
stop_server

# SQLite: the same deliveries against a fresh file, after a floor on a file of its own.
config_for "sqlite://$work/hookbox.db" > "$work/sqlite.toml"
sqlite_floor_fresh="" sqlite_floor_replay=""
if command -v sqlite3 >/dev/null 2>&1; then
  # The floor: the INSERT hookbox sends for a new event on SQLite, one per commit, from one
  # sqlite3 process (SQLite lets one writer in at a time; more processes would only wait for
  # the lock), and the indexed SELECT of a stored response, from one process per core (WAL
  # readers run side by side). Per-event values come from random(), so every row differs.
  printf '[database]\nurl = "sqlite://%s/floor.db"\n' "$work" > "$work/floor.toml"
  "$hookbox" migrate --config "$work/floor.toml" >/dev/null
  pragmas="PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 10000;"
  insert="WITH r(n) AS (SELECT abs(random())) INSERT INTO events (source, event_id, event_type, fingerprint, received_at, payload, headers, response_status, response_content_type, response_body) SELECT 'stripe', 'evt_floor_' || n, 'payment_intent.succeeded', sha3(n, 256), strftime('%Y-%m-%d %H:%M:%f+00:00', 'now'), CAST('$payload' || n AS BLOB), '{\"content-type\": \"application/json\", \"stripe-signature\": \"t=' || n || ',v1=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}', 200, 'application/json', CAST('{\"event_id\":\"evt_floor_' || n || '\",\"event_type\":\"payment_intent.succeeded\",\"received_at\":\"2026-12-02T10:00:00.000000Z\",\"source\":\"stripe\",\"status\":\"processed\"}' AS BLOB) FROM r WHERE true ON CONFLICT (source, event_id) DO NOTHING RETURNING id;"
  lookup="WITH r(n) AS (SELECT abs(random()) % 256 + 1) SELECT fingerprint, received_at, response_status, response_content_type, response_body FROM events, r WHERE source = 'stripe' AND event_id = 'evt_floor_seed_' || r.n LIMIT 1;"
  for _ in $(seq 1 200); do echo "$insert"; done > "$work/sqlite_fresh.sql"
  for _ in $(seq 1 5000); do echo "$lookup"; done > "$work/sqlite_lookup.sql"
  sqlite3 "$work/floor.db" "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 256) INSERT INTO events (source, event_id, fingerprint, received_at, payload, headers, response_status, response_content_type, response_body) SELECT 'stripe', 'evt_floor_seed_' || n, sha3(n, 256), strftime('%Y-%m-%d %H:%M:%f+00:00', 'now'), CAST('$payload' AS BLOB), '{}', 200, 'application/json', CAST('{}' AS BLOB) FROM g"

  # Statements a second: $2 sqlite3 processes, each on one connection for SECONDS_EACH (as
  # hookbox keeps its connections), fed the script $1 (of $3 statements) over and over; summed
  # over the processes. Each counts until its sqlite3 has run everything it was fed.
  sqlite_floor() {
    local script=$1 processes=$2 per_run=$3 i pids=()
    for i in $(seq 1 "$processes"); do
      (
        start=$EPOCHREALTIME
        {
          echo "$pragmas"
          n=0
          until [ "$(echo "$EPOCHREALTIME - $start >= $SECONDS_EACH" | bc)" = 1 ]; do
            cat "$script"
            n=$((n + per_run))
          done
          echo "$n" > "$work/floor_count_$i"
        } | sqlite3 -bail "$work/floor.db" >/dev/null
        echo "$(cat "$work/floor_count_$i") / ($EPOCHREALTIME - $start)" | bc -l
      ) > "$work/floor_rate_$i" &
      pids+=($!)
    done
    wait "${pids[@]}"
    cat "$work"/floor_rate_* | paste -sd+ - | bc
    rm -f "$work"/floor_rate_* "$work"/floor_count_*
  }
  echo "sqlite floor: sqlite3, $SECONDS_EACH s each..." >&2
  sqlite_floor_fresh=$(sqlite_floor "$work/sqlite_fresh.sql" 1 200)
  sqlite_floor_replay=$(sqlite_floor "$work/sqlite_lookup.sql" "$(nproc)" 5000)
fi

start_server "$work/sqlite.toml"
"$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections 8 --seconds 2 >/dev/null
if [ -n "$sqlite_floor_fresh" ]; then
  row sqlite floor 1 "$sqlite_floor_fresh" - - - "(fresh)"
  row sqlite floor "$(nproc)" "$sqlite_floor_replay" - - - "(lookup)"
else
  echo "sqlite   floor    no floor: the sqlite3 CLI is not installed (Debian: apt-get install sqlite3)"
fi
deliveries sqlite "$sqlite_floor_fresh" "$sqlite_floor_replay"
echo "server peak RSS: $pg_rss (postgres), $(rss) (sqlite)"
