#!/bin/bash
# usage: run.sh KPX_BINARY N_ENDPOINTS
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
KPX=$1; N=$2
NS=kpxrs-$$
D=$(mktemp -d)
mkdir -p $D/m
ip netns add $NS
trap 'kill -9 $(jobs -p) 2>/dev/null; ip netns del $NS; rm -rf $D' EXIT
ip netns exec $NS ip link set lo up
python3 "$HERE/gen-big-service.py" $N > $D/m/big.yaml
run() {
  ip netns exec $NS $KPX --manifests $D/m --hostname-override node --cluster-cidr 10.244.0.0/16 --plugin-cache-dir ${KPX_PLUGIN_CACHE:-$HERE/../../target/tmp/plugin-cache} --proxy-mode iptables > $D/$1.log 2>&1 &
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
