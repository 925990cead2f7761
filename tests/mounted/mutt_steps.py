"""NeoMutt and classic mutt driven in batch: `-e 'push "<keys>"'` under a
pseudo-terminal (script(1)), for test_neomutt.py and test_mutt.py.

The same steps run on a folder on the mount and on a native copy of it;
after each step the two folders must hold the same names (so the same flags
in the same cur/ or new/) and the same bytes.
"""
import email
import email.policy
import os
import re

from conftest import need_corpora
from maildir_tools import (content_view, copy_corpus, messages, names,
                           parse_strace, run_in_terminal, split_name,
                           strace_prefix)

# Options both mutt and NeoMutt know.  header_cache is set per run.
MUTTRC = """set mbox_type=Maildir
set folder="{folder}"
set spoolfile="{folder}"
set header_cache="{hcache}"
set confirmcreate=no
set confirmappend=no
set wait_key=no
set delete=yes
set move=no
set mark_old=no
set quit=yes
set beep=no
set sort=date
set sleep_time=0
"""

# The lkml corpus subjects these patterns select (counts on the corpus):
# cifs (87 messages), cache (subset), fs-cache, semicolons, rfc.
STEPS = [
    # (what, keys); keys run in the index of the opened folder.
    ("flag and mark read",
     "<tag-pattern>~s cifs<enter><tag-prefix><set-flag>!"
     "<tag-prefix><clear-flag>N<sync-mailbox>"),
    ("clear flag",
     "<untag-pattern>~A<enter><tag-pattern>~s cache<enter>"
     "<tag-prefix><clear-flag>!<sync-mailbox>"),
    ("mark unread: cur -> new",
     "<untag-pattern>~A<enter><tag-pattern>~s fs-cache<enter>"
     "<tag-prefix><set-flag>N<sync-mailbox>"),
    ("delete and sync",
     "<untag-pattern>~A<enter><tag-pattern>~s semicolons<enter>"
     "<tag-prefix><delete-message><sync-mailbox>"),
    ("save (copy) into a new folder",
     "<untag-pattern>~A<enter><tag-pattern>~s rfc<enter>"
     "<tag-prefix><copy-message>+.Saved<enter>"),
]


def write_rc(path, folder, hcache=""):
    path.write_text(MUTTRC.format(folder=folder, hcache=hcache))
    return path


# The syscalls a maildir commit and a flag change use.
COMMIT_CALLS = ["link", "linkat", "rename", "renameat", "renameat2",
                "unlink", "unlinkat"]


def run(prog, rc, mailbox, keys, timeout=120, trace=None):
    """Open mailbox with prog, type keys, quit.  trace: a log file; the
    commit syscalls are traced into it and returned."""
    cmd = (f"{prog} -n -F {rc} -f {mailbox} "
           f"-e 'push \"{keys}<quit>\"'")
    if trace is not None:
        cmd = " ".join(strace_prefix(trace, COMMIT_CALLS)) + " " + cmd
    run_in_terminal(cmd, timeout=timeout)
    return parse_strace(trace) if trace is not None else None


def copy_all(prog, rc, mailbox, out):
    """Copy every message of mailbox to the maildir out: prog opens and
    reads each one."""
    run(prog, rc, mailbox,
        f"<tag-pattern>~A<enter><tag-prefix><copy-message>{out}<enter>")


def created_view(root):
    """content_view without the unique part: names of messages a mutt
    creates hold the time, pid or a random number."""
    return content_view(root, unique=lambda base: "")


def run_steps(prog, rc_mount, rc_native, mount_root, native_root, folder):
    """Run STEPS on mount_root/folder and native_root/folder; after each,
    the names (flags, cur/new) and bytes of the two trees must be equal.
    Returns, per step, the names on the mount and the commit syscalls
    the step made there."""
    seen = []
    for what, keys in STEPS:
        calls = run(prog, rc_mount, mount_root / folder, keys,
                    trace=mount_root.parent / "strace.log")
        run(prog, rc_native, native_root / folder, keys)
        # The folder itself keeps its names; new folders (.Saved) get
        # names with time and a random part.
        got, want = names(mount_root / folder), names(native_root / folder)
        assert got == want, what
        m, n = messages(mount_root / folder), messages(native_root / folder)
        assert m == n, what
        assert created_view(mount_root) == created_view(native_root), what
        seen.append((got, calls))
    return seen


def message_ids(maildir):
    ids = []
    for sub in ("cur", "new"):
        for name in os.listdir(os.path.join(maildir, sub)):
            with open(os.path.join(maildir, sub, name), "rb") as fp:
                ids.append(email.message_from_binary_file(fp)["Message-ID"])
    return sorted(ids)


def subjects(maildir):
    """{relative path: unfolded Subject} of the messages in maildir."""
    out = {}
    for rel, data in messages(maildir).items():
        msg = email.message_from_bytes(data, policy=email.policy.compat32)
        out[rel] = re.sub(r"\s+", " ", str(msg["Subject"] or ""))
    return out


def matching(subj, word):
    return {p for p, s in subj.items() if word.lower() in s.lower()}


def check_steps(prog, mount, tmp_path):
    """The steps of mutt_steps.STEPS with prog on the mount and natively,
    each step's effect checked against the corpus subjects."""
    src = need_corpora() / "notmuch-lkml"
    copy_corpus(src, mount.mnt / ".lkml")
    native_root = tmp_path / "native"
    native_root.mkdir()
    copy_corpus(src, native_root / ".lkml")
    subj = subjects(src)
    total = len(subj)
    rc_m = write_rc(tmp_path / "muttrc-mount", mount.mnt)
    rc_n = write_rc(tmp_path / "muttrc-native", native_root)

    steps = run_steps(prog, rc_m, rc_n, mount.mnt, native_root, ".lkml")
    after = [paths for paths, _ in steps]
    base = {os.path.basename(p): split_name(os.path.basename(p))[0]
            for p in subj}
    cifs, cache = matching(subj, "cifs"), matching(subj, "cache")
    fscache, semi = matching(subj, "fs-cache"), matching(subj, "semicolons")
    rfc = matching(subj, "rfc")
    assert cifs and cache & cifs and fscache and semi and rfc

    def flagged(paths, flag):
        return {base_of(p) for p in paths
                if flag in split_name(os.path.basename(p))[1]}

    def base_of(p):
        return split_name(os.path.basename(p))[0]

    def bases(paths):
        return {base[os.path.basename(p)] for p in paths}

    # 1: every cifs message flagged and read, nothing else.
    assert flagged(after[0], "F") == bases(cifs)
    assert flagged(after[0], "S") == bases(cifs)
    # 2: the flag cleared on the cache ones only.
    assert flagged(after[1], "F") == bases(cifs - cache)
    # 3: fs-cache ones unread again, moved back to new/.
    in_new = {base_of(p) for p in after[2] if p.startswith("new/")}
    assert in_new == bases(fscache)
    assert flagged(after[2], "S") == bases(cifs - fscache)
    # 4: deleted and synced away.
    assert len(after[3]) == total - len(semi)
    assert not bases(semi) & {base_of(p) for p in after[3]}
    # 5: the rfc messages saved into a new folder with link().
    saved = messages(mount.mnt / ".Saved")
    assert len(saved) == len(rfc - semi)
    assert os.listdir(mount.mnt / ".Saved" / "tmp") == []
    # Each was committed with link() from tmp/ into cur/ or new/, then the
    # tmp/ name unlinked; link() never failed, rename() was not needed.
    calls = steps[4][1]
    links = [c for c in calls if c[0] in ("link", "linkat")]
    assert len(links) == len(saved) and all(c[2] == 0 for c in links)
    assert all("/.Saved/tmp/" in c[1] for c in links)
    assert not [c for c in calls if c[0].startswith("rename")]
    unlinks = [c for c in calls if c[0].startswith("unlink") and
               "/.Saved/tmp/" in c[1]]
    assert len(unlinks) == len(saved) and all(c[2] == 0 for c in unlinks)
    # And flag changes were renames (step 1: one per cifs message).
    renames = [c for c in steps[0][1] if c[0].startswith("rename")]
    assert len(renames) == len(cifs) and all(c[2] == 0 for c in renames)
