"""make install / uninstall, the installed programs at work, and the
documentation agreeing with the code.

- `make install DESTDIR=... PREFIX=...` puts exactly the two programs and
  two man pages where the GNU directory variables say; the installed
  dboxadm imports a maildir and the installed dboxfs mounts it, byte-equal;
  `man` finds the installed pages; `make uninstall` removes them all.
- Every option of every fuse_opt table in fs/*.c is in `dboxfs --help` and
  in dboxfs(1) (an -o option's entry also names its default); every verb
  that `dboxadm --help` lists, and every --flag of `dboxadm VERB --help`,
  is in dboxadm(8).  Both lists come from the code, so an option or verb
  added later without documentation fails here.
- The man pages format without a groff warning.
- The systemd units in docs/administration.md pass `systemd-analyze verify`.
"""
import json
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import DBOXADM, DBOXFS, unmount
from sysenv import (ROOT, MountNamespace, install, need_root, sample_maildir,
                    store_released)

MAN_PAGES = {"dboxfs": ROOT / "man" / "dboxfs.1", "dboxadm": ROOT / "man" / "dboxadm.8"}
INSTALLED = {
    "usr/local/bin/dboxfs": 0o755,
    "usr/local/bin/dboxadm": 0o755,
    "usr/local/share/man/man1/dboxfs.1": 0o644,
    "usr/local/share/man/man8/dboxadm.8": 0o644,
}


def installed_files(destdir):
    return {str(p.relative_to(destdir)): stat.S_IMODE(p.stat().st_mode)
            for p in Path(destdir).rglob("*") if not p.is_dir()}


@pytest.fixture(scope="module")
def destdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("destdir")
    r = install(d)
    assert r.returncode == 0, r.stdout + r.stderr
    return d


def test_install_puts_programs_and_man_pages_in_place(destdir):
    assert installed_files(destdir) == INSTALLED
    assert (destdir / "usr/local/bin/dboxfs").read_bytes() == DBOXFS.read_bytes()
    assert (destdir / "usr/local/bin/dboxadm").read_bytes() == DBOXADM.read_bytes()
    for name, src in MAN_PAGES.items():
        assert next(destdir.rglob(src.name)).read_bytes() == src.read_bytes()


def test_installed_programs_import_and_mount(destdir, tmp_path):
    bindir = destdir / "usr/local/bin"
    for prog in ("dboxfs", "dboxadm"):
        r = subprocess.run([str(bindir / prog), "--version"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.startswith(f"{prog} "), r

    src = sample_maildir(tmp_path / "Maildir", messages=30)
    nmessages = sum(1 for p in src.rglob("*")
                    if p.parent.name in ("cur", "new") and p.is_file())
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    r = subprocess.run([str(bindir / "dboxadm"), "import", str(store), str(src)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    mnt.mkdir()
    try:
        r = subprocess.run([str(bindir / "dboxfs"), str(store), str(mnt)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["diff", "-r", str(src), str(mnt)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:]
        r = subprocess.run([str(bindir / "dboxadm"), "stats", "--json", str(store)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["messages"] == nmessages
    finally:
        unmount(mnt)
    assert store_released(store)


@pytest.mark.skipif(shutil.which("man") is None, reason="man-db not installed")
def test_man_finds_installed_pages(destdir):
    manpath = destdir / "usr/local/share/man"
    for name, section in (("dboxfs", "1"), ("dboxadm", "8")):
        r = subprocess.run(["man", "-M", str(manpath), "-w", section, name],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert Path(r.stdout.strip()) == manpath / f"man{section}" / f"{name}.{section}"


def test_prefix_and_uninstall(tmp_path):
    dest = tmp_path / "dest"
    r = install(dest, prefix="/opt/dboxfs")
    assert r.returncode == 0, r.stderr
    assert installed_files(dest) == {k.replace("usr/local", "opt/dboxfs"): v
                                     for k, v in INSTALLED.items()}
    (dest / "opt/dboxfs/bin/unrelated").write_text("not ours\n")
    r = install(dest, prefix="/opt/dboxfs", target="uninstall")
    assert r.returncode == 0, r.stderr
    assert installed_files(dest) == {"opt/dboxfs/bin/unrelated": 0o644}


# --- the documentation agrees with the code ------------------------------------

def render_man(page):
    """The man page as a user reads it: plain text, no hyphenation, long
    lines (one paragraph per line)."""
    r = subprocess.run(["groff", "-man", "-Tascii", "-rHY=0", "-rLL=300n",
                        "-P-cbou", str(page)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def paragraph_at(text, pattern):
    """The paragraph (up to the next blank line) of the first line of text
    that starts with pattern (after indentation and other tags such as
    '-h, '), or None."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*(?:\S+,\s+)*" + pattern, line):
            para = []
            for l in lines[i:]:
                if not l.strip():
                    break
                para.append(l)
            return "\n".join(para)
    return None


def fuse_opt_tables():
    """Every template string in every `struct fuse_opt NAME[] = {...}` of
    fs/*.c, as (option token, is -o option)."""
    opts = []
    for src in sorted((ROOT / "fs").glob("*.c")):
        text = src.read_text()
        for table in re.finditer(r"struct fuse_opt\s+\w+\s*\[\]\s*=\s*\{(.*?)\};",
                                 text, re.S):
            for tmpl in re.findall(r'"([^"]+)"', table.group(1)):
                name = re.split(r"[= ]", tmpl, maxsplit=1)[0]
                opts.append((name, not tmpl.startswith("-")))
    return sorted(set(opts))


def option_pattern(name, dash_o):
    if dash_o:
        return r"-o\s+" + re.escape(name) + r"(?![\w-])"
    return r"(?<![\w-])" + re.escape(name) + r"(?![\w-])"


def test_fuse_opt_table_is_parsed():
    opts = fuse_opt_tables()
    assert ("rotate_size", True) in opts and ("--help", False) in opts, opts


@pytest.mark.parametrize("name,dash_o", fuse_opt_tables(),
                         ids=[n for n, _ in fuse_opt_tables()])
def test_every_dboxfs_option_in_help_and_man_page(name, dash_o):
    help_text = subprocess.run([str(DBOXFS), "--help"], capture_output=True,
                               text=True, timeout=30).stdout
    man = render_man(MAN_PAGES["dboxfs"])
    pattern = option_pattern(name, dash_o)
    assert re.search(pattern, help_text), f"{name} missing from dboxfs --help"
    para = paragraph_at(man, pattern)
    assert para is not None, f"{name} has no entry in man/dboxfs.1"
    if dash_o:
        assert re.search(r"\bdefault\b", para, re.I), \
            f"the entry of -o {name} in man/dboxfs.1 does not give its default:\n{para}"


def dboxadm_verbs():
    out = subprocess.run([str(DBOXADM), "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    listing = out.split("Verbs:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^  ([a-z][\w-]*)\s", listing, re.M)


def test_dboxadm_verbs_are_parsed():
    assert {"import", "export", "stats", "dump"} <= set(dboxadm_verbs())


@pytest.mark.parametrize("verb", dboxadm_verbs())
def test_every_dboxadm_verb_and_flag_in_man_page(verb):
    man = render_man(MAN_PAGES["dboxadm"])
    # The verb's own subsection: from its heading to the next heading.
    m = re.search(r"^   dboxadm " + re.escape(verb) + r"\b.*?(?=^ {0,3}\S|\Z)",
                  man, re.M | re.S)
    assert m, f"verb {verb} has no subsection 'dboxadm {verb} ...' in man/dboxadm.8"
    usage = subprocess.run([str(DBOXADM), verb, "--help"], capture_output=True,
                           text=True, timeout=30)
    assert usage.returncode == 0 and usage.stdout.startswith(f"usage: dboxadm {verb}")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", usage.stdout)) - {"--help"}
    for flag in flags:
        assert re.search(option_pattern(flag, False), m.group(0)), \
            f"{verb} {flag} is not described in man/dboxadm.8"


@pytest.mark.parametrize("page", sorted(MAN_PAGES.values()), ids=lambda p: p.name)
def test_man_page_formats_without_warnings(page):
    r = subprocess.run(["groff", "-man", "-ww", "-z", str(page)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_man_page_versions_match_programs():
    for prog, page in MAN_PAGES.items():
        binary = DBOXFS if prog == "dboxfs" else DBOXADM
        version = subprocess.run([str(binary), "--version"], capture_output=True,
                                 text=True, timeout=30).stdout.split()[1]
        th = next(l for l in page.read_text().splitlines() if l.startswith(".TH "))
        assert f'"dboxfs {version}"' in th, (prog, version, th)


# --- the systemd units of docs/administration.md ------------------------------

UNIT_HEADER = re.compile(r"^( +)# (/etc/systemd/system/|~/\.config/systemd/user/)(\S+)$")


def doc_units():
    """(directory, name, text) of every unit file shown in
    docs/administration.md: an
    indented block whose first line is '# <path of the unit>'."""
    units, current = [], None
    for line in (ROOT / "docs" / "administration.md").read_text().splitlines():
        m = UNIT_HEADER.match(line)
        if m:
            indent = m.group(1)
            current = [m.group(2), m.group(3), []]
            units.append(current)
        elif current is not None and (line.startswith(indent) or not line.strip()):
            current[2].append(line[len(indent):])
        else:
            current = None
    return [(d, n, "\n".join(t).strip() + "\n") for d, n, t in units]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed")
def test_documented_systemd_units_verify(destdir, tmp_path):
    need_root()
    units = doc_units()
    kinds = {n.rsplit(".", 1)[1] for _, n, _ in units}
    assert {"mount", "service", "timer"} <= kinds, units
    system, user = tmp_path / "system", tmp_path / "user"
    system.mkdir()
    user.mkdir()
    for d, name, text in units:
        ((system if d.startswith("/etc") else user) / name).write_text(text)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    # ExecStart= paths must exist: verify where /usr/local/bin is the install.
    ns = MountNamespace(tmp_path, bindir=destdir / "usr/local/bin")
    try:
        for scope, d in (([], system), (["--user"], user)):
            files = sorted(str(p) for p in d.iterdir())
            if not files:
                continue
            r = ns.run(["env", f"XDG_RUNTIME_DIR={runtime}", "systemd-analyze",
                        *scope, "verify", *files])
            assert r.returncode == 0 and r.stderr == "", r.stderr
    finally:
        ns.close()
