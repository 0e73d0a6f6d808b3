#!/usr/bin/env bash
# B5 (issue 6, Dropbox's bandwidth): bytes on the wire per request for a realistic browser-like
# request (13 headers: a long user agent, a cookie, a bearer token, ...) over HTTP/1.1 vs HTTP/2,
# the same GET of a 1 KiB blob from Larder's frontend. A counting TCP proxy between h2load and the
# frontend measures the bytes each way, so preface, SETTINGS and WINDOW_UPDATEs are included.
# Usage: run.sh [--smoke]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"

requests=${REQUESTS:-2000}
out="$here/RESULTS.md"
if [ "${1:-}" = "--smoke" ]; then requests=50; out=$(mktemp); fi

bench_build
bench_workdir b5

port=$(free_port)
dev_up "$port" --partitions 8
head -c 1024 /dev/urandom > "$work/blob"
id=$(upload_blob "$work/blob" "http://127.0.0.1:$port/v1/blobs")

headers=(
  -H 'user-agent: Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36 LarderBench/1.0'
  -H 'accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8'
  -H 'accept-language: en-US,en;q=0.9,nb;q=0.8,de;q=0.7'
  -H 'accept-encoding: gzip, deflate, br, zstd'
  -H 'cookie: session=7f3c9a1e5b2d4c8f9a0e1d2c3b4a5f6e; theme=dark; locale=en-US; _ga=GA1.2.1234567890.1700000000; _gid=GA1.2.987654321.1700000000; consent=analytics%3Dtrue%26ads%3Dfalse'
  -H 'referer: https://photos.example.com/albums/2026/summer-holiday?view=grid&sort=date'
  -H 'authorization: Bearer eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhZGEiLCJzY29wZSI6InJlYWQiLCJleHAiOjE4MDAwMDAwMDB9.c2lnbmF0dXJlLXNpZ25hdHVyZS1zaWduYXR1cmU'
  -H 'cache-control: no-cache'
  -H 'pragma: no-cache'
  -H 'dnt: 1'
  -H 'sec-fetch-mode: cors'
  -H 'sec-fetch-site: same-site'
  -H 'x-client-version: larder-web/3.14.1 (build 20261121)'
)

measure() { # label, h2load protocol args... -> "label|up bytes per request|down per request|h2load header savings"
  local label=$1; shift
  local proxy; proxy=$(free_port)
  local counts="$work/counts-$proxy"
  python3 "$here/count_proxy.py" "$proxy" "$port" "$counts" &
  local pp=$!; pids+=($pp)
  wait_port "$proxy"
  local output; output=$(h2load -n "$requests" -c 1 -m 1 "$@" "${headers[@]}" "http://127.0.0.1:$proxy/v1/blobs/$id" 2>&1)
  for _ in $(seq 1 50); do [ "$(wc -l < "$counts" 2>/dev/null || echo 0)" -ge 2 ] && break; sleep 0.1; done
  kill "$pp" 2>/dev/null || true
  local ok; ok=$(echo "$output" | h2load_2xx)
  local savings; savings=$(echo "$output" | sed -n 's/.*headers (space savings \([0-9.]*%\)).*/\1/p')
  # Sum every connection (wait_port's probe is one, with no bytes).
  read -r up down < <(awk '{u += $1; d += $2} END {print u, d}' "$counts")
  python3 -c "print(f'$label|{$up/$requests:.1f}|{$down/$requests:.1f}|${savings:-n/a}|$ok')"
}

h1=$(measure "HTTP/1.1" --h1)
h2=$(measure "HTTP/2 (h2c)")
up1=$(echo "$h1" | cut -d'|' -f2); up2=$(echo "$h2" | cut -d'|' -f2)
{
  echo "# B5: bytes on the wire per request, HTTP/1.1 vs HTTP/2"
  echo
  echo "The same realistic GET (13 request headers, ~900 bytes of them: long user agent, cookie, bearer"
  echo "token) of a 1 KiB blob, $requests times on one connection, through a counting TCP proxy in front of"
  echo "Larder's cleartext port. \"Up\" is every byte the client sent divided by the number of requests"
  echo "(connection setup included), \"down\" every byte it received. Identical headers on every request"
  echo "are HPACK's best case, as in a browser's repeated requests to one site."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "REQUESTS=$requests benchmarks/b5-header-bytes/run.sh"
  echo '```'
  echo
  echo "| protocol | up bytes / request | down bytes / request | h2load response-header space savings | 2xx |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  echo "| $h1 |"
  echo "| $h2 |"
  echo
  echo "Request bytes saved by HTTP/2: **$(python3 -c "print(f'{(1-$up2/$up1)*100:.0f} %')")** (target ≥ 50 %; Dropbox saw about 50 % less ingress)."
} > "$out"
cat "$out"
