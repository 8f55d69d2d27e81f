"""Many sessions on one machine, most of them paused; prints figures. For any Sandbank server.

    .venv/bin/python bench/hibernate.py --url URL [--token T] [--sessions 2000] [--check 100]
        [--data-dir DIR]

Start the server with a ceiling of running sessions far below `--sessions` (for instance
`SANDBANK_MAX_SESSIONS=100`): at the ceiling the least recently used idle session is paused to
make room, so most sessions end up paused. Each session sets a variable of its own (a number and
a numpy array derived from its index); then a random `--check` of them are called again (each
call resumes a paused session) and must answer their own values. Prints the time of a
create + first call while the machine fills (p50, p99), how many sessions are paused and
running (the server's own gauge), what the machine's available memory and the data
directory's disk went down and up by, and the resume + call times (p50, p99). Every session it
made is ended at the end. Sessions ask for an idle timeout and a lifetime of an hour (the
default ceilings): the whole run must fit in it (10,000 sessions took 11 minutes here).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import http_protocol  # bench/, beside this script

SET = "import numpy as np\nv = {i}\na = np.arange(1000) * {i}"
GET = "print(v, int(a.sum()))"
MiB = 1 << 20


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def available() -> int:
    for row in Path("/proc/meminfo").read_text().splitlines():
        if row.startswith("MemAvailable:"):
            return int(row.split()[1]) * 1024
    return 0


def disk_used(path: Path | None) -> int:
    if path is None:
        return 0
    out = subprocess.run(
        ["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True, check=False
    )
    return int(out.stdout.split()[0]) if out.stdout else 0


def sessions_by_state(c: http_protocol.Client) -> dict[str, float]:
    c.conn.request("GET", "/metrics", headers=c.headers)
    text = c.conn.getresponse().read().decode()
    found: dict[str, float] = {}
    for row in text.splitlines():
        if row.startswith("sandbank_sessions{"):
            state = row.split('state="', 1)[1].split('"', 1)[0]
            found[state] = float(row.rsplit(" ", 1)[1])
    return found


def expected(i: int) -> str:
    return f"{i} {sum(range(1000)) * i}\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--token")
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--check", type=int, default=100)
    ap.add_argument("--data-dir", type=Path, help="the server's, to measure its disk")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    c = http_protocol.Client(args.url, args.token)
    mem0, disk0, t_start = available(), disk_used(args.data_dir), time.monotonic()
    made: list[str] = []
    fills: list[float] = []
    try:
        for i in range(args.sessions):
            t0 = time.perf_counter()
            # The longest the server allows by default: a run of 10,000 outlasts the default
            # idle timeout (600 s), which ends a session, paused or not.
            sid = c.create({"idle_timeout_seconds": 3600, "max_lifetime_seconds": 3600})
            made.append(sid)
            out = c.execute(sid, SET.format(i=i))
            fills.append(http_protocol.ms_since(t0))
            if out.get("return_code") != 0:
                raise RuntimeError(f"session {i}: {out.get('stderr', '')[-300:]}")
            if (i + 1) % 250 == 0:
                print(f"... {i + 1} sessions ({sessions_by_state(c)})", flush=True)
        fill_s = time.monotonic() - t_start
        time.sleep(5)  # the last pauses finish
        c.conn.close()  # the server closes a keep-alive connection idle that long: start afresh
        states = sessions_by_state(c)
        mem1, disk1 = available(), disk_used(args.data_dir)
        print(f"sessions made                       {len(made)} in {fill_s:.0f} s")
        print(
            f"create + first call                 p50 {statistics.median(fills):7.1f} ms"
            f"   p99 {pct(fills, 0.99):7.1f} ms"
        )
        paused, running = states.get("paused", 0), states.get("idle", 0) + states.get("busy", 0)
        print(
            f"paused / running                    {paused:.0f} / {running:.0f}"
            f" ({100 * paused / max(1, paused + running):.1f}% paused)"
        )
        print(f"available memory went down by       {(mem0 - mem1) / MiB:.0f} MiB")
        if args.data_dir is not None:
            grew = (disk1 - disk0) / MiB
            print(
                f"data directory grew by              {grew:.0f} MiB"
                f" ({grew / max(1, len(made)):.2f} MiB a session)"
            )
        picked = random.Random(args.seed).sample(range(len(made)), min(args.check, len(made)))
        resumes: list[float] = []
        wrong = 0
        for i in picked:
            t0 = time.perf_counter()
            out = c.execute(made[i], GET)
            resumes.append(http_protocol.ms_since(t0))
            wrong += out.get("stdout") != expected(i)
        print(
            f"resume + call of a random {len(picked):<5}"
            f"    p50 {statistics.median(resumes):7.1f} ms"
            f"   p99 {pct(resumes, 0.99):7.1f} ms   wrong answers: {wrong}"
        )
        free = shutil.disk_usage(args.data_dir or "/").free / (1 << 30)
        print(f"disk free at the end                {free:.1f} GiB")
    finally:
        ender = http_protocol.Client(args.url, args.token)
        for sid in made:
            try:
                ender.destroy(sid)
            except (OSError, RuntimeError) as e:  # reclaimed meanwhile: end the others
                print(f"ending {sid}: {e}")
                ender = http_protocol.Client(args.url, args.token)


if __name__ == "__main__":
    main()
