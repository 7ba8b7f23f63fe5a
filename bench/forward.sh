#!/usr/bin/env bash
# Forwarding at full speed, in one run on this machine, on each store (PostgreSQL, then SQLite):
# a release `hookbox serve` with three Stripe sources, `plain` (no forward target), `one` (one
# target) and `two` (two targets, every event to both), all forwarding to `bench/sink.rs`, a
# local downstream that answers 200 at once. Per store, each step fresh deliveries from
# `bench/loadgen.rs` at CONNECTIONS connections for SECONDS_EACH:
#   plain      the floor: fresh deliveries/s of a source that does not forward;
#   one        fresh deliveries/s of the forwarding source, rows forwarded while ingesting,
#              the drain after ingest stops (until every row has reached the sink), and the lag;
#   two        the same with two targets per event;
#   one @ 1/2  the forwarding source at half the rate `one` took, for the lag;
#   held       a source whose one target never answers (the sink holds its requests), so the
#              dispatcher sits idle with its attempts in flight: the claim's own cost, beside
#              plain. Last, as its attempts stay in flight until the server stops.
#   nats, rabbit (and each @ 1/2)  a source forwarding to NATS JetStream (127.0.0.1:4222) or
#              RabbitMQ (127.0.0.1:5672, guest/guest) instead of the sink: its fresh
#              deliveries/s, publishes confirmed (stream ack, broker confirm) per second while
#              ingesting and over ingest + drain, and the lag by hookbox_forward_lag_seconds
#              (commit -> confirmed). A stream and an exchange with a bound queue of the run's
#              own (bench/busprep.rs) are made first and removed at the end. Skipped when
#              either port does not answer, or with BUS=0.
# Lag: at the sink, from the moment the load generator built the request (the event id carries
# it, `--stamp-ids`) to the delivery's first arrival, an upper bound of commit -> delivered; and,
# where hookbox exports it, `hookbox_forward_lag_seconds` (commit -> delivered) over the step,
# p50/p99 interpolated within its buckets. Under each row: the CPU per event of hookbox,
# PostgreSQL and the sink, the share of the cores idle while the load generator ran, and on
# PostgreSQL the commits per event (idle cores and few commits per event: the step waited on
# the claims' disk syncs, not on the CPU). Ratios are to the floor measured in the same run;
# nothing is asserted on time.
#
#   bench/forward.sh                      # PostgreSQL at 127.0.0.1:5432, user postgres; SQLite
#   SECONDS_EACH=1 bench/forward.sh       # a smoke (CI runs this)
#   ROUNDS=3 bench/forward.sh             # every step three times, order alternating; medians
#   STORES=sqlite bench/forward.sh        # one store only
#   BUS=0 bench/forward.sh                # without the NATS and RabbitMQ rows
#   CONCURRENCY_EACH=16 bench/forward.sh  # every target at the default concurrency (64 here)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH="${SECONDS_EACH:-10}"
# How many times each store's steps run; with more than one, the ratios are each round's own
# and their median (single steps on two shared cores move by 20-30 % from one to the next).
ROUNDS="${ROUNDS:-1}"
CONNECTIONS="${CONNECTIONS:-32}"
# Each forward target's `concurrency`. The sink answers at once and takes any number at a time;
# with the two cores busy, a round trip to it takes several milliseconds, and the default of 16
# in flight would cap a target near 16 per round trip, below what the claims queue.
CONCURRENCY_EACH="${CONCURRENCY_EACH:-64}"
# How long a drain may take before the step gives up on it (and says so).
DRAIN_LIMIT="${DRAIN_LIMIT:-120}"
STORES="${STORES:-postgres sqlite}"
BENCH_NAME=forward
# shellcheck source=bench/common.sh
. bench/common.sh
cargo build --release -q --example sink --example busprep
sink="${CARGO_TARGET_DIR:-target}/release/examples/sink"
busprep="${CARGO_TARGET_DIR:-target}/release/examples/busprep"
nats_url="nats://127.0.0.1:4222"
amqp_url="amqp://guest:guest@127.0.0.1:5672/%2f"
# The stream, exchange and queue of this run.
bus="hookbox_bench_$$"
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ "${BUS:-1}" = 0 ]; then
  BUS=0
elif port_open 4222 && port_open 5672; then
  BUS=1
else
  echo "warning: NATS (4222) or RabbitMQ (5672) does not answer; no bus rows" >&2
  BUS=0
fi
# Below both the server's port range and the ephemeral ports (and apart from run.sh's
# certificate port).
sink_port=$((10000 + ($$ + 5000) % 10000))
sink_url="http://127.0.0.1:$sink_port"
forward_secret="whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"

"$sink" --listen "127.0.0.1:$sink_port" 2>"$work/sink.log" &
sink_pid=$!
trap 'kill "$sink_pid" 2>/dev/null || true; [ "$BUS" = 0 ] || "$busprep" down "$bus" || true; cleanup' EXIT
if [ "$BUS" = 1 ]; then
  "$busprep" up "$bus" "$nats_url" "$amqp_url"
fi
for _ in $(seq 1 100); do
  curl -fs "$sink_url/stats" >/dev/null 2>&1 && break
  sleep 0.05
done

# A Stripe source's table, signed with the run's secret.
source_table() {
  printf '[sources.%s]\nscheme = "stripe"\nsecrets = ["%s"]\n' "$1" "$secret"
}
# A forward target's limits: the attempt timeout $1, the same attempts and concurrency for all.
limits() {
  printf 'timeout = "%s"\nmax_attempts = 12\nconcurrency = %s\n' "$1" "$CONCURRENCY_EACH"
}

config_for() {
  cat <<TOML
[server]
listen = "127.0.0.1:$port"
[database]
url = "$1"
pool_size = ${POOL_SIZE:-8}
$(source_table plain)
$(source_table one)
[sources.one.forward]
url = "$sink_url/one"
secret = "$forward_secret"
$(limits 10s)
$(source_table held)
[sources.held.forward]
url = "$sink_url/hold"
secret = "$forward_secret"
$(limits 300s)
$(source_table two)
[[sources.two.forward]]
name = "a"
url = "$sink_url/two/a"
secret = "$forward_secret"
$(limits 10s)
[[sources.two.forward]]
name = "b"
url = "$sink_url/two/b"
secret = "$forward_secret"
$(limits 10s)
TOML
  [ "$BUS" = 1 ] || return 0
  cat <<TOML
$(source_table nats)
[sources.nats.forward]
url = "$nats_url"
subject = "$bus.{source}.{event_type}"
$(limits 10s)
$(source_table rabbit)
[sources.rabbit.forward]
url = "$amqp_url"
exchange = "$bus"
routing_key = "{source}.{event_type}"
$(limits 10s)
TOML
}

field() { sed -E "s/.*\"$1\":([0-9.]+).*/\1/"; }
ratio() { printf "%.2f" "$(echo "scale=4; $1 / $2" | bc)"; }
now() { date +%s.%N; }

# The lag histogram's bucket lines of one source (all its targets), or nothing before hookbox
# exports it.
lag_buckets() {
  curl -fs "http://127.0.0.1:$port/metrics" | grep "^hookbox_forward_lag_seconds_bucket{source=\"$1\"," || true
}
# The q quantile, in ms, of the lag observed between two lag_buckets readings ($1 before, $2
# after), interpolated within its bucket; "-" when nothing was observed.
lag_quantile() {
  { echo "$1" | sed 's/^/B /'; echo "$2" | sed 's/^/A /'; } | awk -v q="$3" '
    match($0, /le="[^"]*"/) {
      le = substr($0, RSTART + 4, RLENGTH - 5); n = $NF + 0
      if (!(le in seen)) { seen[le] = 1; order[++k] = le }
      if ($1 == "A") a[le] += n; else b[le] += n
    }
    END {
      total = a["+Inf"] - b["+Inf"]
      if (total <= 0) { print "-"; exit }
      rank = q * total; prev = 0; pc = 0
      for (i = 1; i <= k; i++) {
        le = order[i]; c = a[le] - b[le]
        if (c >= rank) {
          if (le == "+Inf") { printf ">%.0f\n", prev * 1000; exit }
          printf "%.1f\n", (prev + (le - prev) * (c > pc ? (rank - pc) / (c - pc) : 1)) * 1000; exit
        }
        prev = le + 0; pc = c
      }
    }'
}

# CPU time (in clock ticks) used so far by each live process, summed by name: hookbox, the
# PostgreSQL backends, the sink. Read from /proc before and after each step; the difference per
# event says where the machine's two cores went (the load generator exits before it is read).
cpu_ticks() {
  local stat line comm fields
  for stat in /proc/[0-9]*/stat; do
    { read -r line < "$stat"; } 2>/dev/null || continue
    comm=${line#*(}; comm=${comm%%)*}
    # shellcheck disable=SC2086
    set -- ${line##*) }
    echo "$comm $(( ${12} + ${13} ))"
  done | awk '$1 == "hookbox" || $1 == "postgres" || $1 == "sink" { t[$1] += $2 } END { for (k in t) print k, t[k] }' | sort
}
# The machine's idle (with I/O wait) and total clock ticks so far, from /proc/stat.
machine_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, t }' /proc/stat; }
# Transactions committed so far in the run's PostgreSQL database (nothing on SQLite).
commits() {
  [ "$store" = postgres ] || return 0
  psql "$db_url" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
}
# Around the load generator's run: ingest_start before it, ingest_end after, which sets
# ingest_line: the share of the cores left idle while it ran, and on PostgreSQL the commits per
# event (about one over the claims per batch). Idle cores mean a step waited on something other
# than the CPU, most often a claim's commit waiting for the disk.
ingest_start() { ticks_before=$(machine_ticks); commits_before=$(commits); }
ingest_end() {
  local after n=$1
  after=$(machine_ticks)
  ingest_line=$(printf '%s %s\n' "$ticks_before" "$after" |
    awk '{ d = $4 - $2; printf "cores %.0f%% idle while ingesting", (d > 0 ? 100 * ($3 - $1) / d : 0) }')
  if [ -n "$commits_before" ]; then
    ingest_line="$ingest_line, $(echo "$commits_before $(commits) $n" |
      awk '{ printf "%.3f commits per event", ($3 > 0 ? ($2 - $1) / $3 : 0) }')"
  fi
}
# After a step: sets cpu_line, the CPU per event by process since cpu_before, and what
# ingest_end found (row prints it).
cpu_report() {
  local hz
  hz=$(getconf CLK_TCK)
  cpu_line=$(join <(echo "$cpu_before") <(cpu_ticks) | awk -v n="$requests" -v hz="$hz" '
    { printf "%s%s %.0f", sep, $1, ($3 - $2) * 1000000 / hz / (n > 0 ? n : 1); sep = ", " }
    END { if (NR) printf " us of CPU per event" }')
  cpu_line="$cpu_line; $ingest_line"
}

# One step: fresh deliveries to source $1 (forwarding to $2 targets per event; 0: none), with
# any further loadgen flags after. Sets: rps, requests, errors, p99, elapsed, during (rows at
# the sink when ingest stopped), rows (expected), drain (s, or ">LIMIT"), sink_p50, sink_p99,
# hist_p50, hist_p99.
step() {
  local source=$1 targets=$2 before after out end stats deadline distinct last
  shift 2
  curl -fs "$sink_url/reset" >/dev/null
  before=$(lag_buckets "$source")
  cpu_before=$(cpu_ticks)
  ingest_start
  out=$("$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --source "$source" \
    --connections "$CONNECTIONS" --seconds "$SECONDS_EACH" --stamp-ids "$@")
  end=$(now)
  ingest_end "$(echo "$out" | field requests)"
  during=$(curl -fs "$sink_url/stats" | field distinct)
  rps=$(echo "$out" | field rps)
  requests=$(echo "$out" | field requests)
  errors=$(echo "$out" | field errors)
  p99=$(echo "$out" | field p99_ms)
  elapsed=$(echo "$out" | field seconds)
  rows=$((requests * targets))
  drain=- sink_p50=- sink_p99=- hist_p50=- hist_p99=-
  [ "$targets" -gt 0 ] || { cpu_report; return 0; }
  deadline=$(echo "$end + $DRAIN_LIMIT" | bc)
  while :; do
    stats=$(curl -fs "$sink_url/stats")
    distinct=$(echo "$stats" | field distinct)
    [ "$distinct" -ge "$rows" ] && break
    if [ "$(echo "$(now) > $deadline" | bc)" = 1 ]; then
      drain=">$DRAIN_LIMIT"
      echo "warning: $source: $distinct of $rows rows reached the sink within ${DRAIN_LIMIT}s" >&2
      break
    fi
    sleep 0.02
  done
  if [ "$drain" = - ]; then
    last=$(echo "$stats" | field last_arrival)
    drain=$(echo "d = $last - $end; if (d < 0) d = 0; d" | bc -l | xargs printf "%.2f")
  fi
  cpu_report
  sink_p50=$(echo "$stats" | field lag_p50_ms)
  sink_p99=$(echo "$stats" | field lag_p99_ms)
  after=$(lag_buckets "$source")
  hist_p50=$(lag_quantile "$before" "$after" 0.5)
  hist_p99=$(lag_quantile "$before" "$after" 0.99)
}

# Deliveries of source $1 recorded delivered (a bus's confirm), by hookbox_forward_total.
delivered() {
  curl -fs "http://127.0.0.1:$port/metrics" |
    awk -v s="source=\"$1\"" 'index($0, "hookbox_forward_total{" s ",") == 1 && /result="delivered"/ { n += $NF } END { print n + 0 }'
}

# One step to a bus source $1 (one target), with any further loadgen flags after: as step, but
# counted by hookbox's metrics instead of at the sink (during: confirmed when ingest stopped;
# drain: until every event is confirmed). No sink lag.
bus_step() {
  local source=$1 base before after out end deadline now_delivered
  shift
  base=$(delivered "$source")
  before=$(lag_buckets "$source")
  cpu_before=$(cpu_ticks)
  ingest_start
  out=$("$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --source "$source" \
    --connections "$CONNECTIONS" --seconds "$SECONDS_EACH" "$@")
  end=$(now)
  ingest_end "$(echo "$out" | field requests)"
  during=$(($(delivered "$source") - base))
  rps=$(echo "$out" | field rps)
  requests=$(echo "$out" | field requests)
  errors=$(echo "$out" | field errors)
  p99=$(echo "$out" | field p99_ms)
  elapsed=$(echo "$out" | field seconds)
  rows=$requests
  drain=- sink_p50=- sink_p99=-
  deadline=$(echo "$end + $DRAIN_LIMIT" | bc)
  while :; do
    now_delivered=$(($(delivered "$source") - base))
    if [ "$now_delivered" -ge "$rows" ]; then
      drain=$(echo "$(now) - $end" | bc -l | xargs printf "%.2f")
      break
    fi
    if [ "$(echo "$(now) > $deadline" | bc)" = 1 ]; then
      drain=">$DRAIN_LIMIT"
      echo "warning: $source: $now_delivered of $rows events confirmed within ${DRAIN_LIMIT}s" >&2
      break
    fi
    sleep 0.02
  done
  after=$(lag_buckets "$source")
  hist_p50=$(lag_quantile "$before" "$after" 0.5)
  hist_p99=$(lag_quantile "$before" "$after" 0.99)
  cpu_report
}

# The bus rows of one store, and a line each: published and confirmed per second.
bus_run() {
  local store=$1 bus_source full half confirmed
  for bus_source in nats rabbit; do
    fresh "$store"
    bus_step "$bus_source"; row "$store" "$bus_source"
    full=$rps
    confirmed=$(printf "%.0f" "$(echo "$requests / ($elapsed + ${drain#>})" | bc -l)")
    half=$(printf "%.0f" "$(echo "$full / 2" | bc -l)")
    fresh "$store"
    bus_step "$bus_source" --rate "$half"; row "$store" "$bus_source @ 1/2"
    echo "$store: $bus_source: published and confirmed $confirmed/s over ingest + drain at full speed; lag p50/p99 at $half/s: $hist_p50/$hist_p99 ms (commit -> confirmed)"
  done
  echo
}

header() {
  printf '%-8s %-10s %5s %9s %7s %9s %11s %8s %8s %17s %19s\n' store step conns "ingest/s" \
    errors "p99 ms" "fwd rows/s" "/ingest" "drain s" "sink lag p50/p99" "hookbox lag p50/p99"
}
# One row of the table, from what step set; $1 store, $2 step name.
row() {
  local fwd="-" share="-"
  if [ "$rows" -gt 0 ]; then
    fwd=$(printf "%.0f" "$(echo "$during / $elapsed" | bc -l)")
    share=$(ratio "$during" "$rows")
  fi
  printf '%-8s %-10s %5s %9.0f %7s %9s %11s %8s %8s %17s %19s\n' "$1" "$2" "$CONNECTIONS" "$rps" \
    "$errors" "$p99" "$fwd" "$share" "$drain" "$sink_p50/$sink_p99" "$hist_p50/$hist_p99"
  [ -z "${cpu_line:-}" ] || printf '%-19s %s\n' "" "$cpu_line"
}

# Every step of one store, against the server on $port, then the ratios.
# Each step starts from an empty store (PostgreSQL: a new database; SQLite: a new file) on a
# freshly started server, warmed up the same way: a store that grew in the steps before (larger
# indexes, a checkpoint due, dead rows to vacuum) would make each step pay for the ones before
# it, and the floor must be measured under the same conditions as the steps compared to it.
fresh() {
  stop_server
  case $1 in
    postgres) psql "$server_url" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
      -c "CREATE DATABASE $db" >/dev/null ;;
    sqlite) rm -f "$work/hookbox.db" "$work/hookbox.db-wal" "$work/hookbox.db-shm" ;;
  esac
  start_server "$work/hookbox.toml"
  "$loadgen" --to "http://127.0.0.1:$port" --secret "$secret" --source plain --connections 8 \
    --seconds "$((SECONDS_EACH < 2 ? SECONDS_EACH : 2))" >/dev/null
}

# The median of the numbers given (the lower middle one of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# One round of a store's steps, in the order given (plain one two half held), each on an empty
# store; appends this round's ratios to the arrays store_run reads.
round() {
  local store=$1 step_name plain_rps="" held_rps="" one_rps="" two_rps="" one_cost="" two_cost=""
  shift
  for step_name in "$@"; do
    fresh "$store"
    case $step_name in
      plain) step plain 0; row "$store" plain; plain_rps=$rps ;;
      one)
        step one 1; row "$store" one; one_rps=$rps; one_shares+=("$(ratio "$during" "$rows")")
        one_cost=$(echo "($elapsed + ${drain#>}) / $requests" | bc -l)
        # The next half-rate step is paced at half of this.
        half=$(printf "%.0f" "$(echo "$one_rps / 2" | bc -l)") ;;
      two)
        step two 2; row "$store" two; two_rps=$rps; two_shares+=("$(ratio "$during" "$rows")")
        two_cost=$(echo "($elapsed + ${drain#>}) / $requests" | bc -l) ;;
      half)
        step one 1 --rate "$half"; row "$store" "one @ 1/2"
        half_sink_p99s+=("$sink_p99"); half_hist_p99s+=("${hist_p99#>}") ;;
      held) step held 0; row "$store" held; held_rps=$rps ;;
    esac
  done
  one_ratios+=("$(ratio "$one_rps" "$plain_rps")")
  held_ratios+=("$(ratio "$held_rps" "$plain_rps")")
  two_ratios+=("$(ratio "$two_cost" "$one_cost")")
  two_fresh+=("$(ratio "$one_rps" "$two_rps")")
}

# Every step of a store, ROUNDS times, then the ratios: each round's own (its steps are
# minutes apart at most) and, over several rounds, their median. Rounds alternate the order of
# the steps, so a machine that speeds up or slows down through the run favours neither side.
store_run() {
  local store=$1 r one_shares=() two_shares=() half_sink_p99s=() half_hist_p99s=() one_ratios=() \
    held_ratios=() two_ratios=() two_fresh=() half=""
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
      round "$store" plain one two half held
    else
      # The half-rate step still follows the full-speed one it takes its rate from.
      round "$store" held two one half plain
    fi
  done
  echo
  if [ "$ROUNDS" -gt 1 ]; then
    echo "$store: per round, in order: forwarding / non-forwarding ${one_ratios[*]}; held / non-forwarding ${held_ratios[*]}; two targets / one ${two_ratios[*]}"
    echo "$store: medians of $ROUNDS rounds:"
  fi
  echo "$store: forwarding source's fresh deliveries/s / non-forwarding's: $(median "${one_ratios[@]}") (target >= 0.8); with the dispatcher idle (held): $(median "${held_ratios[@]}")"
  echo "$store: rows forwarded while ingesting / rows queued: $(median "${one_shares[@]}") with one target, $(median "${two_shares[@]}") with two (target >= 0.9)"
  echo "$store: lag p99 at half the forwarding source's max ingest: $(median "${half_sink_p99s[@]}") ms at the sink (sent -> delivered), $(median "${half_hist_p99s[@]}") ms by hookbox_forward_lag_seconds (target <= 1000 ms)"
  echo "$store: two targets / one, per event (ingest + drain): $(median "${two_ratios[@]}") (target <= 1.3); fresh deliveries/s one / two: $(median "${two_fresh[@]}")"
  echo
}

for store in $STORES; do
  case $store in
    postgres) config_for "$db_url" > "$work/hookbox.toml" ;;
    sqlite) config_for "sqlite://$work/hookbox.db" > "$work/hookbox.toml" ;;
    *) echo "STORES: postgres and/or sqlite, not $store" >&2; exit 2 ;;
  esac
  [ "$store" = "${STORES%% *}" ] && header
  store_run "$store"
  [ "$BUS" = 0 ] || bus_run "$store"
  stop_server
done
