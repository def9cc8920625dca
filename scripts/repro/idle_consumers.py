#!/usr/bin/env python3
"""A broker's CPU while consumers wait on it with nothing to read.

CONSUMERS consumers, each in a group of its own (as each stage lane is), subscribe to TOPIC with fetch.wait.max.ms
as given and fetch.min.bytes 1, and poll; once every one has its assignment and 5 s passed, the broker process's
user + system CPU time (/proc/PID/stat) is read before and after SECONDS and printed as a share of one core.

  python idle_consumers.py BOOTSTRAP TOPIC CONSUMERS FETCH_WAIT_MS SECONDS BROKER_PID
"""
import os, sys, threading, time, uuid
from confluent_kafka import Consumer

bootstrap, topic, n, wait_ms, seconds, pid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    float(sys.argv[5]), int(sys.argv[6])
stop, ready = threading.Event(), []


def member(i):
    got = []
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"idle-{uuid.uuid4().hex[:6]}-{i}",
                  "fetch.wait.max.ms": wait_ms, "fetch.min.bytes": 1, "session.timeout.ms": 6000,
                  "partition.assignment.strategy": "range,roundrobin"})
    c.subscribe([topic], on_assign=lambda consumer, parts: got.append(1) or ready.append(i))
    while not stop.is_set():
        c.poll(0.2)
    c.close()


def cpu_seconds():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


threads = [threading.Thread(target=member, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
deadline = time.time() + 60
while len(ready) < n and time.time() < deadline:
    time.sleep(0.1)
time.sleep(5)
before, t0 = cpu_seconds(), time.time()
time.sleep(seconds)
used, elapsed = cpu_seconds() - before, time.time() - t0
stop.set()
for t in threads:
    t.join()
print(f"consumers={n} assigned={len(set(ready))} fetch.wait.max.ms={wait_ms}: broker CPU {used:.2f} s in "
      f"{elapsed:.0f} s = {100 * used / elapsed:.1f} % of a core")
