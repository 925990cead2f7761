"""The first thing a user does: mount, write a message, read it back."""
import os


def test_deliver_and_read(mount):
    md = mount.maildir()
    (md / "tmp" / "1.x.host").write_bytes(b"Subject: hi\n\nbody\n")
    os.rename(md / "tmp" / "1.x.host", md / "new" / "1.x.host")
    assert (md / "new" / "1.x.host").read_bytes() == b"Subject: hi\n\nbody\n"
    assert os.listdir(md / "new") == ["1.x.host"]
    mount.remount()
    assert (md / "new" / "1.x.host").read_bytes() == b"Subject: hi\n\nbody\n"
