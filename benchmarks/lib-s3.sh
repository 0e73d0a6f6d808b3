# Shared setup of the S3 benchmarks that run a base build next to this checkout's with boto3
# (s3-batching, s3-big-bucket, s3-deleted-range, s3-get-name). Sourced.

# s3_bench_start NAME: a scratch folder $work (under TMPDIR); `pids`, to which the script adds
# every process it starts; an EXIT trap that stops them (SIGTERM, then SIGKILL after
# S3_BENCH_GRACE seconds, default 1) and removes $work; and `python`: $PYTHON, else a venv
# with boto3 made in $work.
s3_bench_start() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXX")
  pids=()
  trap s3_bench_cleanup EXIT
  python=${PYTHON:-$work/venv/bin/python}
  if [ -z "${PYTHON:-}" ]; then
    python3 -m venv "$work/venv" && "$work/venv/bin/pip" install -q boto3
  fi
}

s3_bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep "${S3_BENCH_GRACE:-1}"
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}

# s3_bench_builds NAME BASE: release builds of commit BASE and of this checkout, in
# $cache/base and $cache/head, where `cache` (set here) is $CACHE, else
# ~/.cache/larder-NAME: kept between runs, as is BASE's worktree ($BASE_SRC, else
# $cache/base-src, one path so that its target dir is reused). HEAD_ONLY=1: this checkout only.
s3_bench_builds() {
  local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cache=${CACHE:-$HOME/.cache/larder-$1}
  mkdir -p "$cache"
  local base_src=${BASE_SRC:-$cache/base-src}
  if [ "${HEAD_ONLY:-0}" != 1 ]; then
    if [ ! -e "$base_src/.git" ]; then
      git -C "$root" worktree add --detach "$base_src" "$2" >/dev/null
    fi
    git -C "$base_src" checkout -q --detach "$2"
    (cd "$base_src" && CARGO_TARGET_DIR=$cache/base cargo build -q --release -p larder)
  fi
  (cd "$root" && CARGO_TARGET_DIR=$cache/head cargo build -q --release -p larder)
}
