#!/usr/bin/env python3
# Sorts the failing inputs a fuzz target left (tools/fuzz.sh): each is run again and its report read. A crash,
# hang or out-of-memory whose innermost frame below the sanitizers is inside HDF5 is a known limit of HDF5
# (listed); anything else (a sanitizer error report, a frame of piper's innermost) is a finding and fails.
#   tools/fuzz-triage.py EXE ARTIFACT...
import re
import subprocess
import sys

# frames of the fuzzer, the sanitizers, the allocator and libc/libstdc++ sit above the code that failed
RUNTIME = re.compile(r"__sanitizer|__asan|__ubsan|__interceptor|fuzzer::|\bmalloc\b|\bcalloc\b|\brealloc\b|"
                     r"\boperator new\b|libc\.so|libstdc\+\+\.so|libgcc_s\.so")
KINDS = ("deadly signal", "DEADLYSIGNAL", "SEGV on unknown address", "out-of-memory", "libFuzzer: timeout")


def classify(exe, path):
    try:
        p = subprocess.run([exe, "-timeout=10", "-rss_limit_mb=2048", path], capture_output=True, text=True,
                           errors="replace", timeout=120)
        report = p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return "finding", f"{path}: no report within 120 s"
    kind = next((k for k in KINDS if k in report), None)
    frames = [l.strip() for l in report.splitlines() if re.match(r"\s+#\d+ 0x", l)]
    inner = next((f for f in frames if not RUNTIME.search(f)), "")
    # an ASan error report (overflow, use-after-free...) is a finding wherever it happened
    asan_error = re.search(r"ERROR: AddressSanitizer: (?!SEGV|out of memory|allocator is out of memory)", report)
    if kind and not asan_error and "libhdf5" in inner:
        return "known", f"{path}: {kind} inside HDF5 at {inner}"
    return "finding", f"{path}:\n" + "\n".join(report.splitlines()[-40:])


def main():
    exe, paths = sys.argv[1], sys.argv[2:]
    findings = 0
    for path in paths:
        verdict, text = classify(exe, path)
        print(f"fuzz: {'known HDF5 limit' if verdict == 'known' else 'FINDING'}: {text}", file=sys.stderr)
        findings += verdict == "finding"
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
