#!/bin/bash
# Why one big Service slows every other Service's change in iptables mode
# (iptables-nft): each nf_tables commit that adds a rule with a jump or a
# NAT target validates every rule reachable from the table's base chains.
# Loads a nat table shaped like kube-proxy's (a KUBE-SVC chain of N
# statistic jumps, a KUBE-SEP chain per endpoint with a masquerade jump and
# a DNAT) into a scratch namespace, twice: without and with PREROUTING and
# OUTPUT jumping to KUBE-SERVICES; then times a tiny iptables-restore
# --noflush of another Service's two chains, three times each.
# Usage: iptables-validate.sh [N]   (default 100000; kpx's bound is 5000)
set -u
N=${1:-100000}
gen() { python3 - "$N" "$1" <<'PY'
import sys
n, hooked = int(sys.argv[1]), sys.argv[2] == "hooked"
ip = lambda i: "10.%d.%d.%d" % (128 + (i >> 16), (i >> 8) & 255, i & 255)
out = ["*nat", ":KUBE-MARK-MASQ - [0:0]", ":KUBE-SERVICES - [0:0]", ":KUBE-SVC-BIG - [0:0]", ":KUBE-SVC-OTHER - [0:0]", ":KUBE-SEP-OTHER - [0:0]"]
out += [":KUBE-SEP-%06d - [0:0]" % i for i in range(n)]
if hooked:
    out += ["-A PREROUTING -j KUBE-SERVICES", "-A OUTPUT -j KUBE-SERVICES"]
out.append("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000")
out.append("-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BIG")
out.append("-A KUBE-SERVICES -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-OTHER")
for i in range(n):
    if i < n - 1:
        out.append("-A KUBE-SVC-BIG -m statistic --mode random --probability %.11f -j KUBE-SEP-%06d" % (1.0 / (n - i), i))
    else:
        out.append("-A KUBE-SVC-BIG -j KUBE-SEP-%06d" % i)
    out.append("-A KUBE-SEP-%06d -s %s/32 -j KUBE-MARK-MASQ" % (i, ip(i)))
    out.append("-A KUBE-SEP-%06d -p tcp -j DNAT --to-destination %s:8080" % (i, ip(i)))
out += ["-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER", "-A KUBE-SEP-OTHER -p tcp -j DNAT --to-destination 10.200.0.1:80", "COMMIT"]
print("\n".join(out))
PY
}
SMALL="*nat
:KUBE-SVC-OTHER - [0:0]
:KUBE-SEP-OTHER - [0:0]
-A KUBE-SVC-OTHER -j KUBE-SEP-OTHER
-A KUBE-SEP-OTHER -p tcp -j DNAT --to-destination 10.200.0.2:80
COMMIT"
T=$(mktemp)
NS=""
trap '[ -n "$NS" ] && ip netns del $NS 2>/dev/null; rm -f $T' EXIT
for shape in unhooked hooked; do
  NS=kpxval-$$-$shape
  ip netns add $NS
  gen $shape > $T
  t=$(date +%s.%N); ip netns exec $NS iptables-restore < $T || echo "load failed"
  line="N=$N $shape: load $(echo "$(date +%s.%N)-$t" | bc) s; another Service's change:"
  for r in 1 2 3; do
    t=$(date +%s.%N); echo "$SMALL" | ip netns exec $NS iptables-restore --noflush || echo FAIL
    line="$line $(echo "($(date +%s.%N)-$t)*1000/1" | bc) ms"
  done
  echo "$line"
  ip netns del $NS; NS=""
done
