"""A class of students on one inspector: a load test on 127.0.0.1 that stops by itself.

The server is the real ``glassllm inspect`` command in a child process, with an
access token, on 127.0.0.1 (loopback only, always), serving the bundled model
(or ``--model FILE``). The child exits by itself ``--duration`` + 120 s after it
starts, whatever happens to this script.

Each of ``--students`` simulated students (default 30) is a thread with its own
loopback address (127.0.0.10, .11, ...: its own client for the rate limit) and
its own cookie, and arrives within the first 20 s. It opens the page with the
token in the URL, as the printed link does, gets the cookie and loads the
page's files and ``/api/info``; then, session after session until the
duration is over:

- loads its own prompt of 50-256 tokens from a fixed set (``tokens``, the
  first heatmap, the next-token panel: what the page asks for on Run);
- then, with 0.5-2 s of think time before each, in random order: 40 view
  switches (layer, head, snapshot, value/gradient: one snapshot request each),
  5 generation steps (next token + heatmap at steps 1-5) and 3 interventions
  (next token before/after + heatmap under a head ablation, a score
  temperature or a mask switch).

One student in ten also sends, every third action, a bad or unauthenticated
request: no token, a wrong token, the cookie from another site's page, a
foreign Host, an oversized body, malformed JSON.

503 and 429 answers are retried after their ``Retry-After``, as the page does.
Reported: p50/p95/max latency per kind of request and action, counts by
status, the 503 and 429 counts, whether every unauthenticated request was
refused, and the server's resident memory (sampled every 0.5 s, and its
high-water mark from the kernel at the end). Targets:
view switch p95 <= 100 ms, new 256-token prompt <= 3 s, generation step p95
<= 300 ms, no 5xx but intended 503s, which stay under 1% of requests, and
peak RSS under the memory at start + ``--cache-mb`` + a working allowance of
``--allowance-mb`` (default 128 MB per worker: the pass a worker is computing,
its gradients, and the answer being sent; the server hands freed memory back
after each computation). At the end the server's own ``/api/stats`` tells what
its cache holds.

Run from the repository root (the machine may be shared: be nice)::

    nice -n 5 python -m bench.bench_classroom                     # 30 students x 5 min
    nice -n 5 python -m bench.bench_classroom --duration 60       # a shorter smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from bench.benchlib import environment, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# The server: the real command, which exits by itself after ``lifetime`` seconds.
SERVER_CHILD = (
    "import os, sys, threading\n"
    "threading.Timer(float(sys.argv[1]), lambda: os._exit(0)).start()\n"
    "from glassllm.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)
WORDS = ("once upon a time there was a little girl named lily she liked to play in the park with her "
         "big red ball one day she saw a small dog who was sad because he lost his bone they looked under "
         "the tree and behind the house and found it near the pond the dog was happy and they became best "
         "friends mom said you are very kind and gave them a cake tom and ben ran to the garden to see the "
         "flowers the sun was warm and the bird sang a happy song").split()
ALLOWANCE_PER_WORKER_MB = 128
TARGETS = {"view switch p95 ms": 100, "new 256-token prompt p95 s": 3.0, "generation step p95 ms": 300,
           "503 share": 0.01}


def make_prompts(tokenizer, count: int, seed: int, low: int = 50, high: int = 256) -> list[str]:
    """``count`` story-like prompts of ``low``..``high`` tokens (a sixth of them exactly ``high``)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        target = high if i % 6 == 0 else int(rng.integers(low, high + 1))
        words: list[str] = []
        while True:
            words.append(WORDS[int(rng.integers(len(WORDS)))])
            n = len(tokenizer.encode(" ".join(words), allowed_special="all"))
            if n >= target:
                if n > target:
                    words.pop()
                break
        out.append(" ".join(words).capitalize())
    return out


def peak_resident(pid: int) -> int | None:
    """The most memory process ``pid`` has had resident (VmHWM), in bytes; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Log:
    """Every request and action: (kind, status, seconds) -- thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[tuple[str, int, float]] = []
        self.actions: list[tuple[str, float, int]] = []           # kind, seconds, prompt tokens
        self.unauth: list[tuple[str, int]] = []                   # what, status
        self.bad: list[tuple[str, int]] = []
        self.errors: list[str] = []
        self.refusals: dict[str, int] = {}                       # "kind: message" of 400 answers -> count

    def request(self, kind, status, seconds):
        with self.lock:
            self.requests.append((kind, status, seconds))

    def action(self, kind, seconds, tokens=0):
        with self.lock:
            self.actions.append((kind, seconds, tokens))

    def refusal(self, kind, message):
        with self.lock:
            key = f"{kind}: {message}"
            self.refusals[key] = self.refusals.get(key, 0) + 1

    def note(self, text):
        with self.lock:
            if len(self.errors) < 20:
                self.errors.append(text[:300])


class Student:
    def __init__(self, i: int, base: str, token: str, info: dict, prompts: list[str], log: Log, stop_at: float,
                 seed: int, bad: bool):
        import httpx

        self.i, self.base, self.token, self.info, self.prompts, self.log = i, base, token, info, prompts, log
        self.stop_at, self.bad = stop_at, bad
        self.rng = np.random.default_rng([seed, i])
        self.address = f"127.0.0.{10 + i}"
        self.client = httpx.Client(base_url=base, timeout=60, follow_redirects=True,
                                   transport=httpx.HTTPTransport(local_address=self.address))

    # -- one request, retried after 503 / 429 as the page does ------------------------
    def send(self, kind: str, method: str, path: str, body=None, retries: int = 10):
        for _ in range(retries + 1):
            t0 = time.perf_counter()
            try:
                r = self.client.request(method, path, json=body)
            except Exception as e:  # noqa: BLE001 -- a transport failure is a finding, not a crash
                self.log.request(kind, 0, time.perf_counter() - t0)
                self.log.note(f"{kind} {path}: {type(e).__name__}: {e}")
                return None
            self.log.request(kind, r.status_code, time.perf_counter() - t0)
            if r.status_code in (503, 429) and time.monotonic() < self.stop_at:
                time.sleep(min(30.0, float(r.headers.get("retry-after", "1"))))
                continue
            if r.status_code == 400:            # an answer the page shows as a message (the text ended ...)
                self.log.refusal(kind, re.sub(r"\d+", "N", r.json().get("error", ""))[:120])
            elif r.status_code != 200:
                self.log.note(f"{kind} {path} -> {r.status_code} {r.text[:200]}")
            return r
        return r

    def think(self):
        time.sleep(float(self.rng.uniform(0.5, 2.0)))

    # -- what the page does ------------------------------------------------------------
    def open_page(self):
        t0 = time.perf_counter()
        r = self.send("page", "GET", f"/?token={self.token}")
        from glassllm.inspector.assets import SCRIPTS

        for path in ("/style.css", *("/" + name for name in SCRIPTS)):   # what the page loads after itself
            self.send("page", "GET", path)
        info = self.send("page", "GET", "/api/info")
        self.log.action("open page", time.perf_counter() - t0)
        return r is not None and r.status_code == 200 and info is not None and info.status_code == 200

    def view(self, prompt, name="attn.softmax", layer=0, head=0, grad=False, step=0, iv=None, kind="view switch"):
        body = {"prompt": prompt, "name": name, "layer": layer, "head": head}
        if grad:
            body["grad"] = True
        if step:
            body["step"] = step
        if iv:
            body["intervention"] = iv
        return self.send(kind, "POST", "/api/snapshot", body)

    def new_prompt(self, prompt):
        t0 = time.perf_counter()
        r = self.send("tokens", "POST", "/api/tokens", {"prompt": prompt})
        n = len(r.json()["ids"]) if r is not None and r.status_code == 200 else 0
        self.view(prompt, kind="snapshot, new prompt")
        self.send("next", "POST", "/api/next", {"prompt": prompt})
        self.log.action("new prompt", time.perf_counter() - t0, n)

    def random_view(self, prompt):
        names = self.info["names"]
        L = self.info["model"]["n_layers"]
        entry = names[int(self.rng.integers(len(names)))]
        layer = int(self.rng.integers(L)) if entry["in_layer"] else None
        head = int(self.rng.integers(entry["heads"])) if entry["heads"] else None
        grad = bool(self.rng.random() < 0.3) and entry["name"] != "probs" and not entry["name"].endswith("mask")
        t0 = time.perf_counter()
        self.view(prompt, entry["name"], layer, head, grad)
        self.log.action("view switch", time.perf_counter() - t0)

    def generation_step(self, prompt, step):
        t0 = time.perf_counter()
        r = self.send("next", "POST", "/api/next", {"prompt": prompt, "step": step})
        if r is not None and r.status_code == 200:
            self.view(prompt, step=step, kind="snapshot, step")
        self.log.action("generation step", time.perf_counter() - t0)

    def intervene(self, prompt, k):
        L, H = self.info["model"]["n_layers"], self.info["model"]["n_heads"]
        layer, head = int(self.rng.integers(L)), int(self.rng.integers(H))
        iv = [{"kind": "ablate", "layer": layer, "head": head},
              {"kind": "temperature", "layer": layer, "temperature": 2.0},
              {"kind": "mask_off", "layer": layer}][k % 3]
        t0 = time.perf_counter()
        self.send("next", "POST", "/api/next", {"prompt": prompt, "intervention": iv})
        self.view(prompt, layer=layer, iv=iv, kind="snapshot, intervention")
        self.log.action("intervention", time.perf_counter() - t0)

    # -- the student who misbehaves --------------------------------------------------------
    def misbehave(self, prompt):
        import httpx

        what = int(self.rng.integers(7))
        plain = {"prompt": prompt[:40]}
        with httpx.Client(base_url=self.base, timeout=60,
                          transport=httpx.HTTPTransport(local_address=self.address)) as stranger:
            if what == 0:
                r = stranger.post("/api/next", json=plain)                          # no token at all
                self.log.unauth.append(("no token", r.status_code))
            elif what == 1:
                r = stranger.get("/api/info", headers={"Authorization": "Bearer " + secrets.token_urlsafe(32)})
                self.log.unauth.append(("wrong token", r.status_code))
            elif what == 2:
                r = stranger.get("/", params={"token": self.token[:-2]})
                self.log.unauth.append(("wrong token in the URL", r.status_code))
            elif what == 3:                     # another site's page, riding on the student's cookie
                r = self.client.post("/api/next", json=plain, headers={"Origin": "http://evil.example"})
                self.log.unauth.append(("cross-site, with the cookie", r.status_code))
            elif what == 4:
                r = self.client.get("/api/info", headers={"Host": "evil.example"})
                self.log.unauth.append(("foreign Host, with the cookie", r.status_code))
            elif what == 5:
                r = self.client.post("/api/tokens", content=b'{"prompt": "' + b"a" * 300_000 + b'"}',
                                     headers={"Content-Type": "application/json"})
                self.log.bad.append(("oversized body", r.status_code))
            else:
                r = self.client.post("/api/snapshot", content=b'{"prompt": "hi", "name": ',
                                     headers={"Content-Type": "application/json"})
                self.log.bad.append(("malformed JSON", r.status_code))
        self.log.request("bad or unauthenticated", r.status_code, 0.0)

    # -- a student's time in class ----------------------------------------------------------
    def run(self, delay: float):
        time.sleep(delay)
        try:
            if not self.open_page():
                self.log.note(f"student {self.i}: the page did not open")
                return
            session = 0
            while time.monotonic() < self.stop_at:
                prompt = self.prompts[(self.i + session * 7) % len(self.prompts)]
                session += 1
                self.new_prompt(prompt)
                plan = ["view"] * 40 + ["step"] * 5 + ["intervene"] * 3
                self.rng.shuffle(plan)
                steps = interventions = 0
                for n, action in enumerate(plan):
                    if time.monotonic() >= self.stop_at:
                        return
                    self.think()
                    if self.bad and n % 3 == 0:
                        self.misbehave(prompt)
                    if action == "view":
                        self.random_view(prompt)
                    elif action == "step":
                        steps += 1
                        self.generation_step(prompt, steps)
                    else:
                        self.intervene(prompt, interventions)
                        interventions += 1
        except Exception as e:  # noqa: BLE001
            self.log.note(f"student {self.i}: {type(e).__name__}: {e}")
        finally:
            self.client.close()


def pct(values, q):
    return round(float(np.percentile(values, q)), 1) if len(values) else None


def summary(values_s) -> dict:
    ms = np.array(values_s) * 1000
    return {"count": len(ms), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95),
            "max_ms": round(float(ms.max()), 1) if len(ms) else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of class (default 300)")
    parser.add_argument("--model", default=None, help="model file (default: the bundled model)")
    parser.add_argument("--cache-mb", type=float, default=512)
    parser.add_argument("--allowance-mb", type=float, default=None,
                        help="memory beyond the start and the cache the server may use: work in flight "
                             f"(default {ALLOWANCE_PER_WORKER_MB} MB per worker)")
    parser.add_argument("--workers", type=int, default=None, help="server workers (default: one per core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "classroom.json"))
    args = parser.parse_args(argv)
    if args.students < 1 or args.duration <= 0:
        parser.error("--students must be >= 1 and --duration > 0")

    import httpx
    import psutil

    from glassllm.inspector.pool import default_workers

    workers = args.workers or default_workers()
    allowance_mb = args.allowance_mb if args.allowance_mb is not None else ALLOWANCE_PER_WORKER_MB * workers

    from glassllm.checkpoint import bundled_model_path, load_model

    model_path = Path(args.model) if args.model else bundled_model_path()
    _, tokenizer, _ = load_model(model_path)
    prompts = make_prompts(tokenizer, max(args.students, 30), args.seed)
    lengths = [len(tokenizer.encode(p, allowed_special="all")) for p in prompts]
    token = secrets.token_urlsafe(32)
    load_before = os.getloadavg()
    cmd = [sys.executable, "-c", SERVER_CHILD, str(args.duration + 120), "inspect", "Once upon a time",
           "--model", str(model_path), "--host", "127.0.0.1", "--port", "0", "--no-browser", "--token", token,
           "--cache-mb", str(args.cache_mb)]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    log = Log()
    rss: list[tuple[float, int]] = []
    try:
        line = proc.stdout.readline()
        if "http://127.0.0.1:" not in line:
            raise SystemExit(f"the server did not start: {line!r} {proc.stderr.read()[-2000:]}")
        base = line.split()[2].split("?")[0].rstrip("/")
        server = psutil.Process(proc.pid)
        start_rss = server.memory_info().rss
        with httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
            info = c.get("/api/info").json()
        print(f"{args.students} students x {args.duration:.0f} s on {base} ({model_path.name}); prompts of "
              f"{min(lengths)}-{max(lengths)} tokens; server RSS at start {start_rss / 2**20:.0f} MB; "
              f"load average {load_before[0]:.1f}", flush=True)
        t_start = time.monotonic()
        stop_at = t_start + args.duration
        rng = np.random.default_rng(args.seed)
        students = [Student(i, base, token, info, prompts, log, stop_at, args.seed, bad=(i % 10 == 0))
                    for i in range(args.students)]
        threads = [threading.Thread(target=s.run, args=(float(rng.uniform(0, min(20.0, args.duration / 4))),),
                                    daemon=True) for s in students]
        for t in threads:
            t.start()
        last = 0.0
        while any(t.is_alive() for t in threads) and time.monotonic() < stop_at + 90:
            rss.append((time.monotonic() - t_start, server.memory_info().rss))
            if time.monotonic() - last > 30:
                last = time.monotonic()
                print(f"  {time.monotonic() - t_start:5.0f} s: {len(log.requests):,} requests, "
                      f"RSS {rss[-1][1] / 2**20:.0f} MB", flush=True)
            time.sleep(0.5)
        elapsed = time.monotonic() - t_start
        for t in threads:
            t.join(1)
        rss.append((time.monotonic() - t_start, server.memory_info().rss))
        with httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
            server_stats = c.get("/api/stats").json()
        high_water = peak_resident(proc.pid)
    finally:
        proc.kill()                                   # it would stop by itself, later
        proc.wait(timeout=30)
        stderr = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()

    # -- figures ---------------------------------------------------------------------------
    requests = log.requests
    statuses: dict[str, dict[str, int]] = {}
    for kind, status, _ in requests:
        statuses.setdefault(kind, {}).setdefault(str(status), 0)
        statuses[kind][str(status)] += 1
    by_request = {k: summary([s for kk, st, s in requests if kk == k and st == 200])
                  for k in sorted({r[0] for r in requests}) if k != "bad or unauthenticated"}
    by_action = {k: summary([s for kk, s, _ in log.actions if kk == k])
                 for k in ("open page", "new prompt", "view switch", "generation step", "intervention")}
    longest = max(lengths)
    by_action["new prompt, longest"] = summary([s for kk, s, n in log.actions if kk == "new prompt" and n == longest])
    total = len(requests)
    n503 = sum(1 for r in requests if r[1] == 503)
    n429 = sum(1 for r in requests if r[1] == 429)
    other5xx = sum(1 for r in requests if r[1] >= 500 and r[1] != 503)
    transport = sum(1 for r in requests if r[1] == 0)
    unauth_let_in = [w for w, st in log.unauth if st not in (401, 403, 429)]
    bad_let_in = [w for w, st in log.bad if st < 400]
    sampled_peak = max(r for _, r in rss)
    peak = max(sampled_peak, high_water or 0)           # the kernel's high-water mark misses no spike
    cap = start_rss + (args.cache_mb + allowance_mb) * 2**20
    view = by_action["view switch"]
    gen = by_action["generation step"]
    new_long = by_action["new prompt, longest"]
    checks = {
        "view switch p95 <= 100 ms": view["p95_ms"] is not None and view["p95_ms"] <= 100,
        f"new {longest}-token prompt p95 <= 3 s": new_long["p95_ms"] is not None and new_long["p95_ms"] <= 3000,
        "generation step p95 <= 300 ms": gen["p95_ms"] is not None and gen["p95_ms"] <= 300,
        "no 5xx other than 503": other5xx == 0 and transport == 0,
        "503s < 1% of requests": n503 < 0.01 * total,
        "every unauthenticated request refused": not unauth_let_in and len(log.unauth) > 0,
        "peak RSS < start + cache + allowance": peak < cap,
    }
    report = {
        "benchmark": "classroom", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.bench_classroom " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {"students": args.students, "duration_s": args.duration, "elapsed_s": round(elapsed, 1),
                   "model": model_path.name, "cache_mb": args.cache_mb, "allowance_mb": allowance_mb,
                   "workers": workers, "prompt_tokens": {"min": min(lengths),
                                                                                "max": longest},
                   "bad_students": sum(1 for s in students if s.bad)},
        "requests": total, "per_second": round(total / elapsed, 1),
        "status_by_kind": statuses, "latency_by_request": by_request, "latency_by_action": by_action,
        "count_503": n503, "count_429": n429, "share_503": round(n503 / max(total, 1), 4),
        "other_5xx": other5xx, "transport_errors": transport,
        "unauthenticated": {"sent": len(log.unauth), "let_in": unauth_let_in,
                            "by_what": {w: sorted({st for ww, st in log.unauth if ww == w})
                                        for w in sorted({w for w, _ in log.unauth})}},
        "bad_requests": {"sent": len(log.bad), "let_through": bad_let_in,
                         "by_what": {w: sorted({st for ww, st in log.bad if ww == w})
                                     for w in sorted({w for w, _ in log.bad})}},
        "rss_mb": {"start": round(start_rss / 2**20, 1), "peak": round(peak / 2**20, 1),
                   "end": round(rss[-1][1] / 2**20, 1), "cap": round(cap / 2**20, 1),
                   "sampled_peak": round(sampled_peak / 2**20, 1),
                   "high_water": None if high_water is None else round(high_water / 2**20, 1),
                   "cache_at_end": round(server_stats["cache"]["bytes"] / 2**20, 1)},
        "server_stats": server_stats,
        "checks": checks, "targets": TARGETS, "notes": log.errors,
        "answered_400": log.refusals,   # the bad students' requests are under "bad_requests"
        "server_stderr_tail": stderr[-2000:],
        "environment": environment(load_before),
    }
    print(f"\n{total:,} requests in {elapsed:.0f} s ({report['per_second']}/s); 503: {n503} "
          f"({100 * report['share_503']:.2f}%), 429: {n429}, other 5xx: {other5xx}, transport errors: {transport}")
    print(f"{'action':24s} {'count':>6s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s}")
    for k, v in {**by_action, **{f"  {k}": v for k, v in by_request.items()}}.items():
        print(f"{k:24s} {v['count']:6d} {v['p50_ms'] or 0:8.1f} {v['p95_ms'] or 0:8.1f} {v['max_ms'] or 0:8.1f}")
    print(f"unauthenticated: {len(log.unauth)} sent, {len(unauth_let_in)} let in; bad: {len(log.bad)} sent, "
          f"{len(bad_let_in)} let through")
    print(f"server RSS: start {report['rss_mb']['start']} MB, peak {report['rss_mb']['peak']} MB, "
          f"cap {report['rss_mb']['cap']} MB (start + {args.cache_mb:g} MB cache + {allowance_mb:g} MB for "
          f"{workers} workers); the cache held {report['rss_mb']['cache_at_end']} MB at the end")
    for name, ok in checks.items():
        print(f"  {'yes' if ok else 'NO ':3s} {name}")
    if log.errors:
        print("notes:\n  " + "\n  ".join(log.errors[:10]))
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
