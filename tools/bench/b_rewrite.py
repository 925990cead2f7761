"""Messages written again in place: a rewrite (open with O_TRUNC, write
4 KB, close) and an append (open with O_APPEND, write 100 bytes, close)
of one committed message, as editors and shell scripts do; maildir
clients (Dovecot, mbsync, notmuch, Postfix, procmail, NeoMutt) write a
new file and rename it instead.  On dboxfs each is a copy-on-write copy
whose in-flight mark is synced before its first byte (docs/
durability.md, "Copies"): one WAL fdatasync per operation, by design.
Informational: no target.  The appended message is cut back to 4 KB
every 100 appends (not timed), so the copies stay small."""
import os
import time

from benchlib import Row, log, sides

BODY = b"Subject: rewritten\n\n" + b"x" * 4076


def _maildir(root, tag):
    cur = os.path.join(root, "." + tag, "cur")
    os.makedirs(cur, exist_ok=True)
    for sub in ("new", "tmp"):
        os.makedirs(os.path.join(root, "." + tag, sub), exist_ok=True)
    path = os.path.join(cur, "1.rewrite.host:2,S")
    with open(path, "wb") as f:
        f.write(BODY)
    return path


def _run(root, tag, n, append):
    """Operations per second of n rewrites or appends of one message."""
    path = _maildir(root, tag)
    spent = 0.0
    for i in range(n):
        if append and i % 100 == 99:
            os.truncate(path, len(BODY))
        t = time.monotonic()
        if append:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.write(fd, b"y" * 99 + b"\n")
        else:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.write(fd, BODY)
        os.close(fd)
        spent += time.monotonic() - t
    return n / spent


def run(ctx):
    n = ctx.n("rewrites")
    rows = []
    for append in (False, True):
        what = "append 100 B, close" if append else "rewrite (O_TRUNC, 4 KB), close"
        row = Row(f"message written again: {what}", "rate", "op/s", None,
                  f"{n} per run, one message")
        for r in range(ctx.repeats):
            tag = f"rw{int(append)}r{r}"
            dbx, nat, flo = sides(r, [
                lambda: _run(ctx.mnt, tag, n, append),
                lambda: _run(ctx.native_root, tag, n, append),
                lambda: _run(ctx.floor_mnt, tag, n, append)])
            row.add(dbx, nat, flo)
            log(f"{row.name}: dboxfs {dbx:.0f}/s native {nat:.0f}/s floor {flo:.0f}/s")
        rows.append(row)
    return rows
