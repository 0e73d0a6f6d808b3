#!/usr/bin/env bash
# A/B of GETs of one blob (1 KiB unless SIZE says otherwise): the rate and the CPU per request
# of the frontend (the larder dev process) and of the storage nodes (its children), two builds
# alternating, three rounds; one 8 s h2load load (1 connection x STREAMS, 256 unless set) each,
# after a warm-up. Prints table rows.
# BASE_SETTINGS and HEAD_SETTINGS name a `--frontend-settings` file for each side, so one
# build can be compared with itself under two settings.
# Usage: [SIZE=bytes] [STREAMS=n] [WARMUP=requests] [BASE_SETTINGS=f] [HEAD_SETTINGS=f]
#        get-ab.sh BASE_LARDER HEAD_LARDER   (e.g. the release builds of benchmarks/lib-s3.sh)
set -euo pipefail
base=${1:?base build of larder}
head=${2:?head build of larder}
size=${SIZE:-1024}
streams=${STREAMS:-256}
warmup=${WARMUP:-20000}
# Large bodies get h2load windows of 4 MiB (stream) and 64 MiB (connection).
windows=(); [ "$size" -gt 65536 ] && windows=(-w 22 -W 26)
ticks=$(getconf CLK_TCK)
cpu() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
for round in 1 2 3; do
  for build in base head; do
    [ $((round % 2)) = 0 ] && { [ $build = base ] && build=head || build=base; }
    bin=${!build}; settings=(); [ $build = base ] && settings_file=${BASE_SETTINGS:-} || settings_file=${HEAD_SETTINGS:-}
    [ -n "$settings_file" ] && settings=(--frontend-settings "$settings_file")
    dir=$(mktemp -d /tmp/getcpu.XXXX); port=$((20000 + RANDOM % 10000))
    LARDER_LOG=error $bin dev --data-dir $dir --listen 127.0.0.1:$port --s3-listen 127.0.0.1:0 "${settings[@]}" >/dev/null 2>&1 &
    dev=$!
    for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:$port/readyz && break; sleep 0.1; done
    sleep 1
    head -c "$size" /dev/urandom > $dir/b
    id=$(curl -sS --data-binary @$dir/b http://127.0.0.1:$port/v1/blobs | python3 -c 'import sys,json;print(json.load(sys.stdin)["id"])')
    h2load -n "$warmup" -c 1 -m "$streams" "${windows[@]}" http://127.0.0.1:$port/v1/blobs/$id >/dev/null
    nodes=$(pgrep -P $dev | tr '\n' ' ')
    f0=$(cpu $dev); s0=$(cpu $nodes)
    out=$(h2load -D 8 -c 1 -m "$streams" "${windows[@]}" http://127.0.0.1:$port/v1/blobs/$id)
    f1=$(cpu $dev); s1=$(cpu $nodes)
    ok=$(echo "$out" | awk '/^status codes/ {gsub(",","",$3); print $3}')
    rps=$(echo "$out" | awk '/^finished in/ {for (i=1;i<=NF;i++) if ($i ~ /req\/s/) {gsub(",","",$(i-1)); print $(i-1)}}')
    python3 -c "print(f'| $build | {float($rps):,.0f} | {($f1-$f0)/$ticks*1e6/$ok:.1f} | {($s1-$s0)/$ticks*1e6/$ok:.1f} |')"
    kill $dev; wait $dev 2>/dev/null || true; rm -rf $dir
  done
done
