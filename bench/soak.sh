#!/usr/bin/env bash
# A soak: steady mixed traffic (six in ten fresh deliveries, three replays, one with a bad
# signature) against a release `hookbox serve`, for ten minutes, sampling the server's memory
# (VmRSS), threads, open file descriptors and database sessions every few seconds. The
# retention window is five minutes, so in the second half the scheduled purge runs every
# minute and the table stops growing. Prints the samples as CSV and a summary: for each
# measure its first, last and peak value, and the mean of the first and of the last minute.
#
#   bench/soak.sh                                   # 10 minutes, 400 requests/s, 16 connections
#   SOAK_SECONDS=60 SAMPLE_EVERY=2 bench/soak.sh    # a short one
#   RATE=800 CONNECTIONS=32 CSV=soak.csv bench/soak.sh
#   DATABASE_URL=postgres://postgres:secret@127.0.0.1:5433/postgres bench/soak.sh
#   STORE=sqlite bench/soak.sh                      # the embedded store, a file in a temp dir
#
# On SQLite the database-sessions column is the size of the write-ahead log instead (KB), the
# thing that could grow there. Needs a release build (made here), psql and curl, and for
# STORE=sqlite the sqlite3 CLI (to count rows).
set -euo pipefail
cd "$(dirname "$0")/.."

SOAK_SECONDS="${SOAK_SECONDS:-600}"
SAMPLE_EVERY="${SAMPLE_EVERY:-5}"
RATE="${RATE:-400}"
CONNECTIONS="${CONNECTIONS:-16}"
BENCH_NAME=soak
# shellcheck source=bench/common.sh
. bench/common.sh
csv="${CSV:-$work/soak.csv}"
load_pid=""
trap 'if [ -n "$load_pid" ]; then kill "$load_pid" 2>/dev/null || true; fi; cleanup' EXIT

STORE="${STORE:-postgres}"
case "$STORE" in
  postgres) store_url="$db_url" ;;
  sqlite) store_url="sqlite://$work/soak.db" ;;
  *) echo "STORE=$STORE: use postgres or sqlite" >&2; exit 2 ;;
esac

cat > "$work/hookbox.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
[database]
url = "$store_url"
pool_size = 8
[retention]
window = "5m"
purge_interval = "1m"
[sources.stripe]
scheme = "stripe"
secrets = ["$secret"]
# A source's own window: without it a Stripe source keeps events for Stripe's redelivery
# horizon (3 days) whatever [retention].window says, and the purge would find nothing to remove.
retention = "5m"
TOML

start_server

echo "warming up for 10 s..." >&2
"$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections "$CONNECTIONS" \
  --seconds 10 --mode mixed --rate "$RATE" >/dev/null

echo "soaking for $SOAK_SECONDS s at $RATE requests/s over $CONNECTIONS connections..." >&2
"$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --connections "$CONNECTIONS" \
  --seconds "$SOAK_SECONDS" --mode mixed --rate "$RATE" >"$work/load.json" &
load_pid=$!

if [ "$STORE" = sqlite ]; then
  echo "seconds,rss_kb,threads,fds,wal_kb,events" >"$csv"
else
  echo "seconds,rss_kb,threads,fds,db_sessions,events" >"$csv"
fi
started=$(date +%s)
while kill -0 "$load_pid" 2>/dev/null; do
  now=$(( $(date +%s) - started ))
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$server_pid/status")
  threads=$(awk '/^Threads/ {print $2}' "/proc/$server_pid/status")
  fds=$(ls "/proc/$server_pid/fd" | wc -l)
  if [ "$STORE" = sqlite ]; then
    sessions=$(( $(stat -c %s "$work/soak.db-wal" 2>/dev/null || echo 0) / 1024 ))
    events=$(sqlite3 "$work/soak.db" "PRAGMA busy_timeout = 5000; SELECT count(*) FROM events" | tail -n 1)
  else
    sessions=$(psql "$server_url" -Atqc "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db'")
    events=$(psql "$db_url" -Atqc "SELECT count(*) FROM events")
  fi
  echo "$now,$rss,$threads,$fds,$sessions,$events" >>"$csv"
  sleep "$SAMPLE_EVERY"
done
load_pid=""

cat "$csv"
echo
echo "load: $(cat "$work/load.json")"
awk -F, -v every="$SAMPLE_EVERY" '
  NR == 1 { for (i = 2; i <= NF; i++) name[i] = $i; next }
  {
    n++
    for (i = 2; i <= NF; i++) {
      if (n == 1) first[i] = $i
      last[i] = $i
      if (n == 1 || $i > peak[i]) peak[i] = $i
      if ($1 < 60) { head[i] += $i; heads[i]++ }
      value[n, i] = $i; at[n] = $1
    }
  }
  END {
    end = at[n]
    for (k = 1; k <= n; k++) if (at[k] > end - 60) for (i = 2; i <= NF; i++) { tail[i] += value[k, i]; tails[i]++ }
    printf "%-12s %10s %10s %10s %14s %14s\n", "measure", "first", "last", "peak", "mean 1st min", "mean last min"
    for (i = 2; i <= NF; i++)
      printf "%-12s %10s %10s %10s %14.1f %14.1f\n", name[i], first[i], last[i], peak[i], head[i] / heads[i], tail[i] / tails[i]
  }' "$csv"
echo "server peak RSS (VmHWM): $(awk '/VmHWM/ {printf "%.1f MB", $2/1024}' "/proc/$server_pid/status")"
if grep -qE "ERROR|panicked" "$work/serve.log"; then
  echo "the server logged errors:" >&2
  grep -E "ERROR|panicked" "$work/serve.log" | head -20 >&2
fi
