import sys, json
from confluent_kafka import Consumer, TopicPartition
port, topic, out = sys.argv[1], sys.argv[2], sys.argv[3]
c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "x", "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True})
parts = [TopicPartition(topic, p, 0) for p in range(4)]
c.assign(parts)
seen, eof = [], set()
while len(eof) < 4:
    m = c.poll(5)
    if m is None: break
    if m.error():
        if m.error().code() == -191: eof.add(m.partition()); continue
        print("err", m.error()); continue
    seen.append((m.key().decode(), m.partition(), m.offset()))
json.dump(seen, open(out, "w"))
for p in range(4):
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
    print("partition", p, "low", lo, "high", hi)
print("consumed", len(seen))
