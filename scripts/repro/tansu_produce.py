# Produce N numbered messages at a steady rate; record which ones the broker acknowledged (delivery report without error).
import sys, time, json
from confluent_kafka import Producer
port, topic, n, rate, idem = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
acked, failed = [], {}
p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all", "enable.idempotence": idem,
              "linger.ms": 5, **({} if idem else {"max.in.flight.requests.per.connection": 1}), "message.timeout.ms": 120000, "retry.backoff.ms": 200, "retry.backoff.max.ms": 1000})
errors = []
def dr(err, msg):
    k = msg.key().decode()
    if err is None: acked.append((k, msg.partition(), msg.offset()))
    else: failed[k] = str(err)
start = time.time()
fatal = None
for i in range(n):
  try:
    while True:
        try:
            p.produce(topic, key=f"m{i}", value=f"m{i}", partition=i % 4, on_delivery=dr); break
        except BufferError: p.poll(0.05)
    p.poll(0)
    time.sleep(max(0, start + (i + 1) / rate - time.time()))
  except Exception as e:
    fatal = str(e); break
try: p.flush(30)
except Exception as e: fatal = fatal or str(e)
json.dump({"acked": acked, "failed": failed, "fatal": fatal}, open(sys.argv[6], "w"))
print("acked", len(acked), "failed", len(failed), "first errors", list(failed.items())[:3])
