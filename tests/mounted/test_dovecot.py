"""Dovecot interoperability of the storage/ bytes, against the real Dovecot
2.3 from Debian (dovecot_ctl.py runs it on a private mdbox).

- Dovecot -> dboxfs: Dovecot writes compressed mail (mail_plugins = zlib,
  zlib_save = gz, bz2, zstd, lz4) into an mdbox; our reader (`dboxadm cat`,
  the same dbox_reader the mount reads with) gives every message back
  byte-exact; and for gz, `dboxadm import --compress=gz` of the same
  messages stores bodies byte-identical to Dovecot's.  Debian's Dovecot cannot write xz, so an xz record is built
  here with Python's lzma (liblzma) in an m.N Dovecot wrote plain.
- dboxfs -> Dovecot: messages delivered through the mount (plain and with
  -o compress=gz) into several folders; the store's storage/ copied into
  an mdbox root; `doveadm force-resync` and `doveadm fetch` must find every
  message with equal bytes, received date = the mtime the mount showed
  (also after a utime()), in the folder its B metadata names, with the
  GUID our record carries.  Records no name points at any more (expunged,
  or replaced by copy-on-write) stay in m.N until a purge, and Dovecot's
  resync, having no map index that marks them refcount 0, restores them
  too: the test asserts the extras are exactly those.
"""
import lzma
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CORPORA, DBOXADM, need_corpora
from dovecot_ctl import dovecot_instance, need_dovecot


def adm(*args):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True, timeout=120)
    assert r.returncode == 0, (args, r.returncode, r.stderr.decode(errors="replace"))
    return r.stdout


def records(mfile):
    """`dboxadm dump` of one dbox file: [{offset, body_size, guid, received,
    folder, plain_size}] (plain_size None when there is no Z)."""
    lines = adm("dump", mfile.parent.parent, mfile).decode().splitlines()
    assert lines[0].split("\t") == ["offset", "body_size", "guid", "received",
                                    "folder", "plain_size"]
    out = []
    for line in lines[1:]:
        off, bsize, guid, received, folder, psize = line.split("\t")
        out.append({"offset": int(off), "body_size": int(bsize), "guid": guid,
                    "folder": folder, "plain_size": None if psize == "-" else int(psize)})
    return out


def cat(mfile, offset):
    return adm("cat", mfile.parent.parent, mfile, offset)


def body_head(mfile, rec, n=16):
    with open(mfile, "rb") as f:
        f.seek(rec["offset"] + 30)
        return f.read(min(n, rec["body_size"]))


def stored_body(mfile, rec):
    with open(mfile, "rb") as f:
        f.seek(rec["offset"] + 30)
        return f.read(rec["body_size"])


def lkml_sources(n):
    corpus = need_corpora() / "notmuch-lkml" / "cur"
    files = sorted(corpus.iterdir())[:n]
    out = [p.read_bytes() for p in files]
    for data in out:
        assert b"\r" not in data  # Dovecot stores LF; so are these
    return out


def big_message(size):
    """One large LF message: a header, then corpus bodies until size."""
    parts = [b"From: big@example.org\nSubject: large\nMessage-ID: <big@x>\n\n"]
    total = len(parts[0])
    corpus = need_corpora() / "notmuch-lkml" / "cur"
    files = sorted(corpus.iterdir())
    i = 0
    while total < size:
        data = files[i % len(files)].read_bytes()
        parts.append(data)
        total += len(data)
        i += 1
    return b"".join(parts)[:size]


MAGIC = {
    "gz": b"\x1f\x8b",
    "bz2": b"BZh",
    "zstd": b"\x28\xb5\x2f\xfd",
    "lz4": b"Dovecot-LZ4\r\x2a\x9b\xc5",
}


@pytest.mark.parametrize("codec", ["gz", "bz2", "zstd", "lz4"])
def test_dovecot_compressed_reads_back(codec, tmp_path):
    """Dovecot writes compressed (zlib_save = codec); we read it back.  For
    gz, what we write is what Dovecot writes, byte for byte."""
    need_dovecot()
    messages = lkml_sources(6) + [big_message(1_500_000), b"Subject: tiny\n\nx\n"]
    with dovecot_instance(zlib_save=codec) as dc:
        for i, data in enumerate(messages):
            dc.save("INBOX" if i % 2 == 0 else "Lists", data)
        storage = dc.mdbox / "storage"
        mfiles = sorted(storage.glob("m.*"))
        assert mfiles
        seen = []
        for mfile in mfiles:
            for rec in records(mfile):
                head = body_head(mfile, rec)
                assert head.startswith(MAGIC[codec]), head
                text = cat(mfile, rec["offset"])
                assert rec["plain_size"] == len(text)
                assert rec["body_size"] != len(text)
                seen.append((rec["folder"], text))
        want = sorted(("INBOX" if i % 2 == 0 else "Lists", data)
                      for i, data in enumerate(messages))
        assert sorted(seen) == want
        # What Dovecot itself serves is the same.
        got = sorted(m["text"] for m in dc.fetch("guid text", "mailbox", "*", "all"))
        assert got == sorted(messages)
        if codec == "gz":
            # The same messages imported with --compress=gz: the stored
            # bodies are identical to Dovecot's (same zlib, level 6).
            src = tmp_path / "src"
            for sub in ("cur", "new", "tmp"):
                (src / sub).mkdir(parents=True)
            for i, data in enumerate(messages):
                (src / "cur" / ("%d:2," % i)).write_bytes(data)
            adm("import", "--compress=gz", tmp_path / "store", src)
            ours = sorted(stored_body(f, r) for f in sorted(
                (tmp_path / "store" / "storage").glob("m.*")) for r in records(f))
            theirs = sorted(stored_body(f, r) for f in mfiles for r in records(f))
            assert ours == theirs


def dbox_record(body, plain, received, guid, mailbox):
    """A dbox v2 record as Dovecot writes it (docs/dbox-format.md sections 3, 5)."""
    vsize = len(plain) + plain.count(b"\n") - plain.count(b"\r\n")
    meta = b"Z%x\nR%x\nV%x\nG%s\nB%s\n\n" % (len(plain), received, vsize,
                                             guid.encode(), mailbox.encode())
    header = b"\x01\x02N " + b" " * 8 + b" " + b"%016X" % len(body) + b"\n"
    return header + body + b"\n\x01\x03\n" + meta


def test_xz_record_reads_back(tmp_path):
    """xz (liblzma via Python's lzma) bodies, in an m.N next to plain ones:
    dump and cat read them, single- and multi-stream."""
    texts = lkml_sources(3) + [big_message(400_000)]
    store = tmp_path / "mdbox"
    (store / "storage").mkdir(parents=True)
    blob = bytearray(b"2 M1e C%x\n" % int(time.time()))
    # plain, xz, xz preset 9 with CRC32, xz as two concatenated streams
    plain = texts[0]
    header = b"\x01\x02N " + b" " * 8 + b" " + b"%016X" % len(plain) + b"\n"
    blob += header + plain + b"\n\x01\x03\nR65a00000\nG%s\nBINBOX\n\n" % (b"0" * 32)
    bodies = [
        (texts[1], lzma.compress(texts[1], format=lzma.FORMAT_XZ)),
        (texts[2], lzma.compress(texts[2], preset=9, check=lzma.CHECK_CRC32)),
        (texts[3], lzma.compress(texts[3][:100_000]) + lzma.compress(texts[3][100_000:])),
    ]
    for i, (text, body) in enumerate(bodies):
        assert body.startswith(b"\xfd7zXZ\x00")
        blob += dbox_record(body, text, 1700000000 + i, "%032x" % (i + 1), "Lists")
    (store / "storage" / "m.1").write_bytes(bytes(blob))
    recs = records(store / "storage" / "m.1")
    assert len(recs) == 4
    assert cat(store / "storage" / "m.1", recs[0]["offset"]) == plain
    for rec, (text, body) in zip(recs[1:], bodies):
        assert rec["body_size"] == len(body)
        assert rec["plain_size"] == len(text)
        assert cat(store / "storage" / "m.1", rec["offset"]) == text
    # A damaged xz body is an error, not wrong bytes.
    mfile = store / "storage" / "m.1"
    raw = bytearray(mfile.read_bytes())
    mid = recs[3]["offset"] + 30 + recs[3]["body_size"] // 2
    raw[mid:mid + 8] = b"\xa5" * 8
    mfile.write_bytes(bytes(raw))
    r = subprocess.run([str(DBOXADM), "cat", store, mfile, str(recs[3]["offset"])],
                       capture_output=True)
    assert r.returncode == 1
    assert b"corrupt xz stream" in r.stderr


# --- dboxfs -> Dovecot ------------------------------------------------------

def deliver(folder, name, data, chunk=4096, mtime=None):
    """Deliver like an MDA: write tmp/name front to back, rename to new/."""
    tmp = folder / "tmp" / name
    with open(tmp, "wb") as f:
        for i in range(0, len(data), chunk):
            f.write(data[i:i + chunk])
        f.flush()
        os.fsync(f.fileno())
    if mtime is not None:
        os.utime(tmp, ns=(mtime, mtime))
    os.rename(tmp, folder / "new" / name)
    return folder / "new" / name


def mount_messages(mnt):
    """{path: (mailbox, bytes, mtime seconds)} of every message on the mount."""
    out = {}
    for dirpath, dirs, files in os.walk(mnt):
        d = Path(dirpath)
        if d.name not in ("cur", "new", "tmp"):
            continue
        rel = os.path.relpath(d.parent, mnt)
        if rel == ".":
            mailbox = "INBOX"
        elif "/" not in rel and rel.startswith("."):
            mailbox = rel[1:].replace(".", "/")
        else:
            mailbox = rel
        for n in files:
            if n.startswith("."):
                continue
            p = d / n
            out[p] = (mailbox, p.read_bytes(), int(os.stat(p).st_mtime))
    return out


@pytest.mark.parametrize("compress", [None, "gz"])
def test_dboxfs_to_dovecot(make_mount, tmp_path, compress):
    need_dovecot()
    options = ["-o", "compress=" + compress] if compress else []
    m = make_mount(options=options)
    mnt = m.mnt
    inbox = m.maildir()
    lists = m.maildir(".Lists")
    kernel = m.maildir(".Lists.Kernel")
    archive = m.maildir("Archive", "2019")   # nested ("verbatim") folder
    srcs = lkml_sources(12)

    for i, data in enumerate(srcs[:5]):
        deliver(inbox, "100%d.M1P1.host" % i, data, mtime=1600000000_000000000 + i * 10**9)
    # cp -a keeps the source mtimes (utimensat after writing).
    src_cur = need_corpora() / "notmuch-lkml" / "cur"
    subprocess.run("cp -a %s/* %s/" % (src_cur, lists / "cur"), shell=True, check=True)
    deliver(kernel, "big.M2P1.host", big_message(1_200_000), chunk=65536)
    # Written out of order: second half first.
    data = srcs[5]
    with open(kernel / "tmp" / "ooo", "wb") as f:
        f.seek(len(data) // 2)
        f.write(data[len(data) // 2:])
        f.seek(0)
        f.write(data[:len(data) // 2])
    os.rename(kernel / "tmp" / "ooo", kernel / "cur" / "ooo:2,S")
    # Appended to after it was committed (copy-on-write of the record).
    p = deliver(kernel, "appended.M3P1.host", srcs[6])
    with open(p, "ab") as f:
        f.write(b"\nappended line\n")
    # CRLF line ends, kept byte for byte by dboxfs.
    deliver(archive, "crlf.M4P1.host", srcs[7].replace(b"\n", b"\r\n"))
    deliver(archive, "plain.M5P1.host", srcs[8])
    # A client sets the received date after delivery (utime, as mbsync).
    p = deliver(inbox, "utime.M6P1.host", srcs[9])
    os.utime(p, (1234567890, 1234567890))
    os.utime(lists / "cur" / sorted(os.listdir(lists / "cur"))[0], (987654321, 987654321))

    want = mount_messages(mnt)
    assert os.stat(p).st_mtime == 1234567890
    m.unmount()

    store_files = sorted((m.store / "storage").glob("m.*"))
    recs = [r for f in store_files for r in records(f)]
    db = sqlite3.connect(m.store / "index.sqlite")
    live = {g for (g,) in db.execute("SELECT guid FROM message")}
    db.close()
    # Records no name points at: here the first version of the message
    # appended to after its commit (copy-on-write), garbage until a purge.
    dead = {r["guid"] for r in recs} - live
    assert len(dead) == 1
    if compress:
        # Every message body in storage/ is gzip, with Z.
        compressed = 0
        for f in store_files:
            for r in records(f):
                if r["body_size"] > 0 and r["plain_size"] is not None:
                    assert body_head(f, r).startswith(b"\x1f\x8b")
                    compressed += 1
        assert compressed >= len(want)

    with dovecot_instance(zlib=bool(compress)) as dc:
        dest = dc.mdbox / "storage"
        dest.mkdir()
        for f in store_files:
            shutil.copy2(f, dest / f.name)
        dc.chown_store()
        dc.force_resync()
        got = dc.fetch("mailbox guid date.received.unixtime text",
                       "mailbox", "*", "all")

    # Without a map index that says otherwise, force-resync restores the
    # dead records too (docs/dbox-format.md section 12): the extras are
    # exactly those.  After a purge there are none.
    extra = [g for g in got if g["guid"].decode() not in live]
    assert {g["guid"].decode() for g in extra} == dead
    got = [g for g in got if g["guid"].decode() in live]
    assert len(got) == len(want)
    got_set = sorted((g["mailbox"].decode(), int(g["date.received.unixtime"]), g["text"])
                     for g in got)
    want_set = sorted((mb, mtime, data) for mb, data, mtime in want.values())
    if got_set != want_set:
        missing = set(want_set) - set(got_set)
        extra = set(got_set) - set(want_set)
        pytest.fail("differ: %d missing %s / %d extra %s" % (
            len(missing), [(a, b, c[:60]) for a, b, c in sorted(missing)][:5],
            len(extra), [(a, b, c[:60]) for a, b, c in sorted(extra)][:5]))
    assert {g["guid"].decode() for g in got} == live
    assert {g["mailbox"].decode() for g in got} == {"INBOX", "Lists", "Lists/Kernel",
                                                    "Archive/2019"}
