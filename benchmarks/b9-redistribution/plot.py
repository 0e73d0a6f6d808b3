"""B9's plot, from the tables of its RESULTS.md (so a committed run can be drawn again).

Usage: plot.py RESULTS.md OUT.svg
Left: copy rate into the new node per blob size, next to dd's synced write rate (and the 0.8x
target). Right: foreground p99 per round, idle and while a throttled copy runs.
A plain SVG written here (no matplotlib or gnuplot on the benchmark machine).
"""
import re
import sys


def tables(text):
    """Rows of every markdown table, each a list of its cells with ** stripped."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([c.strip().strip("*") for c in line.strip().strip("|").split("|")])
    return rows


def number(cell):
    try:
        return float(cell.rstrip("x").replace(",", ""))
    except ValueError:
        return None


def parse(text):
    copies, rounds = [], []
    for cells in tables(text):
        if len(cells) == 6 and number(cells[0]) and number(cells[4]) and "." in cells[3]:
            copies.append((int(number(cells[0])), number(cells[4])))
        if len(cells) == 8 and cells[3].endswith("x") and number(cells[0]):
            rounds.append([number(c) for c in (cells[0], cells[1], cells[2], cells[4], cells[5])])
    dd = re.search(r"conv=fdatasync` of \d+ MiB: \*\*([\d.]+) MB/s", text)
    return copies, rounds, float(dd.group(1)) if dd else None


def label(size):
    return f"{size // (1 << 20)} MiB" if size >= 1 << 20 else f"{size // 1024} KiB"


def svg(copies, rounds, dd, path):
    w, h, base, ph = 980, 360, 300, 240
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           '<text x="10" y="20" font-size="14">B9: copy rate into a new replica (left) and foreground p99 '
           'while a throttled copy runs (right), shared 2-core machine</text>']
    # Left panel: MB/s per blob size, dd's line and the 0.8x target.
    x0, pw = 60, 320
    top = max([r for _, r in copies] + [dd or 0, 1.0]) * 1.1
    out.append(f'<line x1="{x0}" y1="{base}" x2="{x0 + pw}" y2="{base}" stroke="black"/>')
    group = pw / max(len(copies), 1)
    for i, (size, mbs) in enumerate(copies):
        bh = mbs / top * ph
        x = x0 + i * group + group * 0.2
        out.append(f'<rect x="{x:.1f}" y="{base - bh:.1f}" width="{group * 0.6:.1f}" height="{bh:.1f}" fill="#1f77b4"/>')
        out.append(f'<text x="{x:.1f}" y="{base - bh - 4:.1f}">{mbs:.0f}</text>')
        out.append(f'<text x="{x:.1f}" y="{base + 15}">{label(size)}</text>')
    if dd:
        for value, name, dash in ((dd, f"dd {dd:.0f} MB/s", ""), (0.8 * dd, "0.8x dd", ' stroke-dasharray="4,3"')):
            y = base - value / top * ph
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + pw}" y2="{y:.1f}" stroke="#d62728"{dash}/>')
            out.append(f'<text x="{x0 + pw + 4}" y="{y + 4:.1f}" fill="#d62728">{name}</text>')
    out.append(f'<text x="{x0 + 80}" y="{base + 32}">blob size (MB/s, unthrottled)</text>')
    # Right panel: per round, GET idle/throttled and PUT idle/throttled p99 in ms.
    x1, pw2 = 520, 420
    colors = ["#aec7e8", "#1f77b4", "#ffbb78", "#ff7f0e"]
    names = ["GET idle", "GET throttled", "PUT idle", "PUT throttled"]
    top2 = max([v for r in rounds for v in r[1:] if v] + [1.0]) * 1.1
    out.append(f'<line x1="{x1}" y1="{base}" x2="{x1 + pw2}" y2="{base}" stroke="black"/>')
    group = pw2 / max(len(rounds), 1)
    bar = group * 0.8 / 4
    for g, r in enumerate(rounds):
        gx = x1 + g * group + group * 0.1
        out.append(f'<text x="{gx + group * 0.3:.1f}" y="{base + 15}">{int(r[0])}</text>')
        for i, v in enumerate(r[1:]):
            bh = (v or 0) / top2 * ph
            out.append(f'<rect x="{gx + i * bar:.1f}" y="{base - bh:.1f}" width="{bar * 0.9:.1f}" height="{bh:.1f}" fill="{colors[i]}"/>')
    out.append(f'<text x="{x1 + 150}" y="{base + 32}">round (p99 ms)</text>')
    out.append(f'<text x="{x1 - 40}" y="{base - ph:.0f}">{top2:.0f}</text>')
    for i, name in enumerate(names):
        out.append(f'<rect x="{x1 + i * 105}" y="{base - ph - 20}" width="12" height="12" fill="{colors[i]}"/>')
        out.append(f'<text x="{x1 + i * 105 + 16}" y="{base - ph - 10}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    text = open(sys.argv[1]).read()
    copies, rounds, dd = parse(text)
    if not copies or not rounds:
        sys.exit(f"{sys.argv[1]}: no copy or round table found")
    svg(copies, rounds, dd, sys.argv[2])


main()
