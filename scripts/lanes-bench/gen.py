import json, os, sys, time
OUT = os.environ.get("LANES_BENCH_OUT", "run/lanes-bench")
os.makedirs(OUT, exist_ok=True)
members = int(sys.argv[1]); events = int(sys.argv[2]); tag = sys.argv[3]
users = {"bs": {"devices": []}, "cs": {"devices": []},
         "cr": {"devices": [{"token": "ca11" + "0"*60, "registered_at": 1700000000000}]},
         "dr": {"devices": [{"token": "d0d0" + "0"*60, "registered_at": 1700000000000}]}}
names = []
for i in range(members):
    u = f"b{i}"; names.append(u)
    users[u] = {"devices": [{"token": f"{i:04x}" + "b"*60, "registered_at": 1700000000000}]}
fixture = {"users": users, "conversations": {"big": {"members": ["bs"] + names}, "dm1": {"members": ["cs", "cr"]},
                                             "dm2": {"members": ["cs", "dr"]}}}
json.dump(fixture, open(OUT + "/state.json", "w"))
now = int(time.time() * 1000)
with open(f"{OUT}/backlog-{tag}.jsonl", "w") as f:
    for n in range(events):
        f.write(json.dumps({"event_id": f"bk-{tag}-{n}", "app_id": "app1", "kind": "message", "created_at": now,
                            "sender": {"id": "bs", "name": "Bulk"}, "conversation": {"id": "big", "type": "group", "name": "Big"},
                            "message": {"id": f"m{n}", "type": "text", "text": f"backlog {n}"}}) + "\n")
