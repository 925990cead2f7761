# dboxfs: build, test, demo, sanitizer builds.
#
#   make            build dboxfs and dboxadm into build/
#   make check      install test dependencies (Debian, as root), build, run all tests
#   make check-asan the same tests against an ASan+UBSan build (build-asan/)
#   make demo       a sample store mounted on demo/mnt
#   make bench      benchmarks against native maildir (tools/bench/)

CC      ?= cc
BUILD   ?= build
PKGS    := fuse3 sqlite3 zlib uuid
CFLAGS  ?= -O2 -g
override CFLAGS += -std=gnu11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
           $(shell pkg-config --cflags $(PKGS)) -I. -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64
override LDLIBS += $(shell pkg-config --libs $(PKGS)) -lpthread

STORAGE_SRC := $(wildcard storage/*.c)
INDEX_SRC   := $(wildcard index/*.c)
FS_SRC      := $(wildcard fs/*.c)
ADM_SRC     := $(wildcard tools/dboxadm/*.c)
UNIT_SRC    := $(wildcard tests/unit/test-*.c)

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))
LIB_OBJ  := $(call obj,$(STORAGE_SRC) $(INDEX_SRC))
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

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(BUILD)/libdbox.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# --- tests -------------------------------------------------------------------

# Debian packages the tests drive; installed when missing (needs root).
TEST_DEBS := fuse3 libfuse3-dev libsqlite3-dev zlib1g-dev uuid-dev pkg-config \
             libcmocka-dev python3-pytest neomutt rsync sqlite3

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

check-asan: deps
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" unit mounted

# --- benchmarks --------------------------------------------------------------

# What the benchmarks drive besides the test packages (tools/bench/).
BENCH_DEBS := python3 gnuplot-nox dovecot-imapd neomutt bsdutils procps findutils

bench-deps:
	@tools/install-deps $(TEST_DEBS) $(BENCH_DEBS)

# Full run (about 25 minutes here) and a quick one (under 5): both write
# bench/results.md, bench/results.png and bench/results.json.
bench: bench-deps all
	/usr/bin/python3 tools/bench/bench.py $(BENCH_ARGS)

bench-quick: bench-deps all
	/usr/bin/python3 tools/bench/bench.py --quick $(BENCH_ARGS)

# --- demo --------------------------------------------------------------------

demo: deps all
	@tools/demo $(abspath $(BUILD))

clean:
	rm -rf build build-asan

.PHONY: all deps unit mounted check check-asan demo clean bench bench-deps bench-quick
