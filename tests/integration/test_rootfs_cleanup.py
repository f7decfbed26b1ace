"""tools/rootfs-lib.sh on stand-in chroot roots: it ends what runs in a root, unmounts what is mounted below it,
deletes it only when nothing is mounted there any more (refuses otherwise), and picks the configured mirror.

Needs root and mount --bind (skipped otherwise). The real /dev is never bound: a scratch folder with a sentinel
file stands in for it. Runs in a private mount namespace when unshare can make one, so that nothing mounted
here outlives the test.
"""
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

from common import ROOT, fail

LIB = os.path.join(ROOT, "tools", "rootfs-lib.sh")


def unescape(field):
    """A /proc/mounts field: a space is written \\040, a tab \\011, a backslash \\134."""
    out, i = "", 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out += chr(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out += field[i]
            i += 1
    return out


def mounts_below(path):
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        points = [unescape(line.split()[1]) for line in f]
    return [m for m in points if m == path or m.startswith(path + "/")]


def mount(*args):
    p = subprocess.run(["mount", *args], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"mount {' '.join(args)}: {p.stderr.strip()}")


def lib(script, *args, **env):
    """Runs bash with the library sourced (set -euo pipefail, as its callers have it)."""
    e = dict(os.environ, **env)
    t0 = time.time()
    p = subprocess.run(["bash", "-c", 'set -euo pipefail; . "$0"; ' + script, LIB, *args], capture_output=True,
                       text=True, env=e, timeout=60)
    return p, time.time() - t0


def make_root(path):
    for d in ("bin", "etc", "dev", "proc", "opt/cuda", "var/log"):
        os.makedirs(os.path.join(path, d))
    for f in ("etc/hostname", "bin/tool", "var/log/build.log"):
        with open(os.path.join(path, f), "w") as out:
            out.write(f + "\n")


def standin(path, files):
    os.makedirs(path)
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(path, f)), exist_ok=True)
        with open(os.path.join(path, f), "w") as out:
            out.write("keep me\n")


def check_standin(path, files, what):
    for f in files:
        p = os.path.join(path, f)
        if not os.path.isfile(p) or open(p).read() != "keep me\n":
            fail(f"{what}: {p} was deleted or changed")


def check_dev_null():
    st = os.stat("/dev/null")
    if not stat.S_ISCHR(st.st_mode):
        fail("/dev/null is no longer a character device")


def ended(proc, sig, what):
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        fail(f"{what} (pid {proc.pid}) is still running")
    if proc.returncode != -sig:
        fail(f"{what} ended with {proc.returncode}, not by signal {sig}")


def case_release_and_remove(tmp, procs):
    """Processes in the root (working directory in a bind mount, chroot into it, one that ignores SIGTERM),
    nested, stacked and read-only mounts, a space in the path: all ended and unmounted, then deleted."""
    dev = os.path.join(tmp, "standin-dev")
    cuda = os.path.join(tmp, "standin-cuda")
    dev_files, cuda_files = ["sentinel", "pts/keep"], ["lib64/libcudart.so"]
    standin(dev, dev_files)
    standin(cuda, cuda_files)
    root = os.path.join(tmp, "case 1", "root fs")
    make_root(root)
    mount("--bind", dev, os.path.join(root, "dev"))
    mount("-t", "tmpfs", "tmpfs", os.path.join(root, "dev", "pts"))        # below the bind: goes first
    mount("-t", "tmpfs", "tmpfs", os.path.join(root, "proc"))
    mount("-t", "tmpfs", "tmpfs", os.path.join(root, "proc"))              # stacked on the first
    mount("--bind", "-o", "ro", cuda, os.path.join(root, "opt", "cuda"))
    if len(mounts_below(root)) != 5:
        fail(f"expected 5 mounts below {root}: {mounts_below(root)}")

    in_bind = subprocess.Popen(["sleep", "60"], cwd=os.path.join(root, "dev"))
    chrooted = subprocess.Popen([sys.executable, "-c", "import os, sys, time\nos.chroot(sys.argv[1]); os.chdir('/')\n"
                                 "print('ready', flush=True); time.sleep(60)", root], stdout=subprocess.PIPE, text=True)
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; exec sleep 60"], cwd=os.path.join(root, "opt", "cuda"))
    procs += [in_bind, chrooted, stubborn]
    if chrooted.stdout.readline().strip() != "ready":
        fail("the chrooted process did not start")
    time.sleep(0.2)
    if os.readlink(f"/proc/{chrooted.pid}/root") != os.path.realpath(root):
        fail("the chrooted process's root is not the stand-in root")

    # No lazy unmount: every mount must come off for real, which needs the processes gone first.
    p, secs = lib('rootfs_release "$1" && rootfs_remove "$1"', root, ROOTFS_NO_LAZY="1", ROOTFS_TERM_WAIT="1")
    print(p.stderr.rstrip())
    if p.returncode != 0:
        fail(f"release and remove failed ({p.returncode}):\n{p.stderr}")
    ended(in_bind, signal.SIGTERM, "the process working in the bound /dev")
    ended(chrooted, signal.SIGTERM, "the chrooted process")
    ended(stubborn, signal.SIGKILL, "the process that ignores SIGTERM")
    if mounts_below(tmp):
        fail(f"still mounted after release: {mounts_below(tmp)}")
    if os.path.lexists(root):
        fail(f"{root} is still there")
    check_standin(dev, dev_files, "the /dev stand-in")
    check_standin(cuda, cuda_files, "the CUDA stand-in")
    check_dev_null()
    print(f"ok  release: 3 processes ended (TERM, TERM, KILL), 5 mounts off, root deleted, stand-ins intact "
          f"({secs:.1f} s)")


def case_refuse(tmp, procs):
    """A mount that stays busy (a file held open in it: not a process the library ends) and no lazy unmount:
    nothing is deleted and the mount is named; with lazy unmount it comes off and the root goes."""
    dev = os.path.join(tmp, "standin-dev-2")
    standin(dev, ["sentinel"])
    root = os.path.join(tmp, "case2", "rootfs")
    make_root(root)
    bound = os.path.join(root, "dev")
    mount("--bind", dev, bound)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1])\n"
                               "print('ready', flush=True); time.sleep(60)", os.path.join(bound, "sentinel")],
                              cwd="/", stdout=subprocess.PIPE, text=True)
    procs.append(holder)
    if holder.stdout.readline().strip() != "ready":
        fail("the process holding the mount did not start")

    def intact(what):
        if mounts_below(root) != [os.path.realpath(bound)]:
            fail(f"{what}: mounts below the root are {mounts_below(root)}")
        for f in ("etc/hostname", "bin/tool", "var/log/build.log"):
            if not os.path.isfile(os.path.join(root, f)):
                fail(f"{what}: {f} was deleted although a mount was left")
        check_standin(dev, ["sentinel"], what)
        check_dev_null()

    # remove alone (as make clean runs it): refuses at once, names the mount.
    p = subprocess.run(["bash", LIB, "remove", root], capture_output=True, text=True, timeout=60)
    if p.returncode == 0 or bound not in p.stderr or "refusing" not in p.stderr:
        fail(f"remove with a mount below: exit {p.returncode}, stderr:\n{p.stderr}")
    intact("remove with a mount below")
    print("ok  remove with a mount below: exit", p.returncode, "|", p.stderr.strip().replace("\n", " "))

    # release cannot unmount it (busy, no lazy fallback): fails, names it, and remove is never reached.
    p, _ = lib('rootfs_release "$1" && rootfs_remove "$1"', root, ROOTFS_NO_LAZY="1", ROOTFS_TERM_WAIT="1")
    if p.returncode == 0 or bound not in p.stderr or "still mounted" not in p.stderr:
        fail(f"release of a busy mount without lazy unmount: exit {p.returncode}, stderr:\n{p.stderr}")
    if holder.poll() is not None:
        fail("the process holding a file open outside the root's processes was ended")
    intact("release of a busy mount")
    print("ok  release of a busy mount (no lazy unmount): exit", p.returncode, "|",
          p.stderr.strip().replace("\n", " "))

    # The default falls back to umount -l: the mount leaves the tree (the open file keeps it alive, detached).
    p, secs = lib('rootfs_release "$1" && rootfs_remove "$1"', root, ROOTFS_TERM_WAIT="1")
    if p.returncode != 0:
        fail(f"release with lazy unmount failed ({p.returncode}):\n{p.stderr}")
    if mounts_below(tmp) or os.path.lexists(root):
        fail(f"after lazy release: mounts {mounts_below(tmp)}, root there: {os.path.lexists(root)}")
    check_standin(dev, ["sentinel"], "lazy release")
    check_dev_null()
    holder.kill()
    holder.wait()
    print(f"ok  release with lazy unmount of the busy mount: root deleted, sentinel intact ({secs:.1f} s)")


def case_mirror(tmp):
    """rootfs_mirror: the first enabled deb source for bookworm main, in apt's order, that is Debian's."""
    etc, lists, empty = (os.path.join(tmp, d) for d in ("apt", "lists", "empty"))
    for d in (os.path.join(etc, "sources.list.d"), lists, empty):
        os.makedirs(d)
    files = {
        "sources.list": "# deb http://commented.example/debian bookworm main\n"
                        "deb [arch=amd64 signed-by=/k.gpg] https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
                        "deb-src http://src.example/debian bookworm main\n"
                        "deb http://contrib.example/debian bookworm contrib\n",
        "sources.list.d/a-off.sources": "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\n"
                                        "Components: main\nEnabled: no\n",
        "sources.list.d/b-other.list": "deb http://thirdparty.example/apt bookworm main\n",
        "sources.list.d/c-debian.sources": "# a comment\nTypes: deb deb-src\nURIs: http://mirror.example/debian/\n"
                                           "  http://second.example/debian\nSuites: bookworm-updates bookworm\n"
                                           "Components: main contrib\nSigned-By: /k.gpg\n\n"
                                           "Types: deb\nURIs: http://later.example/debian\nSuites: bookworm\n"
                                           "Components: main\n",
        "sources.list.d/d-off.list.disabled": "deb http://ignored.example/debian bookworm main\n",
    }
    for name, text in files.items():
        with open(os.path.join(etc, name), "w") as f:
            f.write(text)
    # apt's copy of the third-party source's Release file says it is not Debian's archive.
    with open(os.path.join(lists, "thirdparty.example_apt_dists_bookworm_InRelease"), "w") as f:
        f.write("Origin: Example\nSuite: bookworm\n")
    for apt_etc, want in ((etc, "http://mirror.example/debian"), (empty, "http://deb.debian.org/debian")):
        p, _ = lib("rootfs_mirror bookworm", ROOTFS_APT_ETC=apt_etc, ROOTFS_APT_LISTS=lists)
        if p.returncode != 0 or p.stdout.strip() != want:
            fail(f"rootfs_mirror with {apt_etc}: {p.stdout.strip()!r} (exit {p.returncode}), expected {want!r}")
    p, _ = lib("rootfs_mirror bookworm")
    print(f"ok  mirror: the configured Debian source, deb.debian.org without one (this machine: {p.stdout.strip()})")


def main():
    if os.geteuid() != 0:
        print("skipped: needs root and mount")
        return
    if os.environ.get("ROOTFS_TEST_PRIVATE_NS") != "1":
        try:
            ok = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                                capture_output=True).returncode == 0
        except FileNotFoundError:
            ok = False
        if ok:
            os.environ["ROOTFS_TEST_PRIVATE_NS"] = "1"
            sys.stdout.flush()
            os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv])
        print("note: no private mount namespace (unshare failed); mounting in this one")
    t0 = time.time()
    tmp = os.path.realpath(tempfile.mkdtemp(prefix="piper-rootfs-"))
    procs = []
    try:
        probe = os.path.join(tmp, "probe")
        os.makedirs(os.path.join(probe, "src"))
        os.makedirs(os.path.join(probe, "dst"))
        p = subprocess.run(["mount", "--bind", os.path.join(probe, "src"), os.path.join(probe, "dst")],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(f"skipped: needs root and mount ({p.stderr.strip()})")
            return
        subprocess.run(["umount", os.path.join(probe, "dst")], check=True)
        case_release_and_remove(tmp, procs)
        case_refuse(tmp, procs)
        case_mirror(tmp)
        check_dev_null()
        print(f"rootfs cleanup: all checks passed ({time.time() - t0:.1f} s)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for m in sorted(mounts_below(tmp), key=len, reverse=True):
            subprocess.run(["umount", "-l", m])
        left = mounts_below(tmp)
        if left:
            print(f"FAIL: still mounted, {tmp} is left as it is: {left}", file=sys.stderr)
            sys.exit(1)
        subprocess.run(["rm", "-rf", "--one-file-system", tmp])


if __name__ == "__main__":
    main()
