#!/usr/bin/env bash
# B1 (issue 6, Vespa's table): h2load GET of one 1 KiB blob through the frontend, HTTP/1.1 with 1
# and 128 connections, HTTP/2 with 1 x 256 and 4 x 256 streams, each over cleartext and over TLS;
# nginx and h2o serve the same 1 KiB as a static file in the same run with the same h2load settings.
# Usage: run.sh [--smoke]   (--smoke: a few hundred requests per row, results to a temp file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"

seconds=${SECONDS_PER_ROW:-5}
# Every cell is measured ROUNDS times, the rounds interleaved, and the median reported: on this
# shared machine one 5 s sample of a latency-bound cell (HTTP/1.1, 1 connection) moved by 2x
# between runs.
rounds=${ROUNDS:-3}
out="$here/RESULTS.md"
load=(-D "$seconds" --warm-up-time 1)
if [ "${1:-}" = "--smoke" ]; then load=(-n 300); rounds=1; out=$(mktemp); fi

bench_build
bench_workdir b1

port=$(free_port); tls_port=$(free_port)
dev_up "$port" --tls --tls-listen "127.0.0.1:$tls_port" --partitions 32
wait_port "$tls_port"
tls="$work/data/tls"
head -c 1024 /dev/urandom > "$work/blob"
id=$(upload_blob "$work/blob" "http://127.0.0.1:$port/v1/blobs")

# nginx cannot serve HTTP/1.1 and h2c on one cleartext port: one port each, plus one TLS port.
mkdir -p "$work/www" "$work/nginx" "$work/h2o"
cp "$work/blob" "$work/www/blob"
n_h1=$(free_port); n_h2=$(free_port); n_tls=$(free_port)
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
  server { listen 127.0.0.1:$n_h1; root $work/www; }
  server { listen 127.0.0.1:$n_h2 http2; root $work/www; }
  server { listen 127.0.0.1:$n_tls ssl http2; root $work/www;
           ssl_certificate $tls/frontend.pem; ssl_certificate_key $tls/frontend-key.pem; }
}
NGINX
nginx -c "$work/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)
# h2o, like Larder, serves HTTP/1.1 and h2c on one cleartext port.
o_clear=$(free_port); o_tls=$(free_port)
cat > "$work/h2o/h2o.conf" <<H2O
user: $(id -un)
listen:
  host: 127.0.0.1
  port: $o_clear
listen:
  host: 127.0.0.1
  port: $o_tls
  ssl:
    certificate-file: $tls/frontend.pem
    key-file: $tls/frontend-key.pem
num-threads: $(nproc)
http2-max-concurrent-requests-per-connection: 256
pid-file: $work/h2o/h2o.pid
error-log: $work/h2o/error.log
hosts:
  default:
    paths:
      /:
        file.dir: $work/www
H2O
h2o -c "$work/h2o/h2o.conf" >/dev/null 2>&1 &
pids+=($!)
for p in $n_h1 $n_h2 $n_tls $o_clear $o_tls; do wait_port "$p"; done

rps() { # h2load args... -> req/s (0 if h2load failed)
  local output; output=$(h2load "${load[@]}" "$@" 2>&1 || true)
  local r; r=$(echo "$output" | h2load_rps); echo "${r:-0}"
}

declare -A samples result
modes=("HTTP/1.1, 1 connection|--h1 -c 1 -m 1" "HTTP/1.1, 128 connections|--h1 -c 128 -m 1"
       "HTTP/2, 1 connection x 256 streams|-c 1 -m 256" "HTTP/2, 4 connections x 256 streams|-c 4 -t 2 -m 256")
sample() { samples["$1"]="${samples[$1]:-} $2"; }
for _ in $(seq "$rounds"); do
  for spec in "${modes[@]}"; do
    label=${spec%%|*}; args=${spec#*|}
    h1=false; [[ $args == --h1* ]] && h1=true
    # shellcheck disable=SC2086
    {
      sample "$label|larder|clear" "$(rps $args "http://127.0.0.1:$port/v1/blobs/$id")"
      sample "$label|larder|tls" "$(rps $args "https://127.0.0.1:$tls_port/v1/blobs/$id")"
      if $h1; then sample "$label|nginx|clear" "$(rps $args "http://127.0.0.1:$n_h1/blob")"
      else sample "$label|nginx|clear" "$(rps $args "http://127.0.0.1:$n_h2/blob")"; fi
      sample "$label|nginx|tls" "$(rps $args "https://127.0.0.1:$n_tls/blob")"
      sample "$label|h2o|clear" "$(rps $args "http://127.0.0.1:$o_clear/blob")"
      sample "$label|h2o|tls" "$(rps $args "https://127.0.0.1:$o_tls/blob")"
    }
  done
done
for key in "${!samples[@]}"; do
  result["$key"]=$(python3 -c "import statistics,sys; print(f'{statistics.median(map(float, sys.argv[1:])):.0f}')" ${samples[$key]})
done
# Larder's HTTP/2 1-connection / HTTP/1.1 1-connection ratio in each round, to show its spread.
round_ratios=$(python3 - "${samples[HTTP/2, 1 connection x 256 streams|larder|clear]}" "${samples[HTTP/1.1, 1 connection|larder|clear]}" <<'PY'
import sys
h2, h1 = (list(map(float, a.split())) for a in sys.argv[1:3])
print(", ".join(f"{a / b:.1f}x" if b else "n/a" for a, b in zip(h2, h1)))
PY
)

ratio() { python3 -c "a,b=float('$1'),float('$2'); print(f'{a/b:.2f}' if b else 'n/a')"; }
cost() { python3 -c "a,b=float('$1'),float('$2'); print(f'{(1-a/b)*100:.0f} %' if b else 'n/a')"; }
h1one="HTTP/1.1, 1 connection"; h2one="HTTP/2, 1 connection x 256 streams"
{
  echo "# B1: the edge — HTTP/1.1 vs HTTP/2, cleartext vs TLS, Larder vs nginx vs h2o"
  echo
  echo "GET of one 1 KiB blob through Larder's frontend (\`larder dev --tls\`: 3 storage nodes as processes,"
  echo "mutual TLS between frontend and storage), and the same 1 KiB as a static file from nginx and h2o."
  echo "Everything, h2load included, shares the same cores, so absolute numbers are low; compare within"
  echo "a row. TLS rows use TLS 1.3 (h2load's default) with ALPN h2 or http/1.1."
  echo
  echo "## Machine"
  machine_description "$work"
  echo "- h2o: $(h2o --version | head -1)"
  echo
  echo "## Command"
  echo '```'
  echo "SECONDS_PER_ROW=$seconds ROUNDS=$rounds benchmarks/b1-edge/run.sh    # each cell: h2load ${load[*]} <mode args> <url>, median of $rounds"
  echo '```'
  echo
  echo "## Requests per second (median of $rounds rounds)"
  echo
  echo "| client setting | Larder h2c/h1 | Larder TLS | nginx | nginx TLS | h2o | h2o TLS |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for spec in "${modes[@]}"; do
    label=${spec%%|*}
    row="| $label"
    for key in larder nginx h2o; do
      row="$row | ${result[$label|$key|clear]} | ${result[$label|$key|tls]}"
    done
    echo "$row |"
  done
  echo
  echo "## Targets"
  echo
  echo "| target | cleartext | TLS |"
  echo "| --- | ---: | ---: |"
  echo "| Larder HTTP/2 1 connection ÷ HTTP/1.1 1 connection (target ≥ 10×) | $(ratio "${result[$h2one|larder|clear]}" "${result[$h1one|larder|clear]}")× | $(ratio "${result[$h2one|larder|tls]}" "${result[$h1one|larder|tls]}")× |"
  echo
  echo "The same ratio (cleartext) in each round: $round_ratios. For comparison, on this machine:"
  echo "nginx $(ratio "${result[$h2one|nginx|clear]}" "${result[$h1one|nginx|clear]}")×, h2o $(ratio "${result[$h2one|h2o|clear]}" "${result[$h1one|h2o|clear]}")×."
  echo
  echo "| Larder's TLS cost (1 − TLS ÷ cleartext; target ≤ 20 %) | |"
  echo "| --- | ---: |"
  for spec in "${modes[@]}"; do
    label=${spec%%|*}
    echo "| $label | $(cost "${result[$label|larder|tls]}" "${result[$label|larder|clear]}") |"
  done
} > "$out"
cat "$out"
