"""dboxadm check decodes every compressed body to its end (so a flipped
bit inside one is found by the codec's own checksum), names the right
record for a damaged metadata block, and the mount's log names the m.N
and record of a damaged compressed body."""
import errno
import random
import subprocess

from conftest import DBOXADM

RNG = random.Random(97)


def adm(*args):
    return subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                          timeout=300)


def text_body(i, lines=60):
    words = [b"alpha", b"beta", b"gamma", b"delta", b"mail", b"dbox"]
    return b"Subject: %d\n\n" % i + b"".join(
        b" ".join(RNG.choice(words) for _ in range(12)) + b"\n" for _ in range(lines))


def build_store(tmp_path, compress, n=5):
    md = tmp_path / "md"
    for sub in ("cur", "new", "tmp"):
        (md / sub).mkdir(parents=True, exist_ok=True)
    msgs = {}
    for i in range(n):
        name = f"{i}.host:2,S"
        msgs[name] = text_body(i)
        (md / "cur" / name).write_bytes(msgs[name])
    store = tmp_path / "S"
    args = ["import"] + ([f"--compress={compress}"] if compress else []) + [store, md]
    r = adm(*args)
    assert r.returncode == 0, r.stderr
    return store, msgs


def records(store):
    """[(offset, body_size, guid)] of storage/m.1, from dboxadm dump."""
    r = adm("dump", store, "m.1")
    assert r.returncode == 0, r.stderr
    out = []
    for line in r.stdout.decode().splitlines()[1:]:
        off, body, guid = line.split("\t")[:3]
        out.append((int(off), int(body), guid))
    return out


def flip(path, pos, bit=2):
    with open(path, "r+b") as f:
        f.seek(pos)
        c = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([c ^ (1 << bit)]))


def test_check_finds_a_flipped_bit_in_a_gz_body(tmp_path, make_mount):
    store, msgs = build_store(tmp_path, "gz")
    recs = records(store)
    assert len(recs) == 5
    assert adm("check", store).returncode == 0
    off, body, _ = recs[2]
    m1 = store / "storage" / "m.1"
    assert m1.read_bytes()[off + 30:off + 32] == b"\x1f\x8b"
    flip(m1, off + 30 + body // 2)
    r = adm("check", store)
    out = r.stdout.decode()
    assert r.returncode == 1, out
    problems = [l for l in out.splitlines() if l.startswith("problem:")]
    assert len(problems) == 1, out
    assert "/cur/2.host:2,S " in problems[0], out
    assert f"m.1 offset {off}" in problems[0], out
    assert "gzip" in problems[0], out
    # The mount reads it as EIO and its log names the store's m.N and record.
    m = make_mount(store=store)
    try:
        with open(m.mnt / "cur" / "2.host:2,S", "rb") as f:
            f.read()
        got = 0
    except OSError as e:
        got = e.errno
    assert got == errno.EIO
    assert f"storage/m.1 offset {off}: corrupt gzip stream" in m.log_text()
    for name, data in msgs.items():
        if name != "2.host:2,S":
            assert (m.mnt / "cur" / name).read_bytes() == data


def test_check_names_the_record_whose_metadata_is_damaged(tmp_path):
    store, msgs = build_store(tmp_path, None)
    recs = records(store)
    off, body, _ = recs[2]
    m1 = store / "storage" / "m.1"
    meta = off + 30 + body
    data = m1.read_bytes()
    assert data[meta:meta + 4] == b"\n\x01\x03\n"
    # Garbage in the block after its magic, as a flipped sector would leave.
    with open(m1, "r+b") as f:
        f.seek(meta + 6)
        f.write(b"\x00garbage\xff")
    r = adm("check", store)
    out = r.stdout.decode()
    assert r.returncode == 1, out
    lines = [l for l in out.splitlines() if "/cur/2.host:2,S " in l]
    assert len(lines) == 1, out
    assert f"m.1 offset {off}): the record is damaged: m.1 offset {off}: corrupt metadata block" in lines[0], out
    for name in msgs:
        if name != "2.host:2,S":
            assert f"/cur/{name} " not in out, out
