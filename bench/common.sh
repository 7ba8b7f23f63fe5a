# Shared by the benchmark scripts: a database of their own on the server DATABASE_URL names
# (dropped on exit), a work directory, a port, and release builds of hookbox and the load
# generator. Source it after setting BENCH_NAME; it sets server_url, db, db_url, work, port,
# secret, hookbox, loadgen, and server_pid (for start_server and stop_server).

server_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
db="hookbox_bench_${BENCH_NAME}_$$"
db_url="${server_url%/*}/$db"
secret="whsec_bench_secret"
# The server's port: 20000-31999, below Linux's ephemeral range (32768 and up), so no outgoing
# connection of the run (to PostgreSQL, the sink, a bus) can hold it when a step starts hookbox.
port=$((20000 + $$ % 12000))
work="$(mktemp -d)"
server_pid=""

cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  psql "$server_url" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "building (release)..." >&2
cargo build --release -q --bin hookbox --example loadgen
hookbox="${CARGO_TARGET_DIR:-target}/release/hookbox"
loadgen="${CARGO_TARGET_DIR:-target}/release/examples/loadgen"
psql "$server_url" -qc "CREATE DATABASE $db" >/dev/null

# Starts `hookbox serve` with the config given (default $work/hookbox.toml) and waits until it
# is ready.
start_server() {
  RUST_LOG=warn "$hookbox" serve --config "${1:-$work/hookbox.toml}" 2>"$work/serve.log" &
  server_pid=$!
  for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "hookbox did not become ready:" >&2
  cat "$work/serve.log" >&2
  return 1
}

# Stops the server start_server started, and waits until it has gone.
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
