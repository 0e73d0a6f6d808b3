#!/usr/bin/env bash
# Issue 18, how much of the get rows is the S3 body cache (crates/larder-s3/src/body_cache.rs):
# Larder with 1 replica, warp get of 1,000 objects of 1 KiB and of 64 KiB (the flags of run.sh),
# through a frontend with `[s3] body_cache_bytes` at its default (64 MiB) and at 0 (off),
# alternating, two rounds. `larder dev` rewrites its frontend's config at every start, so the
# measured frontend is a second one (`larder frontend`) on a copy of that config; the dev
# process's own frontend stays idle and is not counted. CPU: that frontend and the storage node.
# Needs run.sh's tools (it installs them); results go to results-body-cache.tsv beside this file.
# usage: benchmarks/s3-compare/body-cache.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/benchmarks/lib.sh"
bench_build
warp=${LARDER_TOOLS_DIR:-$HOME/.cache/larder-tools}/warp-v1.4.0/bin/warp
[ -x "$warp" ] || { echo "no $warp: run benchmarks/s3-compare/run.sh once first" >&2; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/s3-body-cache.XXXX")
trap 'rm -rf "$out"' EXIT
for mode in off default off default; do
  dir=$(mktemp -d "$out/run.XXXX")
  port=$(free_port) s3=$(free_port) port2=$(free_port) s3b=$(free_port)
  LARDER_LOG=warn,s3s=off $LARDER dev --data-dir $dir/d --listen 127.0.0.1:$port --s3-listen 127.0.0.1:$s3 --nodes 1 --replicas 1 > $dir/log 2>&1 &
  dev=$!
  wait_port $s3
  sed -e "s/^listen = .*127.0.0.1:$port\"/listen = \"127.0.0.1:$port2\"/" \
      -e "s/^listen = \"127.0.0.1:$s3\"/listen = \"127.0.0.1:$s3b\"/" \
      -e "s/^upload_journal_dir = .*/upload_journal_dir = \"fe2-uploads\"/" $dir/d/frontend-dc1.toml > $dir/d/fe2.toml
  [ $mode = off ] && sed -i 's/^\[s3\]$/[s3]\nbody_cache_bytes = 0/' $dir/d/fe2.toml
  LARDER_LOG=warn,s3s=off $LARDER frontend --config $dir/d/fe2.toml > $dir/log2 2>&1 &
  fe=$!
  wait_port $s3b
  key=$($LARDER s3 key create --config $dir/d/frontend-dc1.toml --grant '*:owner')
  ak=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_key_id"])' <<< "$key")
  sk=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secret_access_key"])' <<< "$key")
  { echo $fe; pgrep -P $dev; } > $dir/pids
  for w in "1KiB" "64KiB"; do
    python3 $here/measure.py $out/results.tsv "larder1-cache-$mode" get-$w $dir/pids $dir/run-$w -- \
      $warp get --obj.size $w --objects 1000 --host 127.0.0.1:$s3b --access-key $ak --secret-key $sk \
      --bucket warp-get-$(tr '[:upper:]' '[:lower:]' <<< $w) --region us-east-1 --duration 20s --concurrent 16 --no-color --benchdata $dir/run-$w
  done
  echo "$mode: $(curl -s http://127.0.0.1:$port2/metrics | grep body_cache_reads_total | tr '\n' ' ')"
  kill $fe; wait $fe || true
  kill $dev; wait $dev || true
  rm -rf $dir
done
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD); $(nproc) cores"
  cat "$out/results.tsv"
} > "$here/results-body-cache.tsv"
cat "$here/results-body-cache.tsv"
