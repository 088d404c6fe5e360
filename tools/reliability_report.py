"""The reliability figures: bad inputs, random SIGKILLs, fuzzing and a load test, at full size.

Run from the repository root::

    python -m tools.reliability_report            # everything (~15 min on 2 busy cores)
    python -m tools.reliability_report --table    # only regenerate the inventory table in the doc
    python -m tools.reliability_report --classroom  # only the classroom figures, from bench/results/classroom.json
    python -m tools.reliability_report --hostile  # only the hostile-input cases and the limits table (~1 min)

It runs the same code as the tests (``tests/test_reliability_*.py``), larger:

1. **Bad inputs.** Every case of the inventory in-process (the table in
   ``docs/reliability.md`` is regenerated from the lines they produce), and
   every command-line case again as a real ``glassllm`` subprocess (fresh
   interpreter, real argv bytes, a real file-size limit for the full disk):
   exit codes, stderr, tracebacks and NaNs counted per entry point.
2. **SIGKILLs.** ``kill_campaign`` with ``--kills`` (default 50) kills at
   random moments; every checkpoint left must load; the resumed run's final
   weights, AdamW moments, sampler and history must equal a straight run's.
3. **Fuzzing.** The Hypothesis and schemathesis properties of
   ``tests/test_reliability_fuzz.py`` with ``--fuzz-examples`` (default 2000)
   examples each, in a pytest subprocess; examples counted per property.
4. **Load.** ``--clients`` (20) clients for ``--seconds`` (30) against a
   server process on 127.0.0.1 serving a model of the bundled shape:
   requests, status codes, p50/p95/p99 latency, server memory.

5. **Hostile inputs.** ``tests/test_reliability_hostile.py`` in a pytest
   subprocess: its cases counted per class (readers, parsers, routes,
   options), each run under an address-space limit; and the limits table
   (``glassllm.limits``) written into the doc.

Figures are printed, written to ``bench/results/reliability.json`` and into
the figures section of ``docs/reliability.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from tests import test_reliability_inventory as inv  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "reliability.json"
CLASSROOM = ROOT / "bench" / "results" / "classroom.json"
CLASSROOM_BEGIN = "<!-- BEGIN CLASSROOM: python -m tools.reliability_report --classroom -->"
CLASSROOM_END = "<!-- END CLASSROOM -->"
FIGURES_BEGIN = "<!-- BEGIN FIGURES: python -m tools.reliability_report -->"
FIGURES_END = "<!-- END FIGURES -->"
HOSTILE_BEGIN = "<!-- BEGIN HOSTILE: python -m tools.reliability_report --hostile -->"
HOSTILE_END = "<!-- END HOSTILE -->"
LIMITS_BEGIN = "<!-- BEGIN LIMITS: glassllm.limits.markdown_table() -->"
LIMITS_END = "<!-- END LIMITS -->"
HOSTILE_RESULTS = ROOT / "bench" / "results" / "hostile.json"

# A glassllm process for one command-line case; "full" first sets a 0-byte file-size limit (a full disk).
CLI_CHILD = (
    "import resource, signal, sys\n"
    "if sys.argv[1] == 'full':\n"
    "    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
    "from glassllm.cli import main\nsys.exit(main(sys.argv[2:]))\n"
)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# 1. The inventory
# ----------------------------------------------------------------------------

def run_inventory(subprocesses: bool = True) -> tuple[dict, list, list]:
    env = inv.get_env()
    if not env.readonly:
        raise SystemExit("no folder here refuses writes; cannot run the non-writable cases")
    cases = inv.all_cases()
    t0 = time.perf_counter()
    outcomes = [inv.run_case(c, env) for c in cases]
    figures = {"in_process_s": round(time.perf_counter() - t0, 1), "entries": {}}
    for entry in inv.ENTRIES:
        mine = [(c, o) for c, o in zip(cases, outcomes) if c.entry == entry]
        figures["entries"][entry] = {
            "cases": len(mine), "bad_inputs": sum(1 for c, _ in mine if not c.ok),
            "accepted_odd_inputs": sum(1 for c, _ in mine if c.ok),
            "passed": sum(1 for _, o in mine if o.passed),
            "tracebacks": sum(1 for _, o in mine if o.status == "traceback"),
            "nans": sum(1 for _, o in mine if o.status == "nan"),
            "other_failures": [f"{c.input}: {o.line}" for c, o in mine if o.status == "wrong"],
        }
    if subprocesses:
        figures["cli_subprocess"] = run_cli_subprocesses(env, [(c, o) for c, o in zip(cases, outcomes)
                                                              if c.entry == "cli"])
    return figures, cases, outcomes


def run_cli_subprocesses(env, pairs) -> dict:
    """Every command-line case as a real process; its error line must equal the in-process one."""
    out = {"cases": 0, "passed": 0, "tracebacks": 0, "nans": 0, "same_line_as_in_process": 0, "failures": []}
    t0 = time.perf_counter()
    for case, inproc in pairs:
        argv = [a.encode("utf-8", "surrogateescape") for a in case.run]     # invalid UTF-8 as real bytes
        proc = subprocess.run([sys.executable, "-c", CLI_CHILD, "full" if case.disk_full else "-", *argv],
                              cwd=env.root, capture_output=True, timeout=600,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        stdout = proc.stdout.decode("utf-8", "replace")
        stderr = proc.stderr.decode("utf-8", "replace")
        o = inv.judge_cli(case, proc.returncode, stdout, stderr)
        out["cases"] += 1
        out["passed"] += o.passed
        out["tracebacks"] += o.status == "traceback"
        out["nans"] += o.status == "nan"
        out["same_line_as_in_process"] += o.line == inproc.line
        if not o.passed or o.line != inproc.line:
            out["failures"].append(f"{case.input}: {o.status}: {o.line} (in-process: {inproc.line})")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def write_table(cases, outcomes) -> None:
    text = inv.DOC.read_text(encoding="utf-8")
    inv.DOC.write_text(inv.replace_doc_table(text, inv.render_table(cases, outcomes)), encoding="utf-8")


# ----------------------------------------------------------------------------
# 2-4. Kills, fuzzing, load
# ----------------------------------------------------------------------------

def run_kills(kills: int, seed: int) -> dict:
    from tests import test_reliability_kill as kill

    with tempfile.TemporaryDirectory(prefix="glassllm-kills-") as folder:
        t0 = time.perf_counter()
        stats = kill.kill_campaign(Path(folder), kills, seed, log=log)
        stats["seconds"] = round(time.perf_counter() - t0, 1)
    stats["in_a_write"] = sum(stats["in_write"].values())
    return stats


def run_fuzz(examples: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="glassllm-fuzz-") as folder:
        counts = Path(folder) / "counts.json"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_reliability_fuzz.py"),
                               "-q", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "GLASSLLM_FUZZ_EXAMPLES": str(examples),
                                   "GLASSLLM_FUZZ_COUNTS": str(counts)})
        seconds = round(time.perf_counter() - t0, 1)
        run = json.loads(counts.read_text()) if counts.exists() else {}
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    return {"examples_per_property": examples, "properties": len(run), "examples": sum(run.values()),
            "failures": 0 if proc.returncode == 0 else tail, "pytest": tail, "by_property": run,
            "seconds": seconds}


def run_load(clients: int, seconds: float) -> dict:
    from tests import test_reliability_server as srv

    with tempfile.TemporaryDirectory(prefix="glassllm-load-") as folder:
        path = srv.make_model_file(Path(folder), "bundled")
        stats = srv.load_test(path, clients, seconds)
        stats["model"] = "bundled shape (4 layers, width 128, 1,024 ids), random weights"
        stats["heaviest_requests_ms"] = heaviest_requests(path)
    return stats


def heaviest_requests(path: Path) -> dict:
    """Time the costliest requests the default limits allow, one at a time (in-process)."""
    from glassllm.checkpoint import load_model
    from glassllm.inspector import Inspector, Limits
    from glassllm.inspector.schema import NextRequest, SnapshotRequest

    model, tok, _ = load_model(path)
    limits = Limits()
    words = "once upon a time there was a little dog who liked to run in the park ".split()
    prompt, n = "", 0
    while True:                                              # the longest prompt the limits allow
        longer = prompt + words[n % len(words)] + " "
        if len(tok.encode(longer.strip(), allowed_special="all")) > limits.fit(512).max_prompt_tokens:
            break
        prompt, n = longer, n + 1
    prompt = prompt.strip()
    out = {"prompt_tokens": len(tok.encode(prompt, allowed_special="all"))}
    for label, call in [
        ("snapshot attn.softmax with gradients, longest prompt",
         lambda i: i.snapshot(SnapshotRequest(prompt=prompt, name="attn.softmax", layer=3, head=0, grad=True))),
        (f"next token at step {limits.max_new_tokens}, longest prompt",
         lambda i: i.next_token(NextRequest(prompt=prompt, step=limits.max_new_tokens))),
    ]:
        inspector = Inspector(model, tok, limits)            # a cold cache: the full cost
        t0 = time.perf_counter()
        try:
            call(inspector)
            out[label] = round((time.perf_counter() - t0) * 1000, 1)
        except ValueError as e:                              # greedy decoding ended early, say
            out[label] = f"refused: {e}"
    return out


# ----------------------------------------------------------------------------
# The doc's figures section
# ----------------------------------------------------------------------------

def figures_markdown(r: dict) -> str:
    lines = [f"Measured on {r['machine']} by `python -m tools.reliability_report` (the run's date and "
             f"every figure in full: `bench/results/reliability.json`).", ""]
    e = r["inventory"]["entries"]
    lines += ["**1. Bad inputs.** Cases tried per entry point (bad inputs + accepted odd inputs), "
              "with what went wrong:", "",
              "| entry point | cases | bad inputs | accepted odd inputs | passed | tracebacks | NaNs |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, f in e.items():
        lines.append(f"| {name} | {f['cases']} | {f['bad_inputs']} | {f['accepted_odd_inputs']} | {f['passed']} | "
                     f"{f['tracebacks']} | {f['nans']} |")
    sub = r["inventory"].get("cli_subprocess")
    if sub:
        lines += ["", f"The {sub['cases']} command-line cases again as real `glassllm` processes: "
                      f"{sub['passed']} passed, {sub['tracebacks']} tracebacks, {sub['nans']} NaNs; "
                      f"{sub['same_line_as_in_process']} printed exactly the in-process line."]
    k = r["kills"]
    where = ", ".join(f"{v} in `{n}`" for n, v in sorted(k["in_write"].items(), key=lambda x: -x[1]))
    lines += ["", f"**2. SIGKILLs.** {k['kills']} random SIGKILLs survived over a {k['steps']}-step run "
                  f"({k['starts']} process starts, a checkpoint every step); {k['in_a_write']} landed inside "
                  f"an atomic write ({where or 'none'}). Corrupted checkpoints: {k['corrupted']}. "
                  f"Exact resume: {'yes' if k['exact'] else 'NO'} -- all {k['tensors_compared']} tensors "
                  f"(weights and both AdamW moments), the sampler state and the loss history equal a "
                  f"straight run's, bit for bit."]
    f = r["fuzz"]
    lines += ["", f"**3. Fuzzing.** {f['examples']:,} examples over {f['properties']} properties "
                  f"(up to {f['examples_per_property']:,} each), failures: {f['failures']}.", "",
              "| property | examples |", "|---|---:|"]
    lines += [f"| {name} | {n:,} |" for name, n in f["by_property"].items()]
    ld = r["load"]
    kinds = ", ".join(f"{k} {sum(v.values()):,}" for k, v in ld["by_kind"].items())
    lines += ["", f"**4. Load.** {ld['clients']} concurrent clients for {ld['seconds']:.0f} s against a server "
                  f"process on 127.0.0.1 ({ld['model']}): {ld['requests']:,} requests ({ld['per_second']}/s; "
                  f"{kinds}), **{ld['server_errors']} 5xx**, {ld['unexpected']} unexpected statuses; latency "
                  f"p50 {ld['latency_ms']['p50']} ms, **p95 {ld['latency_ms']['p95']} ms**, "
                  f"p99 {ld['latency_ms']['p99']} ms, max {ld['latency_ms']['max']} ms. Server memory "
                  f"{ld['rss_mb']['start']} MB at the start, {ld['rss_mb']['peak']} MB at the peak, "
                  f"{ld['rss_mb']['end']} MB at the end."]
    h = ld.get("heaviest_requests_ms", {})
    if h:
        parts = [f"{k}: {v} ms" if isinstance(v, float) else f"{k}: {v}" for k, v in h.items()
                 if k != "prompt_tokens"]
        lines += ["", f"The costliest requests the default limits allow (a {h['prompt_tokens']}-token prompt, "
                      f"cold cache, one at a time): " + "; ".join(parts) + "."]
    return "\n".join(lines) + "\n"


def classroom_markdown(r: dict) -> str:
    """The classroom load test's figures (``bench/bench_classroom.py``'s JSON) as the doc shows them."""
    c, env = r["config"], r["environment"]
    load = env.get("load_average_before", [None])[0]
    lines = [f"`{r['command']}` on {env['machine']}, {env['cpu_count']} CPUs"
             + (f" (load average {load:.1f} at the start" + (": the machine was shared)" if load > 1.5 else ")")
                if load is not None else "")
             + f"; JSON: `bench/results/classroom.json`. {c['students']} students for {c['duration_s']:.0f} s, "
             f"{c['bad_students']} of them also sending bad or unauthenticated requests; prompts of "
             f"{c['prompt_tokens']['min']}-{c['prompt_tokens']['max']} tokens; `--cache-mb {c['cache_mb']:g}`.", "",
             "| action | count | p50 ms | p95 ms | max ms |", "|---|---:|---:|---:|---:|"]
    rows = list(r["latency_by_action"].items()) + [(f"request: {k}", v) for k, v in r["latency_by_request"].items()]
    for name, v in rows:
        cells = [f"{v[k]:,.0f}" if v[k] is not None else "-" for k in ("p50_ms", "p95_ms", "max_ms")]
        lines.append(f"| {name} | {v['count']:,} | " + " | ".join(cells) + " |")
    u, m = r["unauthenticated"], r["rss_mb"]
    lines += ["", f"{r['requests']:,} requests ({r['per_second']}/s): **{r['count_503']} answered 503** "
                  f"({100 * r['share_503']:.2f}%), {r['count_429']} answered 429, {r['other_5xx']} other 5xx, "
                  f"{r['transport_errors']} failed connections. Unauthenticated or cross-site requests: "
                  f"{u['sent']} sent, **{len(u['let_in'])} let in**. Server memory: {m['start']} MB at the start, "
                  f"**{m['peak']} MB at the peak**, against a cap of {m['cap']} MB (start + cache + "
                  f"{c['allowance_mb']:g} MB for work in flight"
                  + (f": {c['allowance_mb'] / c['workers']:g} MB for each of {c['workers']} workers)"
                     if isinstance(c["workers"], int) else ")")
                  + (f"; the cache held {m['cache_at_end']} MB at the end." if "cache_at_end" in m else ".")
                  + "".join(f" {count:,} requests were answered 400 with a message for the page ({what})."
                            for what, count in r.get("answered_400", {}).items()), "",
              "| target | met |", "|---|---|"]
    lines += [f"| {name} | {'yes' if ok else '**no**'} |" for name, ok in r["checks"].items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# 5. Hostile inputs
# ----------------------------------------------------------------------------

def run_hostile() -> dict:
    """Run tests/test_reliability_hostile.py; its cases (``CLASSES``) and its tests' outcomes, per class."""
    import xml.etree.ElementTree as ET

    from tests import test_reliability_hostile as hostile

    with tempfile.TemporaryDirectory(prefix="glassllm-hostile-") as folder:
        junit = Path(folder) / "junit.xml"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_reliability_hostile.py"),
                               "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"], cwd=ROOT, capture_output=True,
                              text=True)
        seconds = round(time.perf_counter() - t0, 1)
        cases = ET.parse(junit).getroot().iter("testcase") if junit.exists() else []
        outcomes = [(c.get("name", ""), not any(k.tag in ("failure", "error") for k in c)) for c in cases]
    by_class = {}
    for kind, names in hostile.CLASSES.items():
        tests = [(name, ok) for name, ok in outcomes if hostile.CLASS_OF_TEST.get(name.split("[")[0]) == kind]
        by_class[kind] = {"cases": len(names), "generated": hostile.GENERATED.get(kind, 0), "tests": len(tests),
                          "passed": sum(ok for _, ok in tests),
                          "failed": [name for name, ok in tests if not ok]}
    return {"by_class": by_class, "returncode": proc.returncode, "seconds": seconds,
            "memory_limit_mb": hostile.MEMORY >> 20, "time_limit_s": hostile.SECONDS,
            "pytest": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]}


def hostile_markdown(r: dict) -> str:
    lines = [f"`python -m tools.reliability_report --hostile` (JSON: `bench/results/hostile.json`): each case in a "
             f"subprocess with {r['memory_limit_mb']:,} MB of address space and at most {r['time_limit_s']} s.", "",
             "| class | named cases | generated examples | tests | passed | failed |", "|---|---:|---:|---:|---:|---:|"]
    for kind, f in r["by_class"].items():
        lines.append(f"| {kind} | {f['cases']} | {f['generated']} | {f['tests']} | {f['passed']} | {len(f['failed'])} |")
    total = {k: sum(f[k] if k != "failed" else len(f[k]) for f in r["by_class"].values())
             for k in ("cases", "generated", "tests", "passed", "failed")}
    lines.append(f"| **total** | **{total['cases']}** | **{total['generated']}** | **{total['tests']}** | "
                 f"**{total['passed']}** | **{total['failed']}** |")
    return "\n".join(lines) + "\n"


def write_block(begin: str, end: str, md: str) -> None:
    """Replace what lies between the markers ``begin`` and ``end`` in docs/reliability.md with ``md``."""
    text = inv.DOC.read_text(encoding="utf-8")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    inv.DOC.write_text(f"{head}{begin}\n{md}{end}{tail}", encoding="utf-8")


def write_limits() -> None:
    from glassllm.limits import markdown_table

    write_block(LIMITS_BEGIN, LIMITS_END, markdown_table())


def write_classroom(md: str) -> None:
    text = inv.DOC.read_text(encoding="utf-8")
    head, rest = text.split(CLASSROOM_BEGIN, 1)
    _, tail = rest.split(CLASSROOM_END, 1)
    inv.DOC.write_text(f"{head}{CLASSROOM_BEGIN}\n{md}{CLASSROOM_END}{tail}", encoding="utf-8")


def write_figures(md: str) -> None:
    text = inv.DOC.read_text(encoding="utf-8")
    head, rest = text.split(FIGURES_BEGIN, 1)
    _, tail = rest.split(FIGURES_END, 1)
    inv.DOC.write_text(f"{head}{FIGURES_BEGIN}\n{md}{FIGURES_END}{tail}", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="only regenerate the inventory table in the doc")
    parser.add_argument("--classroom", action="store_true",
                        help="only rewrite the classroom figures from bench/results/classroom.json")
    parser.add_argument("--hostile", action="store_true",
                        help="only run the hostile-input cases and rewrite their figures and the limits table")
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--fuzz-examples", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.classroom:
        write_classroom(classroom_markdown(json.loads(CLASSROOM.read_text(encoding="utf-8"))))
        return 0
    if args.hostile:
        write_limits()
        hostile = run_hostile()
        HOSTILE_RESULTS.write_text(json.dumps(hostile, indent=1) + "\n", encoding="utf-8")
        write_block(HOSTILE_BEGIN, HOSTILE_END, hostile_markdown(hostile))
        print(hostile_markdown(hostile))
        return 0 if hostile["returncode"] == 0 else 1
    if args.table:
        figures, cases, outcomes = run_inventory(subprocesses=False)
        write_table(cases, outcomes)
        print(json.dumps(figures["entries"], indent=1))
        return 0 if all(o.passed for o in outcomes) else 1

    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "load_average_at_start": os.getloadavg()}
    log("1/5 bad inputs ...")
    report["inventory"], cases, outcomes = run_inventory()
    write_table(cases, outcomes)
    log(json.dumps(report["inventory"], indent=1))
    log(f"2/5 {args.kills} SIGKILLs ...")
    report["kills"] = run_kills(args.kills, args.seed)
    log(json.dumps(report["kills"]))
    log(f"3/5 fuzzing, {args.fuzz_examples} examples per property ...")
    report["fuzz"] = run_fuzz(args.fuzz_examples)
    log(json.dumps(report["fuzz"], indent=1))
    log(f"4/5 load: {args.clients} clients x {args.seconds:.0f} s ...")
    report["load"] = run_load(args.clients, args.seconds)
    log("5/5 hostile inputs ...")
    write_limits()
    report["hostile"] = run_hostile()
    HOSTILE_RESULTS.write_text(json.dumps(report["hostile"], indent=1) + "\n", encoding="utf-8")
    write_block(HOSTILE_BEGIN, HOSTILE_END, hostile_markdown(report["hostile"]))
    report["load_average_at_end"] = os.getloadavg()
    RESULTS.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md = figures_markdown(report)
    write_figures(md)
    print(md)
    ok = (all(f["passed"] == f["cases"] for f in report["inventory"]["entries"].values())
          and report["kills"]["corrupted"] == 0 and report["kills"]["exact"] and report["fuzz"]["failures"] == 0
          and report["load"]["server_errors"] == 0 and report["hostile"]["returncode"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
