"""Renders benchmarks/b4-pool-delay's RESULTS.md (and its plot) from run.sh's `key value` lines.

Usage: report.py RESULTS COMMAND_LINE MACHINE RTTS GET_RATES PUT_RATES DURATION PNG_OR_EMPTY
"""
import sys

values = {}
for line in open(sys.argv[1]):
    if line.strip():
        key, _, value = line.strip().partition(" ")
        values[key] = value
command_line, machine = sys.argv[2], sys.argv[3]
rtts, get_rates, put_rates = sys.argv[4].split(), sys.argv[5].split(), sys.argv[6].split()
duration, png = sys.argv[7], sys.argv[8]
POOLS = (("http1-for-comparison", "HTTP/1.1 x 30"), ("http2", "HTTP/2 x 4"))


def num(key):
    try:
        return float(values[key])
    except (KeyError, ValueError):
        return None


def cpu_us(key):
    cpu, ok = num(key + ".cpu_s"), num(key + ".ok")
    return cpu * 1e6 / ok if cpu is not None and ok else None


def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


print("# B4 with delay: HTTP/1.1 pool of 30 connections vs HTTP/2 pool of 4, 2-20 ms away")
print()
print("Issue 13 (B4 where its effect exists). Three storage nodes (relaxed durability, data on tmpfs)")
print("in one network namespace, the frontend and h2load in another; the only path between them is")
print("B3's user-space delay line (`benchmarks/lib-delay.sh`), which adds the round-trip time. Only the")
print("frontend's storage pool differs: `pool.protocol = \"http1-for-comparison\"` with 30 connections")
print("per node, or `http2` with 4. Hedged reads are off for both (at 20 ms a hedge would fire on most")
print("reads). h2load offers each load open-loop (`--rps`, 16 connections x up to 64 requests in")
print(f"flight) for {duration} s: GETs cycle through the mix's blobs, PUTs send its first. An HTTP/1.1")
print("pool connection carries one request per round trip, so 30 per node saturate near 90 / RTT")
print("requests per second over 3 nodes; past that, requests wait for a free connection. Latency is per")
print("request at the client; CPU and RSS are the frontend's (RSS after each load).")
print()
print("## Machine")
print(machine)
print()
print("## Command")
print("```")
print(command_line)
print("```")
print()
print("| added RTT | measured RTT ms | HTTP/1.1 x 30 saturates near (90 / RTT) req/s |")
print("| ---: | ---: | ---: |")
for rtt in rtts:
    measured = num(f"rtt.{rtt}.measured")
    print(f"| {rtt} ms | {fmt(measured, 2)} | {fmt(90 / (measured / 1000) if measured else None)} |")
if png:
    print()
    print("![p95, CPU per request and RSS by offered load](b4-pool-delay.png)")
for op, rates in (("get", get_rates), ("put", put_rates)):
    print()
    print(f"## {op.upper()} (each PUT crosses the pool 3 times, one per replica)" if op == "put" else "## GET")
    print()
    print("| added RTT | offered req/s | pool | achieved req/s | p50 ms | p95 ms | p99 ms | 2xx / sent "
          "| frontend CPU µs/req | frontend RSS MiB | HTTP/2 p95 / HTTP/1.1 p95 |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rtt in rtts:
        for rate in rates:
            for pool, name in POOLS:
                k = f"{pool}.{rtt}.{op}.{rate}"
                h1, h2 = num(f"http1-for-comparison.{rtt}.{op}.{rate}.p95"), num(f"http2.{rtt}.{op}.{rate}.p95")
                r = f"{h2 / h1:.2f}×" if pool == "http2" and h1 and h2 is not None else "-"
                print(f"| {rtt} ms | {values.get(k + '.offered', rate)} | {name} | {values.get(k + '.achieved', '-')} "
                      f"| {values.get(k + '.p50', '-')} | {values.get(k + '.p95', '-')} | {values.get(k + '.p99', '-')} "
                      f"| {values.get(k + '.ok', '-')} / {values.get(k + '.sent', '-')} | {fmt(cpu_us(k))} "
                      f"| {values.get(k + '.rss_mib', '-')} | {r} |")
print()
print("## B2's PUT row through the same path: 4 MiB PUTs, 1 connection x 8 streams, 4 MiB windows")
print()
print("| added RTT | pool | MB/s | p95 ms | 2xx / sent | frontend peak RSS MiB (whole run) |")
print("| ---: | --- | ---: | ---: | ---: | ---: |")
for rtt in rtts:
    for pool, name in POOLS:
        k = f"{pool}.{rtt}"
        print(f"| {rtt} ms | {name} | {values.get(k + '.put4m.mbps', '-')} | {values.get(k + '.put4m.p95', '-')} "
              f"| {values.get(k + '.put4m.ok', '-')} | {values.get(k + '.peak_rss_mib', '-')} |")

if png:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 3, figsize=(14, 8))
        colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
        for row, (op, rates) in enumerate((("get", get_rates), ("put", put_rates))):
            for col, (what, title) in enumerate((("p95", "p95 ms"), ("cpu", "frontend CPU µs / request"),
                                                  ("rss", "frontend RSS MiB"))):
                ax = axes[row][col]
                for i, rtt in enumerate(rtts):
                    for pool, name in POOLS:
                        xs, ys = [], []
                        for rate in rates:
                            k = f"{pool}.{rtt}.{op}.{rate}"
                            y = {"p95": num(k + ".p95"), "cpu": cpu_us(k), "rss": num(k + ".rss_mib")}[what]
                            if y is not None and num(k + ".offered") is not None:
                                xs.append(num(k + ".offered")); ys.append(y)
                        ax.plot(xs, ys, marker="o", color=colours[i % len(colours)],
                                linestyle="--" if pool.startswith("http1") else "-", label=f"{rtt} ms, {name}")
                ax.set_title(f"{op.upper()}: {title}")
                ax.set_xlabel("offered req/s")
                if what == "p95":
                    ax.set_yscale("log")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("B4 with delay: HTTP/1.1 x 30 (dashed) vs HTTP/2 x 4 (solid) pool, by added RTT")
        fig.tight_layout()
        fig.savefig(png, dpi=80)
    except ImportError:
        print("\n(matplotlib is not installed: no plot)", file=sys.stderr)
