#!/bin/bash
# Boots Debian's stock kernel (which has ip_vs) under qemu with an
# initramfs holding the given binaries, runs one command inside, prints the
# guest's console and exits with the command's exit code.
#
#   tests/ipvs-vm/run.sh WORK_DIR BINARY... -- COMMAND [ARG...]
#
# BINARY files are copied (debug info stripped) to the same absolute path
# in the guest, with the shared libraries they need; a directory is copied
# as it is (kpx's compiled-plugin cache). The guest has no
# network device: all traffic stays inside it. After
# ../shared/reference/ipvs-vm/ (same kernel, same qemu, same layout).
# Exit codes: the command's; 97 when qemu cannot run at all here (the
# caller reports a skip with the reason printed last; 96 instead with
# KPX_REQUIRE_VM=1); 98 when the guest did not finish.
#
# KPX_VM_SEND_BACK=DIR (a directory among the BINARY arguments: kpx's
# plugin cache): after the command, the guest sends the *.cwasm files it
# wrote in DIR back over a second serial port, and they are put in DIR
# here. The guest's CPU is not the host's (no AVX-512 under TCG), so
# it cannot use what the host compiled; with this, each plugin is
# compiled in a guest once, not at every boot.
set -euo pipefail
W=$1; shift
BINS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do BINS+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
CMD=("$@")
mkdir -p "$W"; cd "$W"
# One guest at a time per work directory (tests run in parallel).
exec 9>"$W/.lock"; flock 9
step() { echo "HOST: [${SECONDS}s] $*" >&2; }
# KPX_REQUIRE_VM=1: a guest that cannot run is a failure, not a skip.
cannot() { echo "KPX-VM-UNAVAILABLE: $*" >&2; [ "${KPX_REQUIRE_VM:-}" = 1 ] && exit 96; exit 97; }

# 1. Host tools copied into the guest (not qemu: see below).
need=""
for p in busybox-static ipvsadm ipset cpio kmod iproute2 iptables nftables; do
  dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q 'install ok installed' || need="$need $p"
done
KPKG=${KPKG:-}
fetch=$need; ls kernel/boot/vmlinuz-* >/dev/null 2>&1 || fetch="$fetch kernel"
command -v qemu-system-x86_64 >/dev/null || [ -x qemu-root/usr/bin/qemu-system-x86_64 ] || fetch="$fetch qemu"
if [ -n "$fetch" ]; then apt-get update -qq >&2 || cannot "apt-get update failed (no package registry?)"; fi
if [ -n "$need" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove $need >/dev/null \
    || cannot "cannot install$need"
fi
# qemu is unpacked, not installed: installing Debian's qemu-system-x86
# would remove this image's newer qemu-utils.
QEMU=(qemu-system-x86_64); QENV=()
if ! command -v qemu-system-x86_64 >/dev/null; then
  Q=$W/qemu-root
  if [ ! -x "$Q/usr/bin/qemu-system-x86_64" ]; then
    mkdir -p qemu-debs; chmod 777 qemu-debs
    pk=$(apt-get -s install --no-install-recommends qemu-system-x86 | awk '/^Inst /{print $2}')
    [ -n "$pk" ] || cannot "apt cannot resolve qemu-system-x86"
    (cd qemu-debs && apt-get download -qq $pk >&2) || cannot "cannot download qemu"
    # Unpacked beside, then moved: an interrupted unpack is never taken for a cache.
    rm -rf "$Q.part"; for d in qemu-debs/*.deb; do dpkg-deb -x "$d" "$Q.part"; done
    rm -rf "$Q"; mv "$Q.part" "$Q"; rm -rf qemu-debs
  fi
  QEMU=("$Q/usr/bin/qemu-system-x86_64" -L "$Q/usr/share/qemu" -L "$Q/usr/share/seabios")
  QENV=(env "LD_LIBRARY_PATH=$Q/usr/lib/x86_64-linux-gnu:$Q/usr/lib/x86_64-linux-gnu/pulseaudio")
fi
"${QENV[@]}" "${QEMU[@]}" --version >/dev/null 2>&1 || cannot "qemu does not run here"
step "tools and qemu ready"

# 2. The kernel: downloaded and partly extracted, never installed.
[ -n "$KPKG" ] || KPKG=$(ls kernel/boot/vmlinuz-* 2>/dev/null | sed 's#.*/vmlinuz-#linux-image-#' | head -1 || true)
[ -n "$KPKG" ] || KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$KPKG" ] || cannot "no linux-image-amd64 in the package lists"
KVER=${KPKG#linux-image-}
if [ ! -f kernel/boot/vmlinuz-$KVER ]; then
  mkdir -p debs; chmod 777 debs; rm -rf kernel.part; mkdir kernel.part
  (cd debs && apt-get download -qq "$KPKG" >&2) || cannot "cannot download $KPKG"
  dpkg-deb --fsys-tarfile debs/${KPKG}_*.deb | tar -x -C kernel.part --wildcards './boot/vmlinuz-*' \
    './lib/modules/*/modules.*' './lib/modules/*/kernel/net/*' './lib/modules/*/kernel/lib/*' \
    './lib/modules/*/kernel/crypto/*' './lib/modules/*/kernel/arch/*' \
    './lib/modules/*/kernel/drivers/net/dummy.ko' './lib/modules/*/kernel/drivers/net/veth.ko'
  rm -rf kernel; mv kernel.part kernel   # only a finished extract counts as a cache
  rm -f debs/${KPKG}_*.deb
fi
K=$W/kernel; KM=$K/lib/modules/$KVER
if [ ! -f "$W/vmlinux-$KVER" ]; then
  # The uncompressed ELF boots through PVH: 3-5 s to userspace under TCG.
  python3 - "$K/boot/vmlinuz-$KVER" "$W/vmlinux-$KVER" <<'PY' || rm -f "$W/vmlinux-$KVER"
import sys, lzma, zlib
d = open(sys.argv[1], 'rb').read()
for magic, mk in ((b'\xfd7zXZ\x00', lambda: lzma.LZMADecompressor()), (b'\x1f\x8b\x08', lambda: zlib.decompressobj(31))):
    i = d.find(magic)
    if i < 0: continue
    try: out = mk().decompress(d[i:])
    except Exception: continue
    if out[:4] == b'\x7fELF': open(sys.argv[2], 'wb').write(out); sys.exit(0)
sys.exit(1)
PY
fi
step "kernel $KVER ready"

# 3. The initramfs: merged /usr, host binaries with their libraries.
R=$W/rootfs; rm -rf "$R"
mkdir -p "$R"/usr/{bin,sbin,lib/x86_64-linux-gnu,lib64} "$R"/{proc,sys,dev,run,tmp,etc,var}
for d in bin sbin lib lib64; do ln -s usr/$d "$R/$d"; done
ln -s ../run "$R/var/run"
copy_libs() { { ldd "$1" 2>/dev/null || true; } | { grep -o '/[^ ]*' | while read -r l; do
  [ -e "$R$l" ] || { mkdir -p "$R$(dirname "$l")"; cp -L "$l" "$R$l"; }; done; } || true; }
copy_bin() { for f; do [ -e "$f" ] || continue; t=$(readlink -f "$f"); mkdir -p "$R$(dirname "$t")"; cp "$t" "$R$t"; copy_libs "$t"
  [ "$(readlink -m "$R$f")" = "$R$t" ] || ln -sf "$t" "$R$f"; done; }
copy_bin /usr/bin/busybox /usr/sbin/ipvsadm /usr/sbin/ipset /usr/bin/ip /usr/sbin/ip /usr/bin/kmod \
  /usr/sbin/nft /usr/sbin/xtables-nft-multi
for m in modprobe insmod rmmod lsmod depmod modinfo; do ln -sf ../bin/kmod "$R/usr/sbin/$m"; done
for t in iptables ip6tables iptables-save iptables-restore ip6tables-save ip6tables-restore; do
  ln -sf xtables-nft-multi "$R/usr/sbin/$t"; done
cp -a /usr/lib/x86_64-linux-gnu/xtables "$R/usr/lib/x86_64-linux-gnu/"
for so in /usr/lib/x86_64-linux-gnu/xtables/*.so; do copy_libs "$so"; done
/usr/bin/busybox --list-full | while read -r a; do [ -e "$R/$a" ] || [ -L "$R/$a" ] || ln -s /usr/bin/busybox "$R/$a"; done
cp /etc/protocols /etc/services "$R/etc/" 2>/dev/null || true
printf 'root:x:0:0:root:/:/bin/sh\n' > "$R/etc/passwd"; printf 'root:x:0:\n' > "$R/etc/group"
for b in "${BINS[@]}"; do
  mkdir -p "$R$(dirname "$b")"
  if [ -d "$b" ]; then cp -a "$b" "$R$b"; continue; fi   # a directory: copied as it is
  objcopy --strip-debug "$b" "$R$b" 2>/dev/null || cp "$b" "$R$b"
  copy_libs "$b"
done
MR=$R/usr/lib/modules/$KVER; mkdir -p "$MR"
(cd "$KM" && for p in kernel/net/netfilter kernel/net/ipv4/netfilter kernel/net/ipv6/netfilter \
    kernel/lib/libcrc32c.ko kernel/lib/ts_*.ko kernel/crypto/crc32c_generic.ko \
    kernel/drivers/net/dummy.ko kernel/drivers/net/veth.ko; do cp -a --parents $p "$MR/"; done
  cp modules.order modules.builtin modules.builtin.modinfo "$MR/")
while :; do added=0
  for f in $(find "$MR" -name '*.ko'); do for d in $(modinfo -F depends "$f" | tr ',' ' '); do
    [ -n "$(find "$MR" -name "$d.ko" -o -name "${d//_/-}.ko" | head -1)" ] && continue
    src=$(cd "$KM" && find kernel -name "$d.ko" -o -name "${d//_/-}.ko" | head -1)
    [ -n "$src" ] && (cd "$KM" && cp --parents "$src" "$MR/") && added=1
  done; done; [ $added = 0 ] && break; done
depmod -b "$R" "$KVER"
{
  echo '#!/bin/sh'
  echo 'export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp KPX_IN_GUEST=1 RUST_BACKTRACE=1'
  # A long churn run asked for on the host runs long in the guest too.
  [ -n "${KPX_CHURN_CHANGES:-}" ] && printf 'export KPX_CHURN_CHANGES=%q\n' "$KPX_CHURN_CHANGES"
  echo 'mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev'
  # /tmp stays the initramfs' own: the binaries may live under it (a clone in /tmp).
  echo 'mkdir -p /run /tmp && mount -t tmpfs tmpfs /run && mkdir -p /run/netns'
  echo '/usr/sbin/modprobe ip_vs; for s in rr wrr lc wlc sed nq dh sh lblc lblcr mh; do /usr/sbin/modprobe ip_vs_$s; done'
  echo '/usr/sbin/modprobe veth; /usr/sbin/modprobe dummy numdummies=0; /usr/sbin/ip link set lo up'
  echo 'echo "KPX-GUEST-UP $(cut -d" " -f1 /proc/uptime)"'
  # The guest's own clock marks the start: what is newer was written here.
  echo 'touch /tmp/.kpx-started'
  printf '%q ' "${CMD[@]}"; echo ' 2>&1'
  echo 'echo "KPX-GUEST-EXIT=$?"'
  if [ -n "${KPX_VM_SEND_BACK:-}" ]; then
    # What the guest compiled, as base64 through the tty (its \r\n
    # endings are undone by the host); after the exit code, which the
    # host has then whatever becomes of this.
    printf 'cd %q && new=$(find . -maxdepth 1 -name "*.cwasm" -newer /tmp/.kpx-started) && [ -n "$new" ] && tar cf - $new | base64 > /dev/ttyS1\n' "$KPX_VM_SEND_BACK"
  fi
  echo 'sync; poweroff -f; echo o > /proc/sysrq-trigger'
} > "$R/init"
chmod 755 "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet) > "$W/initrd.cpio"
step "initramfs built ($(du -h "$W/initrd.cpio" | cut -f1))"

# 4. Boot (TCG: this machine's /dev/kvm cannot run a stock kernel).
if [ -f "$W/vmlinux-$KVER" ]; then KARGS=(-M pc -kernel "$W/vmlinux-$KVER"); else KARGS=(-M pc -kernel "$K/boot/vmlinuz-$KVER"); fi
LOG=$W/console.log
SENT=$W/sent-back.b64; rm -f "$SENT"
# Named in a qemu option, where a comma is written twice.
SENT_OPT=${SENT//,/,,}
timeout 1500 "${QENV[@]}" "${QEMU[@]}" -accel tcg -cpu max "${KARGS[@]}" -m 2048 -smp 1 -nodefaults -no-reboot \
  -display none -monitor none -serial stdio -serial "file:$SENT_OPT" -initrd "$W/initrd.cpio" \
  -append "console=ttyS0 panic=-1 rdinit=/init loglevel=4 quiet mitigations=off" < /dev/null > "$LOG" 2>&1 || true
cat "$LOG"
step "guest finished"
if [ -n "${KPX_VM_SEND_BACK:-}" ] && [ -s "$SENT" ]; then
  T=$W/sent-back; rm -rf "$T"; mkdir -p "$T"
  if tr -d '\r' < "$SENT" | base64 -d | tar -x -C "$T" --no-same-owner >&2; then
    # Regular *.cwasm files only, each renamed into place (a newer
    # compile of the same name replaces the old one).
    n=0
    for f in "$T"/*.cwasm; do
      b=$(basename "$f"); [ -f "$f" ] && [ ! -L "$f" ] || continue
      chmod 600 "$f" && mv "$f" "$KPX_VM_SEND_BACK/.$b.part" && mv "$KPX_VM_SEND_BACK/.$b.part" "$KPX_VM_SEND_BACK/$b" \
        && n=$((n+1)) || true
    done
    step "$n compiled plugins kept from the guest"
  else
    step "the guest's compiled plugins did not arrive whole: not kept"
  fi
  rm -rf "$T"
fi
code=$(sed -n 's/.*KPX-GUEST-EXIT=\([0-9]*\).*/\1/p' "$LOG" | tail -1)
[ -n "$code" ] || exit 98
exit "$code"
