#!/usr/bin/env python3
# Sorts the failing inputs a fuzz target left (tools/fuzz.sh): each is run again and its report read. A failure
# of HDF5 itself on a damaged file is a known limit (listed); anything else is a finding and fails. See
# fuzz/README.md, "Known limits".   tools/fuzz-triage.py EXE ARTIFACT...
#
# Known, when the innermost frame below the sanitizer runtime is inside HDF5 and:
#  - a crash (deadly signal), hang (timeout) or out-of-memory;
#  - a leak (every leaked block allocated inside HDF5: its error paths do not free everything);
#  - an ASan error report whose memory HDF5 allocated or freed (the innermost frame of the "allocated by" and
#    "freed by" stacks is inside HDF5): HDF5 reading a damaged file past its own buffers. A buffer of piper's
#    (allocated by piper's code) that HDF5 overruns is a finding.
# HDF5 misbehaving on a damaged file depends on the heap it finds, so the same input may fail another way, or
# not at all, in a fresh process: an input is run up to three times until it reports, a timeout that does not
# recur is run once more with a short timeout to see where its time goes, and an input that fails in no fresh
# process is listed as not reproduced (a fresh process accepts it), not as a finding. The limits are the
# fuzzing run's (tools/fuzz.sh).
import re
import subprocess
import sys

FRAME = re.compile(r"^\s+#\d+ 0x")
# frames of the fuzzer, the sanitizers, the allocator and libc/libstdc++ sit above the code that failed (libc's
# string functions show as their source files under sysdeps/ where they are symbolized)
RUNTIME = re.compile(r"__sanitizer|__asan|__lsan|__ubsan|__interceptor|fuzzer::|\bmalloc\b|\bcalloc\b|\brealloc\b|"
                     r"\bfree\b|\boperator new\b|\boperator delete\b|libc\.so|libstdc\+\+\.so|libgcc_s\.so|"
                     r"\bsysdeps/|\b__(mem|str)\w+_(avx|sse|evex|erms)\w*")


def stacks(lines):
    """[(heading line, [frames])] for every stack trace in the report."""
    out, heading, cur = [], "", []
    for line in lines:
        if FRAME.match(line):
            cur.append(line.strip())
            continue
        if cur:
            out.append((heading, cur))
            cur = []
        if line.strip():
            heading = line.strip()
    if cur:
        out.append((heading, cur))
    return out


def innermost(frames):
    return next((f for f in frames if not RUNTIME.search(f)), "")


LIMITS = ["-rss_limit_mb=2048", "-malloc_limit_mb=1024"]


def rerun(exe, path, timeout_s):
    """The report of one fresh run, or None when the input passes; raises TimeoutError past 120 s."""
    try:
        p = subprocess.run([exe, f"-timeout={timeout_s}", *LIMITS, path], capture_output=True, text=True,
                           errors="replace", timeout=120)
    except subprocess.TimeoutExpired:
        raise TimeoutError
    report = p.stdout + p.stderr
    return report if p.returncode != 0 else None


def classify(exe, path):
    report = None
    try:
        for _ in range(3):
            report = rerun(exe, path, 10)
            if report is not None:
                break
        if report is None and "timeout-" in path:
            report = rerun(exe, path, 1)  # where a slow input spends its time
    except TimeoutError:
        return False, "no report within 120 s"
    if report is None:
        return "not reproduced", "three fresh runs accept it"
    all_stacks = stacks(report.splitlines())
    if not all_stacks:
        return False, "no stack in the report:\n" + "\n".join(report.splitlines()[-20:])
    inner = innermost(all_stacks[0][1])
    tail = "\n".join(report.splitlines()[-40:])
    if "libhdf5" not in inner:
        return False, tail
    if "LeakSanitizer: detected memory leaks" in report:
        leaks = [f for h, f in all_stacks if "leak of" in h]
        if leaks and all("libhdf5" in innermost(f) for f in leaks):
            return True, f"leak inside HDF5 at {inner}"
        return False, tail
    m = re.search(r"ERROR: AddressSanitizer: ([\w-]+)", report)
    if m and m.group(1) not in ("SEGV", "BUS", "FPE", "ILL", "stack-overflow", "allocator", "out"):
        for heading, frames in all_stacks[1:]:
            if ("allocated by" in heading or "freed by" in heading) and "libhdf5" not in innermost(frames):
                return False, tail  # memory of piper's, overrun by HDF5 or by piper
        return True, f"{m.group(1)} inside HDF5, on memory HDF5 allocated, at {inner}"
    for kind in ("deadly signal", "DEADLYSIGNAL", "out-of-memory", "libFuzzer: timeout"):
        if kind in report:
            return True, f"{kind} inside HDF5 at {inner}"
    return False, tail


def main():
    exe, paths = sys.argv[1], sys.argv[2:]
    findings = 0
    for path in paths:
        verdict, text = classify(exe, path)
        if verdict is True:
            verdict = "known HDF5 limit"
        elif verdict is False:
            verdict = "FINDING"
        print(f"fuzz: {verdict}: {path}: {text}", file=sys.stderr)
        findings += verdict == "FINDING"
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
