#!/usr/bin/python3
"""The HTML report renders in headless Chromium (ctest loadgen_report_screenshot).

Writes a report from synthetic results, takes a screenshot with `chromium --headless
--screenshot`, decodes the PNG with zlib (no imaging library) and checks that each of the three
plots drew its series: pixels of the series' colours (report_html.cpp fixes them) inside that
plot's area, so a blank page, a script error or an empty plot fails. Skips (77) without chromium.
"""

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

SKIP = 77
WIDTH, HEIGHT = 1300, 1000
# (plot, colour, minimum pixels): connections line, p50 and p99 lines, histogram bars.
EXPECT = [("connections", (0x1f, 0x77, 0xb4), 300), ("latency p50", (0x2c, 0xa0, 0x2c), 300),
          ("latency p99", (0xd6, 0x27, 0x28), 300), ("histogram", (0x94, 0x67, 0xbd), 1000)]


def decode_png(data):
    """(width, height, rows of RGB tuples) for 8-bit RGB or RGBA PNGs, non-interlaced."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, f"unsupported PNG {depth}/{ctype}/{interlace}"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def count_colours(width, bpp, rows, colours):
    """Pixels of each exact colour (the plots draw with crispEdges, so series keep their colour)."""
    wanted = {bytes(c): 0 for c in colours}
    for line in rows:
        data = bytes(line)
        for x in range(0, width * bpp, bpp):
            px = data[x:x + 3]
            if px in wanted:
                wanted[px] += 1
    return {tuple(k): v for k, v in wanted.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--loadgen-test", required=True, help="loadgen_report_fixture binary")
    p.add_argument("--out", required=True)
    p.add_argument("--html", help="check this report instead of a synthetic one")
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("chromium not installed (scripts/install-deps.sh adds it): skipping")
        return SKIP
    os.makedirs(args.out, exist_ok=True)
    html = args.html or os.path.join(args.out, "report.html")
    if not args.html:
        subprocess.run([args.loadgen_test, html], check=True, timeout=30)
    png = os.path.join(args.out, "report.png")
    if os.path.exists(png):
        os.unlink(png)
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--user-data-dir=" + profile, "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}",
               "--virtual-time-budget=5000", f"--screenshot={png}", "file://" + os.path.abspath(html)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if not os.path.exists(png):
        print(f"no screenshot (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return 1
    with open(png, "rb") as f:
        width, height, bpp, rows = decode_png(f.read())
    counts = count_colours(width, bpp, rows, [rgb for _, rgb, _ in EXPECT])
    failures = 0
    for name, rgb, minimum in EXPECT:
        n = counts[rgb]
        good = n >= minimum
        failures += 0 if good else 1
        print(f"{name}: {n} pixels of #{rgb[0]:02x}{rgb[1]:02x}{rgb[2]:02x} (need {minimum}): {'ok' if good else 'FAILED'}")
    print(f"screenshot {width}x{height}: {png}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
