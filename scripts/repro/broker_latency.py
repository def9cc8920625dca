#!/usr/bin/env python3
"""Round trip of one record, produce -> consume through a consumer group, on an idle Kafka-compatible broker.

One consumer (its own new group, fetch.wait.max.ms as given, fetch.min.bytes 1) joins and catches up; then one
record at a time is produced (linger.ms 0, acks all) at a random moment 50-150 ms after the previous one arrived, and
the time from produce() to the consumer's poll() returning it is recorded. The broker is idle between records, so
this is what the first record after a quiet spell costs at one hop.

  python broker_latency.py BOOTSTRAP TOPIC FETCH_WAIT_MS [COUNT=200]
"""
import random, statistics, sys, time, uuid
from confluent_kafka import Consumer, Producer

bootstrap, topic, wait_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
count = int(sys.argv[4]) if len(sys.argv) > 4 else 200
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "latency-" + uuid.uuid4().hex[:6],
                     "auto.offset.reset": "latest", "fetch.wait.max.ms": wait_ms, "fetch.min.bytes": 1,
                     "session.timeout.ms": 6000, "partition.assignment.strategy": "range,roundrobin"})
assigned = []
consumer.subscribe([topic], on_assign=lambda c, parts: assigned.extend(parts))
producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
joining = time.time()
while not assigned and time.time() < joining + 60:
    consumer.poll(0.1)
if not assigned:
    sys.exit("no assignment within 60 s")
joined = time.time() - joining
# Caught up: nothing arrives for a second.
while consumer.poll(1.0) is not None:
    pass
samples = []
for i in range(count):
    time.sleep(random.uniform(0.05, 0.15))
    sent = time.perf_counter()
    producer.produce(topic, key=str(i), value=str(i))
    producer.poll(0)
    while True:
        m = consumer.poll(1.0)
        producer.poll(0)
        if m is not None and not m.error() and m.value() == str(i).encode():
            samples.append((time.perf_counter() - sent) * 1000)
            break
        if time.perf_counter() - sent > 10:
            sys.exit(f"record {i} not consumed within 10 s")
producer.flush(5)
consumer.close()
q = statistics.quantiles(samples, n=100)
print(f"joined in {joined:.1f} s; fetch.wait.max.ms={wait_ms} records={len(samples)} ms: min {min(samples):.1f} p50 {q[49]:.1f} "
      f"p90 {q[89]:.1f} p99 {q[98]:.1f} max {max(samples):.1f} mean {statistics.mean(samples):.1f}")
