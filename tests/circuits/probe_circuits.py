"""A probe of the circuits floor under hostile inputs (issue 40): about 450 cases, each run in a worker process
that a watcher measures, and a table of outcomes by class.

    OMP_NUM_THREADS=1 python tests/circuits/probe_circuits.py              # every case, the table at the end
    python tests/circuits/probe_circuits.py --only graph-files --show 5    # one class, five cases shown each way

Classes (probe_cases_files.py, probe_cases_calls.py): transcoder files (configs, layer files, npz, Gemma Scope 2,
names on the Hub, offline), graph files, pair files, Python arguments, command-line arguments, and graphs built
from four threads sharing one lazily read set (bitwise equal to one built alone).

Every case must be refused: a ValueError (CheckpointError is one) of one line from Python, or one line on
stderr with exit status 2 from the command line, within REFUSAL_SECONDS. Anything else is counted:

    silent accept   it returned (exit 0), where a refusal was due
    foreign         another exception type, "internal error", a traceback, exit status 1
    hang            no answer within HANG_SECONDS (the worker is killed and started again)
    blow-up         the worker's memory grew by more than BLOWUP_BYTES during the case (killed, started again)
    code execution  a payload's marker file appeared (a YAML tag, a pickle in an npz)
    multi-line      refused, but in more than one line (or a message over 1,000 characters)
    slow            refused, but after REFUSAL_SECONDS

A few cases are properties instead ("held" when they hold, "wrong" when not): graphs built by four threads
sharing one set equal a graph built alone, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).parent
HANG_SECONDS, REFUSAL_SECONDS, BLOWUP_BYTES = 30.0, 2.0, 1 << 30
OUTCOMES = ("refused", "held", "silent accept", "foreign", "hang", "blow-up", "code execution", "multi-line", "slow",
            "wrong")


# ---- the worker: runs one case at a time, told by index on stdin -----------------------------------------------
def worker() -> None:
    import contextlib
    import io
    import resource
    import tempfile

    sys.path[:0] = [str(HERE), str(HERE.parent)]
    from probe_cases_calls import call_cases
    from probe_cases_files import file_cases

    from anatomy.cli import main

    cases = file_cases() + call_cases()
    print(json.dumps({"ready": len(cases)}), flush=True)
    for line in sys.stdin:
        index = int(line)
        case = cases[index]
        with tempfile.TemporaryDirectory() as folder:
            tmp = Path(folder)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            start = time.perf_counter()
            result = {"outcome": "", "message": ""}
            try:
                made = case.run(tmp)  # the files made, then the call timed: a callable, or argv
                start = time.perf_counter()
                if not case.cli:
                    made()
                if case.cli:
                    err = io.StringIO()
                    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                        try:
                            code = main(made)
                        except SystemExit as stop:
                            code = stop.code
                    result.update(code=code, message=err.getvalue())
                else:
                    result.update(outcome="accepted")
            except ValueError as error:
                result.update(outcome="value error", message=str(error))
            except BaseException as error:  # noqa: BLE001 - what the probe counts
                if isinstance(error, KeyboardInterrupt):
                    raise
                result.update(outcome="foreign", message=f"{type(error).__name__}: {str(error)[:300]}")
            result["seconds"] = time.perf_counter() - start
            result["grew"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
            result["executed"] = (tmp / "pwned").exists()
        print(json.dumps(result), flush=True)


def classify(case, result: dict) -> str:
    """The outcome (OUTCOMES) of one case's result."""
    if result.get("executed"):
        return "code execution"
    message = result.get("message", "")
    if case["cli"]:
        code = result.get("code")
        if result.get("outcome") == "foreign":
            return "foreign"
        if code == 0:
            return "silent accept"
        if code != 2 or "internal error" in message or "Traceback" in message:
            return "foreign"
        lines = message.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("anatomy"):
            return "multi-line"
    elif case["expect"] == "held":  # a property: it returns when it holds
        return "held" if result["outcome"] == "accepted" else "wrong"
    else:
        if result["outcome"] == "accepted":
            return "silent accept"
        if result["outcome"] == "foreign":
            return "foreign"
        if "\n" in message.strip() or len(message) > 1000:
            return "multi-line"
    if result.get("grew", 0) > BLOWUP_BYTES:
        return "blow-up"
    return "slow" if result["seconds"] > REFUSAL_SECONDS else "refused"


# ---- the watcher: starts the worker, feeds it cases, watches its memory and its time ----------------------------
class Watched:
    def __init__(self):
        self.process = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        self.count = json.loads(self.process.stdout.readline())["ready"]

    def rss(self) -> int:
        try:
            for line in open(f"/proc/{self.process.pid}/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def run(self, index: int) -> dict:
        import select

        baseline, peak = self.rss(), 0
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        start = time.perf_counter()
        while True:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.02)
            if ready:
                line = self.process.stdout.readline()
                if not line:
                    return {"outcome": "foreign", "message": "the worker died", "seconds": time.perf_counter() - start}
                result = json.loads(line)
                result["grew"] = max(result.get("grew", 0), peak - baseline)
                return result
            peak = max(peak, self.rss())
            if peak - baseline > BLOWUP_BYTES:
                self.kill()
                return {"outcome": "blow-up", "message": f"grew by {(peak - baseline) / 2**30:.1f} GiB", "seconds": 0}
            if time.perf_counter() - start > HANG_SECONDS:
                self.kill()
                return {"outcome": "hang", "message": f"no answer in {HANG_SECONDS:.0f} s", "seconds": HANG_SECONDS}

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def describe_cases() -> list[dict]:
    """[{name, group, cli, expect}] of every case, from a worker-free import of the case lists."""
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    from probe_cases_calls import call_cases
    from probe_cases_files import file_cases

    return [{"name": c.name, "group": c.group, "cli": c.cli, "expect": c.expect} for c in file_cases() + call_cases()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", help="run only the cases of this class")
    parser.add_argument("--show", type=int, default=3, help="cases shown for each outcome that is not a refusal")
    parser.add_argument("--json", help="write every case's outcome to this file")
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    cases = describe_cases()
    watched = Watched()
    outcomes, shown, slowest = defaultdict(Counter), defaultdict(list), 0.0
    records = []
    for index, case in enumerate(cases):
        if args.only and case["group"] != args.only:
            continue
        result = watched.run(index)
        if result["outcome"] in ("hang", "blow-up"):
            outcome = result["outcome"]
            watched = Watched()
        else:
            outcome = classify(case, result)
        if outcome == "refused":
            slowest = max(slowest, result["seconds"])
        outcomes[case["group"]][outcome] += 1
        shown[outcome].append(f"{case['group']}: {case['name'][:60]}: {result.get('message', '')[:160]!r}")
        records.append({**case, "outcome": outcome, "seconds": round(result["seconds"], 3),
                        "message": result.get("message", "")[:500]})
        print(f"{outcome:>14}  {result['seconds']:6.2f} s  {case['group']}: {case['name'][:60]}", file=sys.stderr, flush=True)
    watched.kill()
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    print(table(outcomes))
    print(f"\nslowest refusal: {slowest:.2f} s")
    for outcome, lines in shown.items():
        if outcome not in ("refused", "held"):
            print(f"\n{outcome}:\n  " + "\n  ".join(lines[:args.show]))
    return 0 if all(not n for counts in outcomes.values() for o, n in counts.items() if o not in ("refused", "held")) else 1


def table(outcomes: dict) -> str:
    lines = ["| class | cases | " + " | ".join(OUTCOMES) + " |", "|---|---:|" + "---:|" * len(OUTCOMES)]
    total = Counter()
    for group, counts in outcomes.items():
        total.update(counts)
        lines.append(f"| {group} | {sum(counts.values())} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    lines.append(f"| all | {sum(total.values())} | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
