#!/bin/bash
NS=kpxrp-$$; T=$(mktemp); ip netns add $NS; trap 'ip netns del $NS' EXIT
grep -v "^#" $1 > $T
t=$(date +%s.%N); ip netns exec $NS iptables-restore < $T || echo LOADFAIL; echo "load $(echo "$(date +%s.%N)-$t"|bc)"
P1="*nat
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER - [0:0]
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER
-A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 10.200.0.2:80
COMMIT"
for r in 1 2 3; do t=$(date +%s.%N); echo "$P1" | ip netns exec $NS iptables-restore --noflush || echo FAIL; echo "P1 $(echo "$(date +%s.%N)-$t"|bc)"; done
rm $T
