"""Helpers for the client compatibility tests (tests/mounted/test_<client>.py).

Each client test runs a real program twice in the same test: on the dboxfs
mount and, as the reference, on a native maildir, then compares what the
two runs left behind.  The helpers here read maildir trees into comparable
values and run programs that need a terminal.
"""
import hashlib
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

# Directories that never hold messages: client databases and caches.
SKIP_DIRS = {".notmuch", "hcache"}


def digest(data):
    return hashlib.sha256(data).hexdigest()[:16]


def read_bytes(path):
    with open(path, "rb") as fp:
        return fp.read()


def split_name(name):
    """maildir name -> (unique part, flags); flags '' when there is no ':2,'."""
    base, sep, flags = name.partition(":2,")
    return base, flags if sep else ""


def message_paths(root):
    """Relative paths of every message (a non-dot file in a cur/ or new/)
    below root, Maildir++ and nested folders included."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        if os.path.basename(dirpath) not in ("cur", "new"):
            continue
        for f in files:
            if not f.startswith("."):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def messages(root):
    """{relative path: bytes} of every message below root."""
    return {p: read_bytes(os.path.join(root, p)) for p in message_paths(root)}


def names(root):
    """Sorted relative paths of the messages: names and flags, as a
    client sees them."""
    return message_paths(root)


def folder_of(relpath):
    """'a/b/cur/x:2,S' -> ('a/b', 'cur')."""
    parts = relpath.split(os.sep)
    return os.sep.join(parts[:-2]), parts[-2]


def content_view(root, unique=None):
    """A Counter of (folder, cur|new, unique part, flags, sha256) per message.

    unique(name) maps a message's unique part to what must match between two
    runs (default: the unique part itself); use it where a client puts its
    pid or the time in new names."""
    out = Counter()
    for rel, data in messages(root).items():
        folder, sub = folder_of(rel)
        base, flags = split_name(os.path.basename(rel))
        out[(folder, sub, unique(base) if unique else base, flags,
             digest(data))] += 1
    return out


def tree(root, skip=()):
    """{relative path: (bytes, mtime_ns)} of every regular file below root
    (skip: top-level names to leave out)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        if dirpath == str(root):
            dirs[:] = [d for d in dirs if d not in skip]
            files = [f for f in files if f not in skip]
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (read_bytes(p), st.st_mtime_ns)
    return out


def copy_corpus(src, dest):
    """cp -a a corpus folder (read-only in /work/shared) to dest, writable,
    with cur/ new/ tmp/ present.  Returns dest."""
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    subprocess.run(["chmod", "-R", "u+w", str(dest)], check=True)
    for sub in ("cur", "new", "tmp"):
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
    return Path(dest)


def run_in_terminal(cmd, timeout=120, env=None):
    """Run the shell command cmd under script(1), which gives it a
    pseudo-terminal (NeoMutt and mutt refuse to run without one).
    Returns the CompletedProcess; fails the test on a non-zero exit."""
    full_env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    full_env.update(env or {})
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], env=full_env,
                       capture_output=True, timeout=timeout)
    assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    return r


def need(*programs):
    """Skip the test when a program is not installed (make check installs
    them all: TEST_DEBS in the Makefile)."""
    import pytest

    for p in programs:
        if shutil.which(p) is None and not os.path.exists(p):
            pytest.skip(f"{p} not installed")


def strip_pid_time(base, pattern=re.compile(r"^\d+\.[^.]*\.")):
    """Drop '<time>.<pid/random>.' from a generated unique name: what is
    left (host, ,U=, ,S=...) is stable between two runs."""
    return pattern.sub("", base)


SYSCALL = re.compile(r"^(?:\[pid\s+)?(\d+)\]?\s*(\w+)\((.*)\)\s+=\s+(-?\d+)(?:\s+(\w+))?")


def run_traced(cmd, log, syscalls, **kwargs):
    """Run cmd (a list) under strace -f, tracing the named syscalls.
    Returns (CompletedProcess, [(syscall, args, result, errno name)])."""
    r = subprocess.run(strace_prefix(log, syscalls) + list(cmd), **kwargs)
    return r, parse_strace(log)


def strace_prefix(log, syscalls):
    """The strace command line that runs a command with the named syscalls
    traced into log (follows forks, full strings)."""
    return ["strace", "-f", "-qq", "-s", "4096", "-o", str(log), "-e",
            "trace=" + ",".join(syscalls)]


def parse_strace(log):
    """[(syscall, args, result, errno name)] from an strace -f log."""
    calls, pending = [], {}
    with open(log) as fp:
        for line in fp:
            # With -f, a call interrupted by another process's is split:
            # "PID call(args <unfinished ...>" ... "PID <... call resumed>rest".
            pid = line.split(None, 1)[0]
            if line.rstrip().endswith("<unfinished ...>"):
                pending[pid] = line.rstrip()[:-len("<unfinished ...>")].rstrip()
                continue
            m = re.match(r"^\d+\s+<\.\.\. \w+ resumed>(.*)", line)
            if m and pid in pending:
                line = pending.pop(pid) + m.group(1)
            m = SYSCALL.match(line)
            if m:
                calls.append((m.group(2), m.group(3), int(m.group(4)),
                              m.group(5) or ""))
    return calls


def corpus_messages(corpus_dir, n):
    """The first n messages (bytes) of a corpus cur/ in name order."""
    cur = Path(corpus_dir) / "cur"
    return [(cur / name).read_bytes() for name in sorted(os.listdir(cur))[:n]]
