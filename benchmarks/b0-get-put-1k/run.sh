#!/usr/bin/env bash
# B0 (issue 3): h2load GET of one 1 KiB blob through the frontend, next to nginx serving the same
# 1 KiB as a static file with the same h2load settings, in one run; and PUT of 1 KiB blobs.
# Usage: run.sh [--smoke]   (--smoke: tiny request counts, results to a temp file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"

requests=${REQUESTS:-200000}
out="$here/RESULTS.md"
if [ "${1:-}" = "--smoke" ]; then requests=2000; out=$(mktemp); fi

bench_build
bench_workdir b0

port=$(free_port)
dev_up "$port" --partitions 32
head -c 1024 /dev/urandom > "$work/blob"
id=$(upload_blob "$work/blob" "http://127.0.0.1:$port/v1/blobs")
larder_url="http://127.0.0.1:$port/v1/blobs/$id"

# nginx: HTTP/1.1 on one port, h2c (prior knowledge) on another (nginx cannot do both on one
# cleartext port); as many workers as cores, like Larder's runtime.
mkdir -p "$work/www" "$work/nginx"
cp "$work/blob" "$work/www/blob"
h1_port=$(free_port); h2_port=$(free_port)
cat > "$work/nginx/nginx.conf" <<NGINX
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  http2_max_concurrent_streams 256;
  http2_max_requests 1000000;
  server { listen 127.0.0.1:$h1_port; root $work/www; }
  server { listen 127.0.0.1:$h2_port http2; root $work/www; }
}
NGINX
nginx -c "$work/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)
wait_port "$h1_port"; wait_port "$h2_port"

run() { # label, h2load args...
  local label=$1; shift
  local output rps ok
  output=$(h2load "$@" 2>&1)
  rps=$(echo "$output" | h2load_rps); ok=$(echo "$output" | h2load_2xx)
  echo "$label|$rps|$ok"
}

rows=()
for spec in "HTTP/1.1, 1 connection|--h1 -c 1 -m 1" "HTTP/1.1, 128 connections|--h1 -c 128 -m 1" \
            "HTTP/2, 1 connection x 256 streams|-c 1 -m 256"; do
  label=${spec%%|*}; args=${spec#*|}
  # shellcheck disable=SC2086
  l=$(run "$label" -n "$requests" $args "$larder_url")
  if [[ $args == --h1* ]]; then n_url="http://127.0.0.1:$h1_port/blob"; else n_url="http://127.0.0.1:$h2_port/blob"; fi
  # shellcheck disable=SC2086
  n=$(run "$label" -n "$requests" $args "$n_url")
  rows+=("$label|$(echo "$l" | cut -d'|' -f2)|$(echo "$n" | cut -d'|' -f2)|$(echo "$l" | cut -d'|' -f3)")
done
put_requests=$((requests / 10))
put=$(run "PUT 1 KiB, HTTP/2 1 x 256" -n "$put_requests" -c 1 -m 256 -d "$work/blob" "http://127.0.0.1:$port/v1/blobs")

{
  echo "# B0: 1 KiB GET through the frontend vs nginx static file; 1 KiB PUT"
  echo
  echo "Issue 3's first benchmark. Larder: \`larder dev\` (3 storage nodes as processes + frontend, durable"
  echo "fdatasync on every PUT) on the same 2 cores as h2load and nginx. nginx serves the same 1 KiB as a"
  echo "static file (HTTP/1.1 port and h2c port, worker_processes auto)."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "REQUESTS=$requests benchmarks/b0-get-put-1k/run.sh"
  echo '```'
  echo
  echo "## GET of one 1 KiB blob ($requests requests each)"
  echo
  echo "| client setting | Larder req/s | nginx req/s | Larder / nginx | Larder 2xx |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  for r in "${rows[@]}"; do
    IFS='|' read -r label lr nr ok <<< "$r"
    ratio=$(python3 -c "print(f'{$lr/$nr:.2f}' if $nr else 'n/a')")
    echo "| $label | $lr | $nr | $ratio | $ok |"
  done
  echo
  echo "## PUT of 1 KiB blobs ($put_requests requests, HTTP/2 1 connection x 256 streams)"
  echo
  IFS='|' read -r label pr pok <<< "$put"
  echo "| | req/s | 2xx |"
  echo "| --- | ---: | ---: |"
  echo "| Larder PUT (quorum 2 of 3, durable) | $pr | $pok |"
} > "$out"
cat "$out"
