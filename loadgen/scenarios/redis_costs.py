#!/usr/bin/python3
"""Redis's own costs for the wspush bus: memory per subscribed topic, per topic with a one-entry
history and per further entry, and CPU per publish (FCALL wspush_publish). Starts its own
redis-server on port 16450. Usage: loadgen/scenarios/redis_costs.py [stream-node-max-bytes]"""
import os
import redis, subprocess, time, sys
port = 16450
node_bytes = sys.argv[1] if len(sys.argv) > 1 else "4096"
p = subprocess.Popen(["redis-server","--port",str(port),"--save","","--appendonly","no","--stream-node-max-bytes",node_bytes], stdout=subprocess.DEVNULL)
time.sleep(0.3)
r = redis.Redis(port=port)
r.function_load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server", "bus", "wspush.lua")).read(), replace=True)
r.hset("wspush:config", mapping={"maxlen": 100, "ttl_ms": 300000})
def used(): return r.info("memory")["used_memory"]
m0 = used()
ps = redis.Redis(port=port).pubsub()
for k in range(0, 19000, 1000):
    ps.subscribe(*[f"wspush:topic:box:{i}" for i in range(k, k+1000)])
while True:
    m = ps.get_message(timeout=0.1)
    if m is None: break
m1 = used()
def cpu():
    i = r.info("cpu"); return i["used_cpu_sys"] + i["used_cpu_user"]
pipe = r.pipeline(transaction=False)
for i in range(19000): pipe.fcall("wspush_publish", 0, f"box:{i}", '{"n":1}')
c0 = cpu(); pipe.execute(); c1 = cpu()
m2 = used()
print(f"redis CPU per publish to a subscribed topic (FCALL wspush_publish, pipelined): {(c1-c0)/19000*1e6:.1f} µs")
for i in range(100): pipe.fcall("wspush_publish", 0, "big", '{"subject":"hello","n":%d}' % i)
pipe.execute()
m3 = used()
for i in range(100, 1100): pipe.fcall("wspush_publish", 0, "big", '{"subject":"hello","n":%d}' % i)
r.hset("wspush:config", "maxlen", 2000)
for i in range(1100, 2100): pipe.fcall("wspush_publish", 0, "big2", '{"subject":"hello","n":%d}' % i)
pipe.execute()
m4 = used()
print(f"stream-node-max-bytes {node_bytes}: per subscribed channel {(m1-m0)/19000:.0f} B; per topic with one 64-B... entry stream {(m2-m1)/19000:.0f} B; per entry (1000 entries in one stream) {(m4-m3)/1000:.1f} B")
p.kill()
