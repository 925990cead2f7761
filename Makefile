# dboxfs: build, test, demo, sanitizer builds.
#
#   make            build dboxfs and dboxadm into build/
#   make check      install test dependencies (Debian, as root), build, run all tests
#   make check-asan the same tests against an ASan+UBSan build (build-asan/)
#   make check-tsan the concurrency tests against a ThreadSanitizer build
#   make fuzz       fuzz the dbox parser for FUZZ_TIME seconds (libFuzzer)
#   make demo       a sample store mounted on demo/mnt
#   make bench      benchmarks against native maildir (tools/bench/)
#   make install    dboxfs, dboxadm and their man pages under PREFIX (/usr/local);
#                   DESTDIR stages the tree elsewhere (GNU conventions)
#   make uninstall  remove exactly what install put there

CC      ?= cc
BUILD   ?= build
# One spelling per build directory: tests run `make BUILD=<absolute path>`
# (install), and objects made under that name get .d files make cannot
# match to the relative one, so a changed header would not rebuild them.
override BUILD := $(patsubst $(CURDIR)/%,%,$(abspath $(BUILD)))
# storage/ needs the codecs; index/ SQLite; fs/ libfuse3.
STORAGE_PKGS := zlib liblzma libzstd liblz4
PKGS    := fuse3 sqlite3 $(STORAGE_PKGS)
CFLAGS  ?= -O2 -g
# No build here defines NDEBUG: assert(3) checks (the store lock's holder
# and the save states, engine/store.h) are on in this, the ASan and the
# TSan builds.
override CFLAGS += -std=gnu11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
           $(shell pkg-config --cflags $(PKGS)) -I. -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64
# libbz2 has no pkg-config file in Debian.
override LDLIBS += $(shell pkg-config --libs $(PKGS)) -lbz2 -lpthread

STORAGE_SRC := $(wildcard storage/*.c)
INDEX_SRC   := $(wildcard index/*.c)
ENGINE_SRC  := $(wildcard engine/*.c)
FS_SRC      := $(wildcard fs/*.c)
ADM_SRC     := $(wildcard tools/dboxadm/*.c)
# test-common.c holds the tests' shared helpers; it is linked into each.
UNIT_SRC    := $(filter-out tests/unit/test-common.c,$(wildcard tests/unit/test-*.c))

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))
LIB_OBJ  := $(call obj,$(STORAGE_SRC) $(INDEX_SRC) $(ENGINE_SRC))
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))

all: $(BUILD)/dboxfs $(BUILD)/dboxadm

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/libdbox.a: $(LIB_OBJ)
	$(AR) rcs $@ $^

$(BUILD)/dboxfs: $(call obj,$(FS_SRC)) $(BUILD)/libdbox.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/dboxadm: $(call obj,$(ADM_SRC)) $(BUILD)/libdbox.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(BUILD)/tests/unit/test-common.o \
		  $(BUILD)/libdbox.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The objects the unit tests link are intermediate files to make: keep them
# (else `make unit` deletes them and the next build compiles them again).
.SECONDARY:

# --- tests -------------------------------------------------------------------

# Debian packages the build needs, and what `make demo` runs (fuse3 to
# mount, python3 for tools/gen-corpus); installed when missing (root).
DEMO_DEBS := gcc pkg-config fuse3 libfuse3-dev libsqlite3-dev \
             zlib1g-dev libbz2-dev liblzma-dev libzstd-dev liblz4-dev python3
# Debian packages the tests drive; installed when missing (needs root).
TEST_DEBS := fuse3 libfuse3-dev libsqlite3-dev zlib1g-dev pkg-config \
             libcmocka-dev python3-pytest neomutt rsync sqlite3 \
             libbz2-dev liblzma-dev libzstd-dev liblz4-dev dovecot-core dovecot-imapd \
             mutt isync notmuch procmail maildrop strace gpg-agent maildir-utils \
             clang libclang-rt-14-dev

deps:
	@tools/install-deps $(TEST_DEBS)

unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done

# Mounted tests: pytest from Debian (/usr/bin/python3), against $(BUILD).
PYTEST := /usr/bin/python3 -m pytest
mounted: all
	DBOXFS_BUILD=$(abspath $(BUILD)) $(PYTEST) -q -p no:cacheprovider tests/mounted $(PYTEST_ARGS)

check: deps
	$(MAKE) unit
	$(MAKE) mounted
	$(MAKE) fuzz FUZZ_TIME=20 FUZZ_SEED=1

# The whole suite against ASan+UBSan; the mounted tests read the daemon's
# stderr and fail on any sanitizer report (LeakSanitizer at unmount too).
check-asan: deps
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" unit mounted

# The tests that run threads and processes against one daemon, against a
# ThreadSanitizer build (the daemon's loop is multithreaded).
TSAN_TESTS := tests/mounted/test_semantics.py::test_concurrent_writers \
              tests/mounted/test_semantics.py::test_racing_flag_renames \
              tests/mounted/test_semantics.py::test_big_directory_listing_during_renames \
              tests/mounted/test_semantics.py::test_open_readers_see_writes_to_message \
              tests/mounted/test_safety.py::test_check_while_delivering \
              tests/mounted/test_altmove.py::test_altmove_online_under_load \
              tests/mounted/test_fsync_group.py \
              tests/mounted/test_fsync_one_flush.py \
              tests/mounted/test_power_loss_copy.py \
              tests/mounted/test_availability.py::test_big_message_does_not_stall_others \
              tests/mounted/test_shared_files.py \
              tests/mounted/test_crash.py \
              tests/mounted/test_deferred_commit.py \
              tests/mounted/test_python_mailbox.py \
              tests/mounted/test_damage.py::test_backup_copied_over_a_crashed_store_takes_no_more_changes \
              tests/mounted/test_permissions_owner.py::test_chmods_against_listings_do_not_stop_the_mount \
              tests/mounted/test_mounting.py::test_sigterm_keeps_what_write_returned
check-tsan: deps
	$(MAKE) BUILD=build-tsan CFLAGS="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" all
	DBOXFS_BUILD=$(abspath build-tsan) DBOXFS_CRASH_CYCLES=5 \
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $(TSAN_OPTIONS)" \
	setarch -R $(PYTEST) -q -p no:cacheprovider $(TSAN_TESTS) $(PYTEST_ARGS)

# --- fuzzing -----------------------------------------------------------------

# libFuzzer (clang) over the dbox parser: tests/fuzz/fuzz-dbox.c, seeds
# from tests/fuzz/gen-seeds.c.  The corpus grows in build-fuzz/corpus.
FUZZ_TIME  ?= 300
# 0: a new seed each run (exploring); `make check` fixes one so that its
# gate gives the same inputs each time and a failure can be rerun.
FUZZ_SEED  ?= 0
FUZZ_BUILD := build-fuzz
FUZZ_CFLAGS := -O1 -g -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer \
               -fno-sanitize-recover=undefined

$(FUZZ_BUILD)/fuzz-dbox: tests/fuzz/fuzz-dbox.c $(STORAGE_SRC) $(wildcard storage/*.h)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -std=gnu11 -Wall -Wextra -Wno-unused-parameter -I. \
		-D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 $(shell pkg-config --cflags $(STORAGE_PKGS)) \
		-o $@ tests/fuzz/fuzz-dbox.c $(STORAGE_SRC) \
		$(shell pkg-config --libs $(STORAGE_PKGS)) -lbz2

$(FUZZ_BUILD)/gen-seeds: tests/fuzz/gen-seeds.c $(BUILD)/libdbox.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

fuzz: $(FUZZ_BUILD)/fuzz-dbox $(FUZZ_BUILD)/gen-seeds
	rm -rf $(FUZZ_BUILD)/seeds
	$(FUZZ_BUILD)/gen-seeds $(FUZZ_BUILD)/seeds
	@mkdir -p $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/fuzz-dbox -seed=$(FUZZ_SEED) -max_total_time=$(FUZZ_TIME) -max_len=65536 -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/ \
		$(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/seeds

# --- benchmarks --------------------------------------------------------------

# What the benchmarks drive besides the test packages (tools/bench/).
BENCH_DEBS := python3 gnuplot-nox dovecot-imapd neomutt bsdutils procps findutils

bench-deps:
	@tools/install-deps $(TEST_DEBS) $(BENCH_DEBS)

# The FUSE floor the write rows are measured against: libfuse's own
# passthrough_ll, built from the source libfuse3-dev ships (not kept here).
FUSE_EXAMPLES := /usr/share/doc/libfuse3-dev/examples
$(BUILD)/passthrough_ll: $(FUSE_EXAMPLES)/passthrough_ll.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -g -Wall $(shell pkg-config --cflags fuse3) -I$(FUSE_EXAMPLES) \
		-o $@ $< $(shell pkg-config --libs fuse3)

# Counts the SQL statements of the daemon for the counts benchmark.
$(BUILD)/sqlcount.so: tools/bench/sqlcount.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -g -Wall -Wextra -fPIC -shared -o $@ $< -ldl

BENCH_BIN := all $(BUILD)/passthrough_ll $(BUILD)/sqlcount.so

# Full run (about 25 minutes here) and a quick one (under 5): both write
# bench/results.md, bench/results.png and bench/results.json.
bench: bench-deps $(BENCH_BIN)
	/usr/bin/python3 tools/bench/bench.py $(BENCH_ARGS)

bench-quick: bench-deps $(BENCH_BIN)
	/usr/bin/python3 tools/bench/bench.py --quick $(BENCH_ARGS)

# Only the write rows with the floor, and the request and syscall counts:
# small sizes, 5 repeats (a few minutes); bench/tmp/results-only.md.
bench-writes: bench-deps $(BENCH_BIN)
	/usr/bin/python3 tools/bench/bench.py --quick --repeats 5 \
		--only counts,delivery,renames,imap,hcache $(BENCH_ARGS)

# --- demo --------------------------------------------------------------------

demo-deps:
	@tools/install-deps $(DEMO_DEBS)

demo: demo-deps
	$(MAKE) all
	@tools/demo $(abspath $(BUILD))

# --- install -----------------------------------------------------------------

# GNU directory variables; PREFIX (the usual spelling) sets prefix.  dboxadm
# goes to bin, not sbin: users run it on their own stores, without root.
PREFIX      ?= /usr/local
prefix      ?= $(PREFIX)
exec_prefix ?= $(prefix)
bindir      ?= $(exec_prefix)/bin
datarootdir ?= $(prefix)/share
mandir      ?= $(datarootdir)/man
man1dir     ?= $(mandir)/man1
man8dir     ?= $(mandir)/man8
INSTALL         ?= install
INSTALL_PROGRAM ?= $(INSTALL)
INSTALL_DATA    ?= $(INSTALL) -m 644

# The install tests lint the man pages (groff) and verify the systemd
# units of docs/administration.md (systemd-analyze).
TEST_DEBS += groff-base systemd

install: all
	$(INSTALL) -d $(DESTDIR)$(bindir) $(DESTDIR)$(man1dir) $(DESTDIR)$(man8dir)
	$(INSTALL_PROGRAM) $(BUILD)/dboxfs $(BUILD)/dboxadm $(DESTDIR)$(bindir)/
	$(INSTALL_DATA) man/dboxfs.1 $(DESTDIR)$(man1dir)/
	$(INSTALL_DATA) man/dboxadm.8 $(DESTDIR)$(man8dir)/

install-strip:
	$(MAKE) INSTALL_PROGRAM='$(INSTALL_PROGRAM) -s' install

uninstall:
	rm -f $(DESTDIR)$(bindir)/dboxfs $(DESTDIR)$(bindir)/dboxadm \
	      $(DESTDIR)$(man1dir)/dboxfs.1 $(DESTDIR)$(man8dir)/dboxadm.8

.PHONY: install install-strip uninstall

clean:
	rm -rf build build-asan build-tsan build-fuzz

.PHONY: all deps demo-deps unit mounted check check-asan check-tsan fuzz demo clean \
        bench bench-deps bench-quick bench-writes
