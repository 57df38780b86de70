#!/bin/bash
set -u
T=$(mktemp)
NS=kpxipt-$$
ip netns add $NS; trap 'ip netns del $NS' EXIT
N=${1:-100000}
python3 - $N > $T <<'PY'
import sys
n=int(sys.argv[1])
out=["*nat",":KUBE-MARK-MASQ - [0:0]",":KUBE-SERVICES - [0:0]",":KUBE-SVC-BIG - [0:0]",":KUBE-SVC-OTHER - [0:0]",":KUBE-SEP-OTHER - [0:0]"]
for i in range(n): out.append(":KUBE-SEP-%06d - [0:0]"%i)
out.append("-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BIG")
out.append("-A KUBE-SERVICES -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-OTHER")
for i in range(n):
    out.append("-A KUBE-SVC-BIG -m comment --comment \"default/big:http -> 10.%d.%d.%d:80\" -m statistic"%((i>>16)&255,(i>>8)&255,i&255) + "  --mode random --probability 0.00001000000 -j KUBE-SEP-%06d"%i)
    out.append("-A KUBE-SEP-%06d -m comment --comment default/big:http -s 10.%d.%d.%d/32 -j KUBE-MARK-MASQ"%(i,(i>>16)&255,(i>>8)&255,i&255))
    out.append("-A KUBE-SEP-%06d -m comment --comment default/big:http -p tcp -m tcp -j DNAT --to-destination 10.%d.%d.%d:80"%(i,(i>>16)&255,(i>>8)&255,i&255))
out.append("-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER")
out.append("-A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 10.200.0.1:80")
out.append("COMMIT")
print("\n".join(out))
PY
t=$(date +%s.%N); ip netns exec $NS iptables-restore < $T; echo "load $(echo "$(date +%s.%N)-$t"|bc)"
P1="*nat
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER - [0:0]
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER
-A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 10.200.0.2:80
COMMIT"
P2="*nat
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER - [0:0]
-D KUBE-SERVICES -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-OTHER
-I KUBE-SERVICES 2 -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-OTHER
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER
-A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 10.200.0.3:80
COMMIT"
P3="*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER - [0:0]
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BIG
-A KUBE-SERVICES -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-OTHER
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER
-A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 10.200.0.3:80
COMMIT"
P4="*nat
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER2 - [0:0]
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER2
-A KUBE-SEP-OTHER2 -p tcp -m tcp -j DNAT --to-destination 10.200.0.3:80
-X KUBE-SEP-OTHER
COMMIT"
P5="*nat
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER - [0:0]
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER
-A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 10.200.0.3:80
-X KUBE-SEP-OTHER2
COMMIT"
for args in "--noflush" "--noflush --counters" "-w 5 -W 100000 --noflush" "-w 5 -W 100000 --noflush --counters"; do
  for r in 1 2 3; do
    t=$(date +%s.%N); echo "$P1" | ip netns exec $NS iptables-restore $args || echo FAIL; echo "[$args] $(echo "$(date +%s.%N)-$t"|bc)"
  done
done
