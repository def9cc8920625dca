#include "CHeraldRESP.h"

#include <stdlib.h>
#include <string.h>

herald_resp_reply *herald_resp_reply_create(void) { return calloc(1, sizeof(herald_resp_reply)); }

void herald_resp_reply_free(herald_resp_reply *reply) {
    if (reply == NULL) return;
    free(reply->nodes);
    free(reply->bytes);
    free(reply);
}

void herald_resp_reset(herald_resp_reply *reply) {
    reply->count = 0;
    reply->used = 0;
}

/// The next node, the node array grown (doubled) when full; NULL when out of memory.
static herald_resp_node *next_node(herald_resp_reply *reply, int type) {
    if (reply->count == reply->node_capacity) {
        size_t capacity = reply->node_capacity < 16 ? 16 : reply->node_capacity * 2;
        herald_resp_node *grown = realloc(reply->nodes, capacity * sizeof(herald_resp_node));
        if (grown == NULL) return NULL;
        reply->nodes = grown;
        reply->node_capacity = capacity;
    }
    herald_resp_node *node = &reply->nodes[reply->count++];
    node->type = type;
    node->reserved = 0;
    node->integer = 0;
    node->offset = 0;
    node->length = 0;
    return node;
}

/// Copies `length` bytes into the byte buffer (grown, doubled, when needed); 0 when out of memory.
static int append_bytes(herald_resp_reply *reply, herald_resp_node *node, const char *bytes, size_t length) {
    if (reply->byte_capacity - reply->used < length) {
        size_t capacity = reply->byte_capacity < 256 ? 256 : reply->byte_capacity;
        while (capacity - reply->used < length) capacity *= 2;
        char *grown = realloc(reply->bytes, capacity);
        if (grown == NULL) return 0;
        reply->bytes = grown;
        reply->byte_capacity = capacity;
    }
    node->offset = reply->used;
    node->length = length;
    if (length > 0) memcpy(reply->bytes + reply->used, bytes, length);
    reply->used += length;
    return 1;
}

static void *create_string(const redisReadTask *task, char *bytes, size_t length) {
    herald_resp_reply *reply = task->privdata;
    herald_resp_node *node = next_node(reply, task->type);
    if (node == NULL || !append_bytes(reply, node, bytes, length)) return NULL;
    return reply;
}

static void *create_array(const redisReadTask *task, size_t elements) {
    herald_resp_reply *reply = task->privdata;
    herald_resp_node *node = next_node(reply, task->type);
    if (node == NULL) return NULL;
    node->integer = (int64_t)elements;
    return reply;
}

static void *create_integer(const redisReadTask *task, long long value) {
    herald_resp_reply *reply = task->privdata;
    herald_resp_node *node = next_node(reply, REDIS_REPLY_INTEGER);
    if (node == NULL) return NULL;
    node->integer = value;
    return reply;
}

static void *create_double(const redisReadTask *task, double value, char *text, size_t length) {
    (void)value;
    herald_resp_reply *reply = task->privdata;
    herald_resp_node *node = next_node(reply, REDIS_REPLY_DOUBLE);
    if (node == NULL || !append_bytes(reply, node, text, length)) return NULL;
    return reply;
}

static void *create_nil(const redisReadTask *task) {
    herald_resp_reply *reply = task->privdata;
    return next_node(reply, REDIS_REPLY_NIL) == NULL ? NULL : reply;
}

static void *create_bool(const redisReadTask *task, int value) {
    herald_resp_reply *reply = task->privdata;
    herald_resp_node *node = next_node(reply, REDIS_REPLY_BOOL);
    if (node == NULL) return NULL;
    node->integer = value != 0;
    return reply;
}

/// The reply's storage belongs to its owner, not to hiredis: nothing to free.
static void free_object(void *object) { (void)object; }

static redisReplyObjectFunctions flat_functions = {
    create_string, create_array, create_integer, create_double, create_nil, create_bool, free_object,
};

void herald_resp_install(redisContext *context, herald_resp_reply *reply) {
    herald_resp_reset(reply);
    context->reader->fn = &flat_functions;
    context->reader->privdata = reply;
    // hiredis's default push handler would read the reply as a redisReply. Herald speaks RESP2, where no push
    // reply comes, so there is no handler at all.
    redisSetPushCallback(context, NULL);
}
