# Helpers shared by put-ab.sh and option-ab.sh (sourced): a key for warp, a warp put run, and a
# table row of warp's rate with the CPU per operation of two processes.

# s3_key BIN CONFIG: creates an owner key through the frontend config CONFIG; sets AK and SK.
s3_key() {
  local key
  key=$("$1" s3 key create --config "$2" --grant '*:owner')
  AK=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_key_id"])' <<< "$key")
  SK=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secret_access_key"])' <<< "$key")
}

# ticks PID: user + system clock ticks of process PID so far.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# warp_row NAME WARP_OUTPUT FRONTEND_TICKS STORAGE_TICKS SECONDS: prints
# "| NAME | ops/s | p50 ms | p99 ms | frontend ms per op | storage ms per op |" from warp's
# first rate and request-time lines.
warp_row() {
  local rate reqs
  rate=$(grep -o '[0-9.]* obj/s' "$2" | head -1 | cut -d' ' -f1 || true)
  [ -n "$rate" ] || { echo "warp failed: $(tail -3 "$2")" >&2; return 1; }
  reqs=$(grep -m1 'Reqs: Avg' "$2" || true)
  python3 - "$1" "$rate" "$3" "$4" "$5" "$reqs" <<'PY'
import os, re, sys
name, rate, fe, st, secs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def pct(p):
    m = re.search(p + r"%: ([0-9.]+)(ms|s|µs)", sys.argv[6])
    if not m:
        return "-"
    scale = {"ms": 1, "s": 1000, "µs": 0.001}[m.group(2)]
    return f"{float(m.group(1)) * scale:.1f}"
tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
ops = rate * secs
print(f"| {name} | {rate:,.1f} | {pct('50')} | {pct('99')} | {fe * tick_ms / ops:.3f} | {st * tick_ms / ops:.3f} |")
PY
}

# warp_put HOST WORKDIR OUTPUT SIZE DURATION: `warp put` of SIZE objects at new names
# (${CONCURRENT:-16} clients, SigV4 headers, bucket warp-put, no cleanup) with $warp, $AK and
# $SK, its report in OUTPUT.
warp_put() {
  (cd "$2" && "$warp" put --obj.size "$4" --host "$1" --access-key "$AK" --secret-key "$SK" \
    --bucket warp-put --region us-east-1 --duration "$5" --concurrent "${CONCURRENT:-16}" \
    --noclear --no-color > "$3" 2>&1)
}
