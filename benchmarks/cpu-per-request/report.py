"""Renders benchmarks/cpu-per-request's RESULTS.md from the `key value` lines run.sh records.

Usage: report.py COMMAND_LINE MACHINE_DESCRIPTION RESULTS_FILE...
Each results file is one round (or the references); a key found in several gets the median of
its values, so every figure, and every ratio computed from figures, is a median over rounds.
"""
import statistics
import sys

command_line, machine = sys.argv[1], sys.argv[2]
seen = {}
for path in sys.argv[3:]:
    for line in open(path):
        if line.strip():
            key, _, value = line.strip().partition(" ")
            seen.setdefault(key, []).append(value)


def median_of(texts):
    try:
        m = statistics.median(float(t) for t in texts)
    except ValueError:
        return texts[-1]
    return str(int(m)) if m == int(m) else f"{m:.2f}"


values = {k: median_of(v) for k, v in seen.items()}
rounds = max((len(v) for v in seen.values()), default=1)
builds = [b for b in ("baseline", "current") if f"{b}.get1k.rps" in values]
LOADS = {"get1k": "GET 1 KiB", "put1k": "PUT 1 KiB", "get1m": "GET 1 MiB", "put1m": "PUT 1 MiB"}
NODES = ("s1", "s2", "s3")


def num(key):
    try:
        return float(values[key])
    except (KeyError, ValueError):
        return None


def fmt(x, digits=0):
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "-"


def per_request(server, load, process):
    """CPU µs per successful request of one process (or the sum over the storage nodes)."""
    ok = num(f"{server}.{load}.ok")
    names = NODES if process == "storage" else (process,)
    cpu = [num(f"{server}.{load}.cpu_ms.{n}") for n in names]
    if not ok or any(c is None for c in cpu):
        return None
    return sum(cpu) * 1000 / ok


def rate_table():
    print("| load | server | req/s | vs baseline | vs nginx | frontend (or server) µs/req | vs baseline "
          "| storage µs/req, 3 nodes summed | vs baseline | per node s1 / s2 / s3 | 2xx / done |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for load, name in LOADS.items():
        nginx_rps = num(f"nginx.{load}.rps")
        base = lambda what: what("baseline") if "baseline" in builds else None
        for server in builds + ["hello", "nginx"]:
            rps = num(f"{server}.{load}.rps")
            if rps is None:
                continue
            larder = server in builds
            front = per_request(server, load, "frontend" if larder else "server")
            storage = per_request(server, load, "storage") if larder else None
            nodes = " / ".join(fmt(per_request_node(server, load, n)) for n in NODES) if larder else "-"
            label = {"baseline": f"Larder baseline", "current": "Larder current",
                     "hello": "bare hyper (hello_h2)", "nginx": "nginx"}[server]
            vs_base = lambda x, f: ratio(x, base(f)) if server == "current" else "-"
            print(f"| {name} | {label} | {fmt(rps)} | {vs_base(rps, lambda b: num(f'{b}.{load}.rps'))} "
                  f"| {ratio(rps, nginx_rps) if server != 'nginx' else '-'} | {fmt(front, 1)} "
                  f"| {vs_base(front, lambda b: per_request(b, load, 'frontend'))} | {fmt(storage, 1)} "
                  f"| {vs_base(storage, lambda b: per_request(b, load, 'storage'))} | {nodes} "
                  f"| {values.get(f'{server}.{load}.ok', '-')} / {values.get(f'{server}.{load}.done', '-')} |")


def per_request_node(server, load, node):
    ok, cpu = num(f"{server}.{load}.ok"), num(f"{server}.{load}.cpu_ms.{node}")
    return cpu * 1000 / ok if ok and cpu is not None else None


def latency_table():
    print("| load | offered req/s | build | achieved req/s | p50 ms | p99 ms | p50 vs baseline | p99 vs baseline |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for load in ("get1k", "put1k"):
        for b in builds:
            k = f"{b}.{load}.fixed"
            vs = lambda q: ratio(num(f"{k}.{q}"), num(f"baseline.{load}.fixed.{q}")) if b == "current" else "-"
            print(f"| {LOADS[load]} | {values.get(k + '.offered', '-')} | {b} | {values.get(k + '.achieved', '-')} "
                  f"| {values.get(k + '.p50', '-')} | {values.get(k + '.p99', '-')} | {vs('p50')} | {vs('p99')} |")


def syncs_table():
    print("| build | PUT 1 KiB req/s | fdatasync+fsync /s, s1 / s2 / s3 | syncs per PUT, all nodes | vs baseline |")
    print("| --- | ---: | --- | ---: | ---: |")
    per_put = {}
    for b in builds:
        seconds = num(f"{b}.put1k.sync_seconds")
        counts = [num(f"{b}.put1k.syncs.{n}") for n in NODES]
        if not seconds or any(c is None for c in counts):
            continue
        ok = num(f"{b}.put1k.ok")
        per_put[b] = sum(counts) / ok if ok else None
        vs = ratio(per_put[b], per_put.get("baseline")) if b == "current" else "-"
        print(f"| {b} | {fmt(num(f'{b}.put1k.rps'))} | {' / '.join(fmt(c / seconds) for c in counts)} "
              f"| {fmt(per_put[b], 3)} | {vs} |")


def rss_table():
    print("| build | frontend RSS idle MiB | frontend RSS after the loads MiB | s1 RSS idle MiB | s1 RSS after MiB |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for b in builds:
        print(f"| {b} | {values.get(b + '.rss_idle.frontend', '-')} | {values.get(b + '.rss_loaded.frontend', '-')} "
              f"| {values.get(b + '.rss_idle.s1', '-')} | {values.get(b + '.rss_loaded.s1', '-')} |")


def profile_table():
    print("| build | process | load | profile weight (sum of perf sample periods) | `clear_page_erms` share | flame graph |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for b in builds:
        for who in ("frontend", "storage"):
            for load in ("get1k", "put1k"):
                samples = num(f"{b}.{load}.samples.{who}")
                if samples is None:
                    continue
                share = num(f"{b}.{load}.clear_page.{who}") / samples * 100 if samples else None
                svg = f"flamegraphs/{b}-{who}-{load[:3]}.svg"
                print(f"| {b} | {who}{' (s1)' if who == 'storage' else ''} | {LOADS[load]} | {fmt(samples)} "
                      f"| {fmt(share, 1)} % | [{svg}]({svg}) |")


def mbps(key):
    rps = num(key + ".rps")
    return rps * 4 * 1.048576 if rps is not None else None


def big_put_table():
    iperf, dd = num("iperf3_mbps"), num("dd_mbps")
    print(f"iperf3, one TCP stream over loopback: {fmt(iperf)} MB/s; dd, 512 MiB written with "
          f"`conv=fdatasync` to the data disk: {fmt(dd)} MB/s, / 3 replicas = {fmt(dd / 3 if dd else None)} MB/s.")
    new, reused = num("dd_tmpfs_new_mbps"), num("dd_tmpfs_reused_mbps")
    if new is not None:
        print()
        print(f"tmpfs itself (dd, 512 MiB of 4 MiB writes): {fmt(new)} MB/s into new pages, "
              f"{fmt(reused)} MB/s over the same pages again. Every byte a storage node appends goes "
              f"into new pages, three copies of each PUT: tmpfs's own bound for the row is "
              f"{fmt(new / 3)} MB/s.")
    print()
    print("| build | data on | 4 MiB PUT MB/s | reference | ratio | target | vs baseline |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    for b in builds:
        for medium, ref_name, ref, target in (("tmpfs", "iperf3", iperf, "≥ 0.3×"),
                                              ("disk", "dd / 3", dd / 3 if dd else None, "≥ 0.8×")):
            m = mbps(f"{b}.put4m_{medium}")
            vs = ratio(m, mbps(f"baseline.put4m_{medium}")) if b == "current" else "-"
            print(f"| {b} | {medium} | {fmt(m)} | {ref_name} | {ratio(m, ref)} | {target} | {vs} |")


def targets():
    if "current" not in builds:
        return
    rows = []
    node_put = per_request("current", "put1k", "storage")
    rows.append(("storage CPU per durable 1 KiB PUT, per node", "≤ 35 µs",
                 fmt(node_put / 3 if node_put else None, 1) + " µs", node_put is not None and node_put / 3 <= 35))
    fput = per_request("current", "put1k", "frontend")
    rows.append(("frontend CPU per 1 KiB PUT", "≤ 30 µs", fmt(fput, 1) + " µs", fput is not None and fput <= 30))
    pr, br = num("current.put1k.rps"), num("baseline.put1k.rps")
    rows.append(("PUT 1 KiB rate vs baseline", "≥ 3.5×", ratio(pr, br), bool(pr and br and pr / br >= 3.5)))
    fget, sget = per_request("current", "get1k", "frontend"), per_request("current", "get1k", "storage")
    rows.append(("frontend CPU per 1 KiB GET", "≤ 15 µs", fmt(fget, 1) + " µs", fget is not None and fget <= 15))
    rows.append(("storage CPU per 1 KiB GET, nodes summed", "≤ 10 µs", fmt(sget, 1) + " µs", sget is not None and sget <= 10))
    gr, nr = num("current.get1k.rps"), num("nginx.get1k.rps")
    rows.append(("GET 1 KiB rate vs nginx", "≥ 0.9× (moonshot 1.0×)", ratio(gr, nr), bool(gr and nr and gr / nr >= 0.9)))
    for load in ("get1k", "put1k"):
        for q in ("p50", "p99"):
            c, b = num(f"current.{load}.fixed.{q}"), num(f"baseline.{load}.fixed.{q}")
            rows.append((f"{LOADS[load]} {q} at half the baseline's max rate", "≤ baseline",
                         f"{fmt(c, 2)} vs {fmt(b, 2)} ms", c is not None and b is not None and c <= b))
    print("| target (issue 13) | goal | this run | met |")
    print("| --- | --- | --- | --- |")
    for what, goal, got, met in rows:
        print(f"| {what} | {goal} | {got} | {'yes' if met else '**no**'} |")


print("# CPU per request: Larder (current vs baseline) next to bare hyper and nginx")
print()
print("Issue 13. `larder dev` (3 storage nodes as processes, 32 partitions x 3 replicas, frontend in")
print("the dev process, durable: a PUT is acknowledged when 2 of 3 replicas have synced) with its data")
print("on the real disk under target/; the same h2load settings for every server: 1 connection x 256")
print("streams for 1 KiB, 1 connection x 16 streams with 4 MiB windows for 1 MiB; each load for a fixed")
print("time after a warm-up. CPU is user + system time from `/proc/<pid>/stat` before and after each")
print("load, divided by its 2xx answers: the frontend is the `larder dev` process, storage the three")
print("node processes. The bare hyper server (`crates/larder/examples/hello_h2.rs`) answers the same")
print("bytes from memory and reads uploads to their end; nginx serves the same bytes as static files")
print("(h2c) and takes PUTs with its DAV module (body to a temp file, renamed; no fsync). The baseline")
print("is another Larder commit built by the script; every ratio compares figures of this one run.")
print(f"Rounds: {rounds}; with more than one, each figure is the median of its rounds (each round")
print("measures both builds, alternating which goes first, then the floor).")
print("Client, servers and storage nodes share the machine's cores.")
print()
print("## Machine")
print(machine)
print()
print("## Command")
print("```")
print(command_line)
print("```")
print()
print("## Targets")
print()
targets()
print()
print("## Rate and CPU per request")
print()
rate_table()
print()
print("## Latency at a fixed offered load (half of the baseline's maximum rate in the first round, h2load --rps, 1 x 256)")
print()
latency_table()
print()
print("## fdatasync and fsync calls per storage node under PUT 1 KiB")
print()
print("Counted with perf's `syscalls:sys_enter_fdatasync` and `sys_enter_fsync` tracepoints, recorded")
print("system-wide during the PUT 1 KiB load and counted by node process (all its threads), per second of")
print("load. All three nodes share one disk, so the disk sees the sum.")
print()
syncs_table()
print()
print("## Memory")
print()
rss_table()
print()
print("## Profiles (perf record, frontend and storage node s1, under GET and PUT 1 KiB)")
print()
profile_table()
print()
print("## 4 MiB PUT end to end (1 connection x 8 streams, 4 MiB windows)")
print()
big_put_table()
