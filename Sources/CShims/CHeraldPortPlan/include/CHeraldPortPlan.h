// A port plan for the binds of librdkafka's mock cluster. librdkafka 2.8 binds each mock broker's listener to
// 127.0.0.1 port 0 (a port the kernel picks; rd_kafka_mock_broker_new_listener in src/rdkafka_mock.c) and offers no
// way to choose it. This target defines bind(2) in the executable that links it: while a plan is armed, an AF_INET
// bind to port 0 is given the plan's next port instead; every other bind goes unchanged to the C library's bind
// (dlsym(RTLD_NEXT, "bind")). librdkafka's calls to bind reach this definition because the dynamic linker binds a
// shared library's undefined `bind` to the executable's exported one first.
#ifndef CHERALD_PORT_PLAN_H
#define CHERALD_PORT_PLAN_H

#include <stdint.h>

/// Arms the plan: the next `count` (at most 64) AF_INET binds to port 0 in this process get `ports[0]`,
/// `ports[1]`, ... in that order. Returns 0, or -1 when `count` is out of range.
int herald_port_plan_arm(const uint16_t *ports, int count);

/// Disarms the plan and returns how many of its ports were handed to binds.
int herald_port_plan_disarm(void);

/// How many calls this process made to bind(2) through the interposed definition since it started; 0 after a
/// bind means the definition is not the one the caller reached.
long herald_port_plan_binds_seen(void);

#endif
