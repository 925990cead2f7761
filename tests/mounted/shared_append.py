"""Processes sharing one file, as Dovecot's imap processes share
dovecot.index.log: each takes an fcntl write lock, fstat()s, mmap()s the
file read-only and touches its last byte, pread()s the whole file, appends
one 51-byte line at the size fstat gave, and unlocks - `rounds` times.

run(path, ...) forks the processes and returns what they saw, as a dict
that compares equal between two filesystems that behave alike:
    {"signals": [...], "short": [...], "lines": {tag: count}, "size": N,
     "torn": n}
- signals: the signals that killed a process (SIGBUS from the mmap),
- short:   the first pread per process that returned other than fstat's
           size (or whose bytes differ from the mapping's), as
           (tag, "pread N != fstat M"); the process stops there,
- lines:   the complete lines per process in the final file,
- torn:    lines that are not one process's 51-byte line.

The processes take turns: one appends only after another's line (the
first round of the first process excepted), so every round reads what
another process appended just before - the case that must not be cut
short.  A process that finds its own line last unlocks and tries again.

mmap goes through libc (ctypes), not Python's mmap module: that module
keeps a dup() of the descriptor and closes it at close(), and closing any
descriptor of a file drops the process's fcntl locks on it.
"""
import ctypes
import fcntl
import os
import signal

LINE = 51
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_READ, _MAP_SHARED = 1, 1
_MAP_FAILED = ctypes.c_void_p(-1).value


def _lock(fd, kind):
    fcntl.lockf(fd, kind, 0, 0, os.SEEK_SET)


def _worker(path, rounds, tag, mode, report_fd, go_fd):
    """One process.  mode: "keep" (one O_RDWR descriptor for everything),
    "reopen" (open and close around every round: close drops the lock
    too), "split" (an O_RDONLY descriptor for fstat/mmap/pread, the
    O_RDWR|O_APPEND one for lock and write(), the mapping kept and grown
    as Dovecot keeps its log's)."""
    line = (tag * (LINE - 1)).encode() + b"\n"
    fd = ro = -1
    mapping, maplen = None, 0
    problem = ""
    os.read(go_fd, 1)  # all start together
    i = 0
    while i < rounds:
        if fd < 0:
            flags = os.O_RDWR | (os.O_APPEND if mode == "split" else 0)
            fd = os.open(path, flags)
            ro = os.open(path, os.O_RDONLY) if mode == "split" else fd
        _lock(fd, fcntl.LOCK_EX)
        size = os.fstat(ro).st_size
        if mode != "split" or size > maplen:
            if mapping:
                _libc.munmap(mapping, maplen)
                mapping = None
            if size:
                mapping = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, ro, 0)
                assert mapping not in (None, _MAP_FAILED), ctypes.get_errno()
            maplen = size
        if size:
            ctypes.c_char.from_address(mapping + size - 1).value  # SIGBUS?
        data = os.pread(ro, size + 65536, 0)
        if len(data) != size:
            problem = f"round {i}: pread {len(data)} != fstat {size}"
            break
        if size and ctypes.string_at(mapping, size) != data:
            problem = f"round {i}: mapping differs from pread"
            break
        mine = data[-LINE:] == line if size else tag != "A"
        if not mine:
            if mode == "split":
                os.write(fd, line)
            else:
                os.pwrite(fd, line, size)
            i += 1
        _lock(fd, fcntl.LOCK_UN)
        if mine:
            os.sched_yield()
        if mode == "reopen":
            if mapping:
                _libc.munmap(mapping, maplen)
                mapping, maplen = None, 0
            os.close(fd)
            fd = ro = -1
    os.write(report_fd, problem.encode())
    os._exit(0)


def run(path, procs=2, rounds=500, mode="keep"):
    """Run the workers on path (which must exist) and return the dict
    described above."""
    tags = "ABCDEFGH"[:procs]
    children = []
    go_r, go_w = os.pipe()
    for tag in tags:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(go_w)
            try:
                _worker(str(path), rounds, tag, mode, w, go_r)
            finally:
                os._exit(1)
        os.close(w)
        children.append((tag, pid, r))
    os.close(go_r)
    os.close(go_w)  # EOF: go
    result = {"signals": [], "short": [], "exit": []}
    for tag, pid, r in children:
        with os.fdopen(r, "rb") as f:
            problem = f.read().decode()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            result["signals"].append((tag, signal.Signals(os.WTERMSIG(status)).name))
        elif os.WEXITSTATUS(status) != 0:
            result["exit"].append((tag, os.WEXITSTATUS(status)))
        if problem:
            result["short"].append((tag, problem))
    data = open(path, "rb").read()
    result["size"] = len(data)
    lines = [data[i:i + LINE] for i in range(0, len(data), LINE)]
    good = {tag: (tag * (LINE - 1)).encode() + b"\n" for tag in tags}
    result["lines"] = {tag: sum(1 for ln in lines if ln == good[tag]) for tag in tags}
    result["torn"] = sum(1 for ln in lines if ln not in good.values())
    return result


def _lockless_reader(path, report_fd, stop_fd):
    """Until stop_fd has EOF: fstat, map that size and touch its last
    byte, pread the file's tail; report the first pread that ends before
    fstat's size."""
    fd = os.open(path, os.O_RDONLY)
    problem, rounds = "", 0
    os.set_blocking(stop_fd, False)
    while True:
        try:
            if os.read(stop_fd, 1) == b"":
                break
        except BlockingIOError:
            pass
        size = os.fstat(fd).st_size
        if size:
            mapping = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
            assert mapping not in (None, _MAP_FAILED), ctypes.get_errno()
            ctypes.c_char.from_address(mapping + size - 1).value  # SIGBUS?
            _libc.munmap(mapping, size)
        off = max(0, size - 4096)  # the tail: where an append lands
        got = off + len(os.pread(fd, 65536, off))
        rounds += 1
        if got < size:
            problem = f"read {rounds}: pread to {got} < fstat {size}"
            break
    os.write(report_fd, problem.encode())
    os._exit(0)


def run_lockless(path, appends=2000, chunk=1000):
    """A reader without locks (as Dovecot reads its transaction log) while
    one process appends `appends` chunks: on ext4 the reader's pread never
    returns less than the fstat before it and its mapping never faults.
    Returns {"signals": [...], "short": [...], "size": N}."""
    r, w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.close(stop_w)
            _lockless_reader(str(path), w, stop_r)
        finally:
            os._exit(1)
    os.close(w)
    os.close(stop_r)
    fd = os.open(path, os.O_WRONLY)
    try:
        for _ in range(appends):
            os.pwrite(fd, b"w" * (chunk - 1) + b"\n", os.fstat(fd).st_size)
    finally:
        os.close(fd)
        os.close(stop_w)
    with os.fdopen(r, "rb") as f:
        problem = f.read().decode()
    _, status = os.waitpid(pid, 0)
    result = {"signals": [], "short": [problem] if problem else [],
              "size": os.stat(path).st_size}
    if os.WIFSIGNALED(status):
        result["signals"].append(signal.Signals(os.WTERMSIG(status)).name)
    return result
