"""Renders benchmarks/b6-connections' RESULTS.md from the `key value` lines run.sh records.

Usage: report.py RESULTS_FILE COMMAND_LINE MACHINE_DESCRIPTION "N1 N2 ..."
"""
import sys

values = {}
for line in open(sys.argv[1]):
    if line.strip():
        key, _, value = line.strip().partition(" ")
        values[key] = value
command_line, machine, counts = sys.argv[2], sys.argv[3], sys.argv[4].split()
PROTOCOLS = (("1", "HTTP/1.1"), ("2", "h2c"))


def num(key):
    try:
        return float(values[key])
    except (KeyError, ValueError):
        return None


def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


def per(a, b, n, scale=1.0):
    if a is None or b is None or not n:
        return None
    return (a - b) / n / scale


def idle_kib(server, p, n):
    k = f"{server}.h{p}.{n}"
    return per(num(k + ".rss_idle_kib"), num(k + ".rss_base_kib"), num(k + ".opened"))


print("# B6: frontend memory and allocations per connection and per request, next to nginx")
print()
print("Issue 13 (the Netty seed's experiment). For each server, protocol and number of connections N,")
print("a fresh server process; the client (`crates/larder/examples/conn_hold.rs`, one thread) opens N")
print("connections from 16 loopback source addresses, sends one GET of 1 KiB on each and holds them")
print("idle; then every connection sends 1 KiB GETs one after another (one in flight per connection),")
print("then 1 KiB PUTs (Larder: durable uploads to 3 storage nodes; nginx: DAV PUT to a file), each")
print("for a few seconds after one uncounted second of the same requests. RSS is VmRSS (nginx: master")
print("and workers summed), before the client connects")
print("(after a warm-up on one connection, so the frontend's pool to the storage nodes is already")
print("open), with N idle connections, and its peak sampled every 0.25 s under load. Larder's")
print("allocation figures come from its counting allocator (switched on by `LARDER_ALLOC_COUNT_FILE`;")
print("off, it costs a flag load per call): bytes still allocated (live) and bytes allocated in total.")
print()
print("## Machine")
print(machine)
print()
print("## Command")
print("```")
print(command_line)
print("```")
print()
print("## Idle connections")
print()
print("| protocol | N | Larder open | Larder RSS base MiB | Larder RSS idle MiB | Larder RSS per idle connection KiB "
      "| nginx RSS per idle connection KiB | Larder / nginx | Larder live bytes per idle connection "
      "| Larder bytes allocated per connection (setup + first GET) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for p, name in PROTOCOLS:
    for n in counts:
        k = f"larder.h{p}.{n}"
        opened = num(k + ".opened")
        larder, nginx = idle_kib("larder", p, n), idle_kib("nginx", p, n)
        ratio = f"{larder / nginx:.2f}×" if larder is not None and nginx else "-"
        print(f"| {name} | {n} | {values.get(k + '.opened', '-')}/{n} | {fmt(per(num(k + '.rss_base_kib'), 0, 1, 1024), 1)} "
              f"| {fmt(per(num(k + '.rss_idle_kib'), 0, 1, 1024), 1)} | {fmt(larder, 1)} | {fmt(nginx, 1)} | {ratio} "
              f"| {fmt(per(num(k + '.live_idle'), num(k + '.live_base'), opened))} "
              f"| {fmt(per(num(k + '.allocated_idle'), num(k + '.allocated_base'), opened))} |")
print()
print("Target (issue 13): Larder's RSS per idle connection ≤ 2× nginx's.")
print()
print("## Active connections: every connection with a request in flight")
print()
print("| protocol | N | request | Larder req/s | Larder peak RSS MiB | nginx req/s | nginx peak RSS MiB "
      "| Larder bytes allocated per request | Larder allocations per request | Larder not 2xx | nginx not 2xx |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for p, name in PROTOCOLS:
    for n in counts:
        for op in ("get", "put"):
            k, g = f"larder.h{p}.{n}.{op}", f"nginx.h{p}.{n}.{op}"
            ok = num(k + ".ok")
            print(f"| {name} | {n} | {op.upper()} 1 KiB | {values.get(k + '.rps', '-')} "
                  f"| {fmt(per(num(k + '.peak_rss_kib'), 0, 1, 1024), 1)} | {values.get(g + '.rps', '-')} "
                  f"| {fmt(per(num(g + '.peak_rss_kib'), 0, 1, 1024), 1)} "
                  f"| {fmt(per(num(k + '.allocated_bytes'), 0, ok))} | {fmt(per(num(k + '.allocations'), 0, ok), 1)} "
                  f"| {values.get(k + '.not_ok', '-')} | {values.get(g + '.not_ok', '-')} |")
print()
print("Target (issue 13): no per-request allocation that scales with anything but the body: bytes")
print("allocated per request should stay flat as N grows.")
