# Writes the call and DM events with created_at = now (ms).
import json, os, sys, time
OUT = os.environ.get("LANES_BENCH_OUT", "run/lanes-bench")
tag = sys.argv[1]; kind = sys.argv[2]; n = sys.argv[3]
now = int(time.time() * 1000)
if kind == "call":
    e = {"event_id": f"call-{tag}-{n}", "app_id": "app1", "kind": "call", "created_at": now, "sender": {"id": "cs", "name": "Caller"},
         "conversation": {"id": "dm1", "type": "direct"}, "call": {"action": "initiated", "session_id": f"s-{tag}-{n}", "type": "video"}}
else:
    e = {"event_id": f"dm-{tag}-{n}", "app_id": "app1", "kind": "message", "created_at": now, "sender": {"id": "cs", "name": "Caller"},
         "conversation": {"id": "dm2", "type": "direct"}, "message": {"id": f"dm{n}", "type": "text", "text": "hi"}}
print(json.dumps(e))
open(f"{OUT}/probes-{tag}.tsv", "a").write(f"{kind} {now}\n")
