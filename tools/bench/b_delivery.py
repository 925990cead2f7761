"""Delivery the maildir way: exclusive create in tmp/, write, optional
fsync, close, rename into new/ - as procmail, maildrop and Postfix's
virtual(8) do - with 1 and 4 concurrent writers (processes).  Messages
are the bytes of the gen-corpus corpus.  Each repeat delivers into a new
folder on both sides; the rate is messages per second of wall time from
the start of the first writer to the end of the last.  The FUSE floor
(passthrough_ll over ext4) delivers the same messages in the same
rotation."""
import multiprocessing
import os
import socket
import time

from benchlib import Row, log, sides

_host = socket.gethostname()


def _writer(folder, msgs, fsync, wid, barrier, out):
    tmp, new = os.path.join(folder, "tmp"), os.path.join(folder, "new")
    barrier.wait()
    t0 = time.monotonic()
    for i, data in enumerate(msgs):
        name = f"{int(time.time())}.M{i}P{os.getpid()}Q{wid}_{i}.{_host}"
        path = os.path.join(tmp, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
        os.close(fd)
        os.rename(path, os.path.join(new, name))
    out.put((t0, time.monotonic()))


def deliver(folder, msgs, writers, fsync):
    """Messages per second delivering msgs into folder (created)."""
    for sub in ("cur", "new", "tmp"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_writer,
                         args=(folder, msgs[w::writers], fsync, w, barrier, out))
             for w in range(writers)]
    for p in procs:
        p.start()
    spans = [out.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"delivery writer failed ({p.exitcode})")
    got = len(os.listdir(os.path.join(folder, "new")))
    if got != len(msgs):
        raise RuntimeError(f"{folder}: delivered {got} of {len(msgs)}")
    return len(msgs) / (max(e for _, e in spans) - min(s for s, _ in spans))


def floor_deliver(ctx, tag, batch, writers, fsync):
    """deliver() on the floor, mounted afresh first (not timed):
    passthrough_ll holds a descriptor per inode it has seen, and the
    messages of all repeats would pass the limit."""
    ctx.work_floor.unmount()
    ctx.work_floor.mount()
    return deliver(os.path.join(ctx.floor_mnt, "." + tag), batch, writers, fsync)


CASES = [  # (fsync, writers, target ratio of rates)
    (True, 1, 1.2),
    (True, 4, 1.5),
    (False, 1, 0.6),
    (False, 4, None),
]


def run(ctx):
    msgs = ctx.messages
    rows = []
    for fsync, writers, target in CASES:
        n = ctx.n("delivery_fsync" if fsync else "delivery")
        batch = (msgs * (n // len(msgs) + 1))[:n]
        row = Row(f"delivery, fsync {'on' if fsync else 'off'}, {writers} writer{'s' if writers > 1 else ''}",
                  "rate", "msg/s", (">=", target, False) if target else None,
                  f"{n} messages per run", floor_target=(">=", 0.9))
        for r in range(ctx.repeats):
            tag = f"d{int(fsync)}w{writers}r{r}"
            dbx, nat, flo = sides(r, [
                lambda: deliver(os.path.join(ctx.mnt, "." + tag), batch, writers, fsync),
                lambda: deliver(os.path.join(ctx.native_root, "." + tag), batch, writers, fsync),
                lambda: floor_deliver(ctx, tag, batch, writers, fsync)])
            row.add(dbx, nat, flo)
            log(f"{row.name}: dboxfs {dbx:.0f}/s native {nat:.0f}/s floor {flo:.0f}/s")
        rows.append(row)
    return rows
