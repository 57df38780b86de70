#!/bin/bash
# usage: run.sh KPX_BINARY N_ENDPOINTS
set -u
KPX=$1; N=$2
NS=kpxrs-$$
D=/tmp/kpxrs/$$
mkdir -p $D/m
ip netns add $NS
trap 'kill -9 $(jobs -p) 2>/dev/null; ip netns del $NS; rm -rf $D' EXIT
ip netns exec $NS ip link set lo up
python3 - $N > $D/m/big.yaml <<'PY'
import sys
n=int(sys.argv[1])
out=["apiVersion: v1\nkind: Service\nmetadata: {name: big, namespace: big}\nspec:\n  clusterIP: 10.96.5.5\n  ports:\n  - {name: tcp, port: 80, targetPort: 8080, protocol: TCP}\n"]
for i,start in enumerate(range(0,n,100)):
    s="---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: big-%d\n  namespace: big\n  labels: {kubernetes.io/service-name: big}\naddressType: IPv4\nports:\n- {name: tcp, port: 8080, protocol: TCP}\nendpoints:\n"%i
    for k in range(start,min(start+100,n)):
        s+="- addresses: [10.%d.%d.%d]\n  conditions: {ready: true}\n"%(128+k//65536,(k//256)%256,k%256)
    out.append(s)
print("".join(out))
PY
run() {
  ip netns exec $NS $KPX --manifests $D/m --hostname-override node --cluster-cidr 10.244.0.0/16 --plugin-cache-dir /work/main/target/tmp/plugin-cache --proxy-mode iptables > $D/$1.log 2>&1 &
  PID=$!
  start=$(date +%s.%N)
  for i in $(seq 6000); do grep -q "synced rules family=IPv4" $D/$1.log && break; sleep 0.1; done
  echo "$1: first sync after $(echo "$(date +%s.%N)-$start"|bc) s: $(grep -m1 'synced rules family=IPv4' $D/$1.log | grep -o 'full=[a-z]* .*kernel_ms=[0-9.]*')"
}
run start
kill -9 $PID; sleep 1
run restart
grep -i "leaves own chains" $D/restart.log | head -2
kill -9 $PID
