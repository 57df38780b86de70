//! nfacct objects (nfnetlink_acct), which upstream's iptables mode counts
//! two things in: packets its INVALID rule drops, and connections to node
//! ports on localhost (`-m nfacct --nfacct-name NAME` in the rule). /metrics
//! reports them (`kubeproxy_iptables_ct_state_invalid_dropped_packets_total`,
//! `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`). The
//! objects are per network namespace and shared by both families' rules.

use std::collections::BTreeMap;

use crate::kernel::netlink::Error;
use crate::kernel::netlink::nfnl::Nfnl;
use crate::kernel::netlink::nla::{Writer, attrs, find};

/// upstream's `CTStateInvalidDroppedNFAcctCounter`.
pub const CT_STATE_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// upstream's `LocalhostNodePortAcceptedNFAcctCounter` (as iptables-save
/// shows it on kube-proxy's nodes).
pub const LOCALHOST_NODEPORTS_ACCEPTED: &str = "localhost_nps_accepted_pkts";

const NFNL_SUBSYS_ACCT: u16 = 7;
const NFNL_MSG_ACCT_NEW: u16 = 0;
const NFNL_MSG_ACCT_GET: u16 = 1;
const NFACCT_NAME: u16 = 1;
const NFACCT_PKTS: u16 = 2;
/// AF_UNSPEC: nfacct objects have no family.
const FAMILY: u8 = 0;

/// Makes the objects that do not exist yet (an existing one keeps its
/// count: the kernel answers EBUSY to a second NEW of one name).
pub fn ensure(names: &[&str]) -> Result<(), Error> {
    let mut nl = Nfnl::open()?;
    let requests: Vec<Writer> = names
        .iter()
        .map(|name| {
            let mut w = Writer::new();
            w.str(NFACCT_NAME, name);
            w
        })
        .collect();
    let exists = [nix::errno::Errno::EBUSY as i32, nix::errno::Errno::EEXIST as i32];
    nl.requests(NFNL_SUBSYS_ACCT, NFNL_MSG_ACCT_NEW, FAMILY, &requests, &exists)
}

/// Every object's packets, by name.
pub fn packets() -> Result<BTreeMap<String, u64>, Error> {
    let mut nl = Nfnl::open()?;
    let mut out = BTreeMap::new();
    for reply in nl.dump_from(NFNL_SUBSYS_ACCT, NFNL_MSG_ACCT_GET, FAMILY, &Writer::new())? {
        let Ok(a) = attrs(&reply) else { continue };
        let name = find(&a, NFACCT_NAME).and_then(|n| n.string().ok());
        let packets = find(&a, NFACCT_PKTS).and_then(|p| p.u64_be().ok());
        if let (Some(name), Some(packets)) = (name, packets) {
            out.insert(name, packets);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a scratch namespace (root only): the objects are made once, a
    /// second `ensure` keeps them, and an iptables rule naming one counts
    /// in it.
    #[test]
    fn objects_are_made_once_and_count() {
        if !nix::unistd::Uid::effective().is_root() || !std::path::Path::new("/usr/sbin/iptables").exists() {
            eprintln!("skipped: needs root and iptables");
            return;
        }
        let ns = format!("kpxt-nfacct-{}", std::process::id());
        let run = |args: &[&str]| std::process::Command::new(args[0]).args(&args[1..]).status().unwrap().success();
        assert!(run(&["ip", "netns", "add", &ns]));
        let result = std::thread::scope(|s| {
            s.spawn(|| -> Result<(u64, u64), String> {
                let file = std::fs::File::open(format!("/run/netns/{ns}")).map_err(|e| e.to_string())?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())?;
                ensure(&[CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED]).map_err(|e| e.to_string())?;
                ensure(&[CT_STATE_INVALID_DROPPED]).map_err(|e| format!("second ensure: {e}"))?;
                let before = packets().map_err(|e| e.to_string())?;
                // Two packets through a rule that names the object.
                let script = format!(
                    "ip link set lo up && iptables -A OUTPUT -d 127.0.0.2 -p udp -m nfacct --nfacct-name {CT_STATE_INVALID_DROPPED}"
                );
                let ok = std::process::Command::new("sh").arg("-c").arg(&script).status().map_err(|e| e.to_string())?;
                if !ok.success() {
                    return Err(format!("{script} failed"));
                }
                let socket = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
                for _ in 0..2 {
                    socket.send_to(b"x", "127.0.0.2:9").map_err(|e| e.to_string())?;
                }
                let after = packets().map_err(|e| e.to_string())?;
                Ok((before[CT_STATE_INVALID_DROPPED], after[CT_STATE_INVALID_DROPPED]))
            })
            .join()
            .unwrap()
        });
        run(&["ip", "netns", "delete", &ns]);
        let (before, after) = result.unwrap();
        assert_eq!(before, 0);
        assert_eq!(after, 2, "two datagrams counted");
    }
}
