# Shared helpers for benchmark scripts (sourced). Every benchmark records the machine it ran on.

machine_description() {
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "- memory: $(free -g | awk '/Mem:/ {print $2}') GiB; kernel $(uname -r)"
  echo "- disk under the data dir: $(df -h "${1:-.}" | awk 'NR==2 {print $1, $2}')"
  echo "- tools: $(h2load --version 2>/dev/null | head -1); $(nginx -v 2>&1); $(rustc --version)"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_port() {
  for _ in $(seq 1 300); do
    (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 never opened" >&2
  return 1
}

# h2load's requests per second from its summary line.
h2load_rps() {
  awk '/^finished in/ {for (i=1;i<=NF;i++) if ($i ~ /req\/s/) {gsub(",","",$(i-1)); print $(i-1)}}'
}

# h2load's count of 2xx answers.
h2load_2xx() {
  awk '/^status codes:/ {gsub(",","",$3); print $3}'
}
