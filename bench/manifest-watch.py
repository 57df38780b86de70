#!/usr/bin/env python3
"""The manifest source at scale: N manifest files of one Service and one
EndpointSlice each; kpx (as root, in a throwaway network namespace) reads
them, then idles for 10 s (CPU from /proc/PID/stat), then five files are
edited by rename and each edit is timed to kpx's next IPv4 sync.

    python3 bench/manifest-watch.py [KPX] [MODE] [FILES]
    (defaults: target/release/kpx nftables 10000)
"""
import os, subprocess, sys, tempfile, time

kpx = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/kpx")
mode = sys.argv[2] if len(sys.argv) > 2 else "nftables"
n = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
work = tempfile.mkdtemp(prefix="kpx-manifest-watch-")
files = os.path.join(work, "files")
os.mkdir(files)
for i in range(n):
    a, b = divmod(i, 250)
    with open(f"{files}/svc-{i}.yaml", "w") as f:
        f.write(f"""apiVersion: v1
kind: Service
metadata: {{name: svc-{i}, namespace: bench}}
spec:
  clusterIP: 10.96.{a}.{b + 1}
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
- addresses: [10.{128 + a // 100}.{a % 100}.{b + 1}]
""")
ns = f"kpx-mw-{os.getpid()}"
logname = os.path.join(work, "kpx.log")
subprocess.run(["ip", "netns", "add", ns], check=True)
p = None
try:
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
    t0 = time.time()
    p = subprocess.Popen(["ip", "netns", "exec", ns, kpx, "--manifests", files, "--hostname-override", "node",
                          "--proxy-mode", mode, "--plugin-cache-dir", os.path.join(work, "cache"),
                          "--healthz-bind-address=", "--metrics-bind-address="],
                         stdout=open(logname, "w"), stderr=subprocess.STDOUT)
    synced = lambda: open(logname).read().count("synced rules family=IPv4")
    while synced() < 1:
        if p.poll() is not None:
            sys.exit("kpx exited:\n" + open(logname).read())
        time.sleep(0.05)
    print(f"{mode}, {n} files: first IPv4 sync {time.time() - t0:.1f} s after start")
    time.sleep(3)

    def cpu():
        f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    c0 = cpu()
    time.sleep(10)
    print(f"{mode}: idle CPU over 10 s: {100 * (cpu() - c0) / 10:.1f}% of a core")
    took = []
    for k in range(5):
        before = synced()
        path = f"{files}/svc-{n // 2 + k}.yaml"
        text = open(path).read().replace("- addresses: [", f"- addresses: [10.250.0.{k + 1}, ")
        open(path + ".tmp", "w").write(text)
        t = time.time()
        os.rename(path + ".tmp", path)
        while synced() <= before:
            time.sleep(0.002)
        took.append(time.time() - t)
        time.sleep(1.5)
    print(f"{mode}: one file edited -> synced: " + ", ".join(f"{x * 1000:.0f} ms" for x in took))
finally:
    if p:
        p.terminate()
        p.wait()
    subprocess.run(["ip", "netns", "del", ns])
    subprocess.run(["rm", "-rf", work])
