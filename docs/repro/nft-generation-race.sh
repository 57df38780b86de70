#!/bin/bash
# usage: run.sh SHAPE(S0|S1) N_TX PAD
set -u
W=$(mktemp -d)
SHAPE=$1; N=$2; PAD=$3
NS=kpxrace-$$
ip netns add $NS
trap 'kill $SENDER 2>/dev/null; ip netns del $NS' EXIT
ip netns exec $NS ip link set lo up
{
echo "add table inet race"
echo "add counter inet race miss"
echo "add counter inet race total"
echo "add map inet race m1 { type ipv4_addr . inet_service : verdict; }"
echo "add map inet race m2 { type ipv4_addr . inet_service : verdict; }"
echo "add chain inet race out { type filter hook output priority 0; policy accept; }"
echo "add chain inet race sel"
echo "add chain inet race pick"
echo "add chain inet race okc"
echo "add rule inet race okc accept"
echo "add rule inet race out ip daddr 127.0.0.2 udp dport 9999 counter name total jump sel"
for i in $(seq $PAD); do echo "add rule inet race sel meta mark 0x$(printf %x $((i+100000))) counter"; done
echo "add rule inet race sel jump pick"
echo "add rule inet race sel counter name miss drop"
echo "add rule inet race pick ip daddr . udp dport vmap @m1"
[ $SHAPE != S1 ] && echo "add rule inet race pick ip daddr . udp dport vmap @m2"
echo "add element inet race m1 { 127.0.0.2 . 9999 : accept }"
} > $W/base-$$.nft
ip netns exec $NS nft -f $W/base-$$.nft || exit 1
for to in 1 2; do
  from=$((3-to))
  {
  if [ $SHAPE = S0 ]; then
    echo "flush chain inet race pick"
    echo "add rule inet race pick ip daddr . udp dport vmap @m1"
    echo "add rule inet race pick ip daddr . udp dport vmap @m2"
  elif [ $SHAPE = S1 ]; then
    echo "flush chain inet race pick"
    echo "add rule inet race pick ip daddr . udp dport vmap @m$to"
  fi
  if [ $SHAPE = S3 ]; then
    if [ $to = 1 ]; then d=accept; else d="goto okc"; fi
    echo "delete element inet race m1 { 127.0.0.2 . 9999 }"
    echo "add element inet race m1 { 127.0.0.2 . 9999 : $d }"
  elif [ $SHAPE = S0c ]; then
    echo "add element inet race m$to { 127.0.0.2 . 9999 : accept }"
    echo "delete element inet race m$from { 127.0.0.2 . 9999 }"
  elif [ $SHAPE = S2 ]; then
    echo "add element inet race m$to { 127.0.0.2 . 9999 : accept }"
    echo "#SPLIT"
    echo "delete element inet race m$from { 127.0.0.2 . 9999 }"
  else
    echo "delete element inet race m$from { 127.0.0.2 . 9999 }"
    echo "add element inet race m$to { 127.0.0.2 . 9999 : accept }"
  fi
  } > $W/to$to-$$.all
  sed '/#SPLIT/,$d' $W/to$to-$$.all > $W/to$to-$$.nft
  sed '1,/#SPLIT/d' $W/to$to-$$.all > $W/to$to-$$.b.nft
  [ -s $W/to$to-$$.b.nft ] || echo "" > $W/to$to-$$.b.nft
done
ip netns exec $NS python3 -c '
import socket,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
t=time.time()
while time.time()-t<600:
    for _ in range(1000):
        try: s.sendto(b"x",("127.0.0.2",9999))
        except OSError: pass
' &
SENDER=$!
sleep 1
start=$(date +%s.%N)
for i in $(seq $N); do
  ip netns exec $NS nft -f $W/to$(( (i%2)+1 ))-$$.nft || echo tx fail
  [ $SHAPE = S2 ] && { ip netns exec $NS nft -f $W/to$(( (i%2)+1 ))-$$.b.nft || echo txb fail; }
done
end=$(date +%s.%N)
ip netns exec $NS nft list counters table inet race | grep packets
echo "shape=$SHAPE tx=$N pad=$PAD secs=$(echo "$end - $start" | bc)"
