// A reply builder for hiredis's reader that keeps every reply flat: one array of nodes and one byte buffer,
// both reused from reply to reply, instead of a tree of redisReply objects (two allocations per element).
//
// hiredis parses a reply depth first and calls the builder once per element, an aggregate before its elements,
// so the nodes come in that order: an array node is followed by its `count` elements (each of them with its own
// elements when it is an array). The builder's return value only has to be non-NULL (NULL means out of memory).
#ifndef CHERALD_RESP_H
#define CHERALD_RESP_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

/// One element of a reply.
typedef struct herald_resp_node {
    /// REDIS_REPLY_STRING, _ARRAY, _INTEGER, _NIL, _STATUS, _ERROR, _DOUBLE, _BOOL, _MAP, _SET, _PUSH,
    /// _ATTR, _BIGNUM or _VERB.
    int32_t type;
    int32_t reserved;
    /// An integer's value, a bool's 0 or 1, an aggregate's element count (a map's: keys and values).
    int64_t integer;
    /// A string-like element's bytes: `length` bytes at `offset` in the reply's byte buffer.
    size_t offset;
    size_t length;
} herald_resp_node;

/// The reply being read, or the one read last. `herald_resp_reset` empties it before the next reply is read.
typedef struct herald_resp_reply {
    herald_resp_node *nodes;
    size_t count;
    size_t node_capacity;
    char *bytes;
    size_t used;
    size_t byte_capacity;
} herald_resp_reply;

/// A reply buffer with no storage yet (it grows as replies need; NULL when out of memory).
herald_resp_reply *herald_resp_reply_create(void);
void herald_resp_reply_free(herald_resp_reply *reply);
/// Forgets the last reply, keeping the storage. Call it before reading the next reply, never while one is
/// half read (its first elements are already in the buffer then).
void herald_resp_reset(herald_resp_reply *reply);
/// Makes `context`'s reader build every reply into `reply` (which must outlive the context). The
/// pointer hiredis hands back for a complete reply is then `reply` itself, and must not go to freeReplyObject.
void herald_resp_install(redisContext *context, herald_resp_reply *reply);

#endif
