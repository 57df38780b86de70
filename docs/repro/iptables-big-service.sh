#!/bin/bash
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
KPX=$1; N=$2
NS=kpxbig-$$
D=$(mktemp -d)
mkdir -p $D/m
ip netns add $NS
trap 'kill -9 $(jobs -p) 2>/dev/null; ip netns del $NS; rm -rf $D' EXIT
ip netns exec $NS ip link set lo up
python3 "$HERE/gen-big-service.py" $N > $D/m/big.yaml
web() { cat > $D/m/.web.tmp <<Y
apiVersion: v1
kind: Service
metadata: {name: web, namespace: test}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: tcp, port: 80, targetPort: 8080, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: test
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: tcp, port: 8080, protocol: TCP}
endpoints:
Y
for ip in "$@"; do printf -- "- addresses: [%s]\n  conditions: {ready: true}\n" $ip >> $D/m/.web.tmp; done
mv $D/m/.web.tmp $D/m/web.yaml; }
web 10.0.0.2
KPX_LOG=info,kpx::kernel::iptables=trace ip netns exec $NS $KPX --manifests $D/m --hostname-override node --cluster-cidr 10.244.0.0/16 --plugin-cache-dir ${KPX_PLUGIN_CACHE:-$HERE/../../target/tmp/plugin-cache} --proxy-mode iptables --iptables-sync-period 1h > $D/log 2>&1 &
for i in $(seq 6000); do grep -q "synced rules family=IPv4" $D/log && break; sleep 0.1; done
sleep 3
for k in 1 2 3 4; do
  if [ $((k%2)) = 1 ]; then web 10.0.0.2 10.0.0.3; else web 10.0.0.2; fi
  sleep 3
done
kill -9 $(jobs -p); sleep 1
ip netns exec $NS iptables-save -t nat > $D/nat.txt; cp $D/nat.txt "${NAT_OUT:-/tmp/nat-kpx.txt}"; wc -l $D/nat.txt; grep -c "^:" $D/nat.txt
ip netns exec $NS iptables-save -t filter | wc -l
P1="*nat
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER - [0:0]
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER
-A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 10.200.0.2:80
COMMIT"
for r in 1 2 3; do t=$(date +%s.%N); echo "$P1" | ip netns exec $NS iptables-restore --noflush || echo FAIL; echo "P1 $(echo "$(date +%s.%N)-$t"|bc)"; done
for r in 1 2 3; do t=$(date +%s.%N); printf "*filter\nCOMMIT\n%s\n" "$P1" | ip netns exec $NS iptables-restore --noflush || echo FAIL; echo "P1+filter $(echo "$(date +%s.%N)-$t"|bc)"; done
grep -m3 "KUBE-SEP-" $D/nat.txt | tail -2; grep "^-A KUBE-SEP" $D/nat.txt | head -3; grep -c "^-A" $D/nat.txt
grep "synced rules family=IPv4" $D/log | sed 's/.*full=/full=/' | cut -c1-200
grep -n "iptables-restore" $D/log | tail -3 | cut -c1-300

