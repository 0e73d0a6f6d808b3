"""B8's tables, target ratios and plot from run.sh's results (one JSON object per visit).

Usage: report.py RESULTS.jsonl DOCS PLOT.svg
       report.py --bound BOUND.jsonl DOCS   (the client-bound case's table and target ratios)
The plot is a plain SVG written here (no matplotlib or gnuplot on the benchmark machine).
"""
import json
import sys


def load(path):
    rows = [json.loads(line) for line in open(path)]
    for r in rows:
        s = max(r["seconds"], 1e-9)
        r["docs_s"] = r["docs"] / s
        r["wire_gbps"] = r["wire"] * 8 / s / 1e9
        r["body_gbps"] = None if r["body"] is None else r["body"] * 8 / s / 1e9
    return rows


def table(rows, docs):
    print("| client | added RTT | slices | stream | documents | seconds | docs/s | wire Gbps | body Gbps | client CPU s | client CPU ms per 1,000 docs |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in sorted(rows, key=lambda r: (r["client"], r["rtt"], r["slices"], not r["stream"])):
        body = "" if r["body_gbps"] is None else f"{r['body_gbps']:.3f}"
        flag = "" if r["docs"] == docs else " (incomplete)"
        cpu = r.get("cpu")
        cpu_cells = "| | |" if cpu is None else f"| {cpu:.2f} | {cpu / max(r['docs'], 1) * 1e6:.1f} |"
        print(f"| {r['client']} visit | {r['rtt']} ms | {r['slices']} | {str(r['stream']).lower()} "
              f"| {r['docs']}{flag} | {r['seconds']:.2f} | {r['docs_s']:,.0f} | {r['wire_gbps']:.3f} | {body} {cpu_cells}")


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def targets(rows):
    by = {(r["client"], r["rtt"], r["slices"], r["stream"]): r["docs_s"] for r in rows}
    rtts = sorted({r["rtt"] for r in rows})
    slices = sorted({r["slices"] for r in rows})
    print()
    print("### Target ratios (docs/s)")
    print()
    print("Streaming vs non-streamed, `larder visit` (target >= 1.5x at 20 ms):")
    print()
    print("| added RTT | " + " | ".join(f"{n} slice{'s' if n > 1 else ''}" for n in slices) + " |")
    print("| --- |" + " ---: |" * len(slices))
    for rtt in rtts:
        cells = [ratio(by.get(("larder", rtt, n, True)), by.get(("larder", rtt, n, False))) for n in slices]
        print(f"| {rtt} ms | " + " | ".join(cells) + " |")
    print()
    print("Slices vs one slice, `larder visit` (target: 4 slices >= 3x one where the client is the bottleneck):")
    print()
    print("| added RTT | stream | " + " | ".join(f"{n} / 1" for n in slices) + " |")
    print("| --- | --- |" + " ---: |" * len(slices))
    for rtt in rtts:
        for stream in (True, False):
            one = by.get(("larder", rtt, 1, stream))
            cells = [ratio(by.get(("larder", rtt, n, stream)), one) for n in slices]
            print(f"| {rtt} ms | {str(stream).lower()} | " + " | ".join(cells) + " |")
    if any(r["client"] == "vespa" for r in rows):
        print()
        print("`larder visit` vs `vespa visit`, same slices and stream setting (target >= 2x):")
        print()
        print("| added RTT | stream | " + " | ".join(f"{n} slice{'s' if n > 1 else ''}" for n in slices) + " |")
        print("| --- | --- |" + " ---: |" * len(slices))
        for rtt in rtts:
            for stream in (True, False):
                cells = [ratio(by.get(("larder", rtt, n, stream)), by.get(("vespa", rtt, n, stream))) for n in slices]
                print(f"| {rtt} ms | {str(stream).lower()} | " + " | ".join(cells) + " |")


def svg(rows, path):
    """One panel per RTT: docs/s per slice count, a bar per (client, stream)."""
    series = [(c, s) for c in ("larder", "vespa") for s in (True, False)
              if any(r["client"] == c and r["stream"] == s for r in rows)]
    colors = ["#1f77b4", "#aec7e8", "#d62728", "#ff9896"]
    rtts = sorted({r["rtt"] for r in rows})
    slices = sorted({r["slices"] for r in rows})
    top = max([r["docs_s"] for r in rows] + [1.0])
    pw, ph, left, base = 420, 260, 60, 300
    width = left + pw * len(rtts) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="380" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="380" fill="white"/>',
           '<text x="10" y="20" font-size="14">B8: visiting throughput (docs/s), shared busy 2-core machine</text>']
    group = pw / max(len(slices), 1)
    bar = group * 0.8 / max(len(series), 1)
    for p, rtt in enumerate(rtts):
        x0 = left + p * pw
        out.append(f'<text x="{x0 + pw / 2 - 40}" y="{base - ph - 5}">added RTT {rtt} ms</text>')
        out.append(f'<line x1="{x0}" y1="{base}" x2="{x0 + pw - 10}" y2="{base}" stroke="black"/>')
        for g, n in enumerate(slices):
            gx = x0 + g * group + group * 0.1
            out.append(f'<text x="{gx + group * 0.3}" y="{base + 15}">{n}</text>')
            for i, (c, s) in enumerate(series):
                v = next((r["docs_s"] for r in rows if (r["client"], r["rtt"], r["slices"], r["stream"]) == (c, rtt, n, s)), 0)
                h = v / top * ph
                out.append(f'<rect x="{gx + i * bar:.1f}" y="{base - h:.1f}" width="{bar * 0.95:.1f}" height="{h:.1f}" fill="{colors[i]}"/>')
        out.append(f'<text x="{x0 + pw / 2 - 20}" y="{base + 32}">slices</text>')
    for t in range(5):
        v = top * t / 4
        y = base - ph * t / 4
        out.append(f'<text x="5" y="{y + 4:.0f}">{v:,.0f}</text>')
    for i, (c, s) in enumerate(series):
        lx = left + i * 170
        out.append(f'<rect x="{lx}" y="355" width="12" height="12" fill="{colors[i]}"/>')
        out.append(f'<text x="{lx + 16}" y="366">{c} visit, stream={str(s).lower()}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def bound(path, docs):
    """Client-bound visits: one CPU-limited process per slice, for each client."""
    rows = [json.loads(line) for line in open(path)]
    for r in rows:
        r["docs_s"] = r["docs"] / max(r["flowing"], 1e-9)
    by = {(r["client"], r["slices"]): r["docs_s"] for r in rows}
    print("| client | slices (processes) | documents | seconds (whole run) | seconds flowing | docs/s flowing | vs 1 slice | client CPU s | client CPU ms per 1,000 docs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in sorted(rows, key=lambda r: (r["client"], r["slices"])):
        flag = "" if r["docs"] == docs else " (incomplete)"
        print(f"| {r['client']} visit | {r['slices']} | {r['docs']}{flag} | {r['seconds']:.2f} | {r['flowing']:.2f} "
              f"| {r['docs_s']:,.0f} | {ratio(r['docs_s'], by.get((r['client'], 1)))} "
              f"| {r['cpu']:.2f} | {r['cpu'] / max(r['docs'], 1) * 1e6:.2f} |")
    slices = sorted({r["slices"] for r in rows})
    # Where the client is the bottleneck, a process's rate is its CPU over its CPU per document:
    # N processes of equal CPU give N x (CPU per document with one) / (CPU per document with N).
    per_doc = {(r["client"], r["slices"]): r["cpu"] / max(r["docs"], 1) for r in rows}
    print()
    print("At equal CPU per client process, from the CPU each run used per document (exact, unlike")
    print("the quota: CFS enforces a hundredth of a core only to within a 4 ms tick per 100 ms period,")
    print("so a client that runs in long bursts gets more than its share, one that waits on the")
    print("network less):")
    print()
    print("| client | slices | N slices / 1 at equal CPU per process |")
    print("| --- | ---: | ---: |")
    for (client, n), cost in sorted(per_doc.items()):
        one = per_doc.get((client, 1))
        print(f"| {client} visit | {n} | {ratio(n * one, cost) if one else 'n/a'} |")
    if any(r["client"] == "vespa" for r in rows):
        print()
        print("`larder visit` vs `vespa visit` with the same CPU per process (target >= 2x):")
        print()
        print("| slices | docs/s flowing, larder / vespa | CPU per document, vespa / larder |")
        print("| ---: | ---: | ---: |")
        for n in slices:
            print(f"| {n} | {ratio(by.get(('larder', n)), by.get(('vespa', n)))} "
                  f"| {ratio(per_doc.get(('vespa', n)), per_doc.get(('larder', n)))} |")


def main():
    if sys.argv[1] == "--bound":
        bound(sys.argv[2], int(sys.argv[3]))
        return
    rows = load(sys.argv[1])
    table(rows, int(sys.argv[2]))
    targets(rows)
    svg(rows, sys.argv[3])


main()
