/*
 * rebuild-match.c: rebuild step 4, first half (engine/rebuild.h): the
 * messages of the old index matched to the whole records the scan found -
 * by location and GUID, else by GUID alone, else (a damaged GUID field)
 * by location - and the messages whose record is still in place but
 * damaged.
 */
#include "engine/rebuild-private.h"
#include "engine/store-layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rebuild_guid_cmp(const char *a, const char *b)
{
	return strncmp(a, b, sizeof(((struct dbox_msgloc *)0)->guid) - 1);
}

void rebuild_loc(uint32_t file_id, uint64_t offset, uint64_t body_size,
		 uint64_t record_size, uint64_t vsize, const char *guid,
		 struct dbox_msgloc *loc_r)
{
	/* The index keeps a GUID's first 32 characters (foreign GUIDs may
	   be longer). */
	size_t len = strnlen(guid, sizeof(loc_r->guid) - 1);

	*loc_r = (struct dbox_msgloc){
		.file_id = file_id, .offset = offset, .body_size = body_size,
		.record_size = record_size, .vsize = vsize,
		.state = DBOX_MSG_COMMITTED,
	};
	memcpy(loc_r->guid, guid, len);
}

/* By GUID; records of one GUID in (file_id, offset) order, which is the
   order of rb->recs. */
static int by_guid_cmp(const void *a, const void *b, void *recs)
{
	size_t i = *(const size_t *)a, j = *(const size_t *)b;
	int c = rebuild_guid_cmp(((const struct rrec *)recs)[i].guid,
				 ((const struct rrec *)recs)[j].guid);

	return c != 0 ? c : (i > j) - (i < j);
}

/* The first record at or after (file_id, offset). */
static size_t rec_lower(const struct rebuild *rb, uint32_t file_id,
			uint64_t offset)
{
	size_t lo = 0, hi = rb->nrecs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct rrec *r = &rb->recs[mid];

		if (r->file_id < file_id ||
		    (r->file_id == file_id && r->offset < offset))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The record at (file_id, offset), or SIZE_MAX. */
static size_t rec_at(const struct rebuild *rb, uint32_t file_id,
		     uint64_t offset)
{
	size_t i = rec_lower(rb, file_id, offset);

	return i < rb->nrecs && rb->recs[i].file_id == file_id &&
		rb->recs[i].offset == offset ? i : SIZE_MAX;
}

/* The first position in by_guid whose GUID is >= guid. */
static size_t guid_lower(const struct rebuild *rb, const char *guid)
{
	size_t lo = 0, hi = rb->nrecs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (rebuild_guid_cmp(rb->recs[rb->by_guid[mid]].guid, guid) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* in as printable ASCII into out (size bytes): other bytes, and '\\',
   as \\xNN, cut short when out is full.  Bytes read from a damaged file
   never reach a terminal raw. */
static void escape_bytes(char *out, size_t size, const char *in)
{
	size_t o = 0;

	for (; *in != '\0' && o + 5 < size; in++) {
		unsigned char c = (unsigned char)*in;

		if (c >= 0x20 && c < 0x7f && c != '\\')
			out[o++] = (char)c;
		else
			o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
	}
	out[o] = '\0';
}

/* Claim record r for old message i. */
static void claim(struct rebuild *rb, size_t i, size_t r)
{
	size_t n = rebuild_old_inode(rb, rb->old->msgs[i].ino);

	rb->recs[r].claimed = true;
	rb->recs[r].live = n != SIZE_MAX && rb->old->inodes[n].nlink > 0;
	rb->msg_rec[i] = r;
}

/* Old message i by GUID alone: the first unclaimed record of its GUID. */
static void match_guid(struct rebuild *rb, size_t i)
{
	const struct dbox_salvage_msg *m = &rb->old->msgs[i];

	for (size_t p = guid_lower(rb, m->guid); p < rb->nrecs; p++) {
		size_t r = rb->by_guid[p];

		if (rebuild_guid_cmp(rb->recs[r].guid, m->guid) != 0)
			break;
		if (!rb->recs[r].claimed) {
			claim(rb, i, r);
			break;
		}
	}
}

/* A whole record still at the old location of message i whose GUID
   differs: the GUID field is damaged (a committed record never moves and
   its bytes are never reused), not another message. */
static void match_damaged_guid(struct rebuild *rb, size_t i)
{
	const struct dbox_salvage_msg *m = &rb->old->msgs[i];
	size_t r = rec_at(rb, m->file_id, m->offset);
	char shown[2 * sizeof(rb->recs[0].guid) * 4], had[sizeof(shown)];

	if (r == SIZE_MAX || rb->recs[r].claimed)
		return;
	claim(rb, i, r);
	escape_bytes(shown, sizeof(shown), rb->recs[r].guid);
	escape_bytes(had, sizeof(had), m->guid);
	rebuild_note(rb, DBOX_REBUILD_NOTE_DAMAGED_FIELD, m->file_id, m->offset,
		     "damaged GUID field", DBOX_STORE_STORAGE "/m.%u offset %llu: damaged "
		     "GUID field (the index had '%s', the record says '%s'); "
		     "the message keeps its names", m->file_id,
		     (unsigned long long)m->offset, had, shown);
	rb->rep->damaged_kept++;
}

int rebuild_match_old(struct rebuild *rb)
{
	const struct dbox_salvage *old = rb->old;

	rb->by_guid = malloc((rb->nrecs + 1) * sizeof(*rb->by_guid));
	rb->msg_rec = malloc((old->nmsgs + 1) * sizeof(*rb->msg_rec));
	if (rb->by_guid == NULL || rb->msg_rec == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < rb->nrecs; i++)
		rb->by_guid[i] = i;
	if (rb->nrecs > 1)
		qsort_r(rb->by_guid, rb->nrecs, sizeof(*rb->by_guid),
			by_guid_cmp, rb->recs);
	/* Exact locations first, so a GUID-only match cannot take a
	   record another message sits on. */
	for (size_t i = 0; i < old->nmsgs; i++) {
		const struct dbox_salvage_msg *m = &old->msgs[i];
		size_t r = rec_at(rb, m->file_id, m->offset);

		rb->msg_rec[i] = SIZE_MAX;
		if (m->state == DBOX_MSG_COMMITTED && r != SIZE_MAX &&
		    !rb->recs[r].claimed &&
		    rebuild_guid_cmp(rb->recs[r].guid, m->guid) == 0)
			claim(rb, i, r);
	}
	for (size_t i = 0; i < old->nmsgs; i++)
		if (rb->msg_rec[i] == SIZE_MAX &&
		    old->msgs[i].state == DBOX_MSG_COMMITTED &&
		    old->msgs[i].guid[0] != '\0')
			match_guid(rb, i);
	for (size_t i = 0; i < old->nmsgs; i++)
		if (rb->msg_rec[i] == SIZE_MAX &&
		    old->msgs[i].state == DBOX_MSG_COMMITTED)
			match_damaged_guid(rb, i);
	return 0;
}

/* Does a whole record the scan found in m.N file_id overlap the bytes
   [start, end)? */
static bool overlaps_scanned(const struct rebuild *rb, uint32_t file_id,
			     uint64_t start, uint64_t end)
{
	size_t lo = rec_lower(rb, file_id, start);

	if (lo > 0 && rb->recs[lo - 1].file_id == file_id &&
	    rb->recs[lo - 1].offset + rb->recs[lo - 1].record_size > start)
		return true;
	return lo < rb->nrecs && rb->recs[lo].file_id == file_id &&
		rb->recs[lo].offset < end;
}

/* Is the record of old message m still in its m.N, whole in length at
   the location the old index gives, but damaged (its message header or
   its metadata block, so no scan finds it whole), with no whole record
   of the scan on its bytes?  A committed record never moves and its bytes
   are never reused, so those bytes are still that message: it keeps its
   names and location, reads fail with EIO (and check reports it) until
   the record is repaired, but no purge drops it. */
bool rebuild_damaged_in_place(struct rebuild *rb,
			      const struct dbox_salvage_msg *m)
{
	const char *field;
	bool header_ok = false;

	if (m->state != DBOX_MSG_COMMITTED || m->record_size <
	    DBOX_MSG_HEADER_SIZE + m->body_size ||
	    m->offset + m->record_size < m->offset ||
	    overlaps_scanned(rb, m->file_id, m->offset,
			     m->offset + m->record_size) ||
	    rebuild_record_in_place(rb, m, &header_ok) <= 0)
		return false;
	field = header_ok ? "metadata block (message header intact)" :
		"message header";
	rebuild_note(rb, DBOX_REBUILD_NOTE_DAMAGED_FIELD, m->file_id, m->offset,
		     header_ok ? "damaged metadata block" :
		     "damaged message header", DBOX_STORE_STORAGE "/m.%u offset %llu: "
		     "damaged %s (size and location as the index had them); "
		     "the message keeps its names and reads fail with EIO "
		     "until it is repaired", m->file_id,
		     (unsigned long long)m->offset, field);
	return true;
}
