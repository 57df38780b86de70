//! Confinement rules for nft transactions:
//! - one command per line: add / delete / flush of a table, chain, set,
//!   map, rule or element — never `flush ruleset`, never `delete table`;
//! - every command names this instance's family and table `kube-proxy`;
//! - base chains keep the policy accept;
//! - DNAT goes to an endpoint of the state: either literally, or through
//!   an endpoint map whose elements are all endpoints;
//! - no statement that sends traffic elsewhere (snat, redirect, tproxy,
//!   queue, dup, fwd).

use std::net::IpAddr;

use kpx_rules::model::IpFamily;
use kpx_rules::nftables::{Fam, TABLE};

use super::{Context, Rejected};

const OBJECTS: &[&str] = &["table", "chain", "set", "map", "rule", "element"];
const FORBIDDEN: &[&str] = &["snat", "redirect", "tproxy", "queue", "dup", "fwd", "notrack"];
const ENDPOINT_MAPS: &[&str] = &["internal-", "external-", "shortcut-", "nodeport-external-", "nodeport-shortcut-"];

/// `<purpose>-<tcp|udp|sctp>-<count>`.
fn is_endpoint_map(name: &str) -> bool {
    ENDPOINT_MAPS.iter().any(|p| {
        name.strip_prefix(p)
            .and_then(|rest| rest.split_once('-'))
            .is_some_and(|(proto, n)| matches!(proto, "tcp" | "udp" | "sctp") && n.parse::<u32>().is_ok())
    })
}

/// Checks a transaction; the first violation refuses it whole.
pub fn check_nftables(payload: &str, family: IpFamily, ctx: &Context) -> Result<(), Rejected> {
    let fam = Fam(family);
    for command in kpx_rules::nftables::command_lines(payload) {
        let (n, raw, words) = (command.number, command.raw, &command.words);
        let line = raw.trim();
        let (verb, object) = (command.verb(), command.object());
        if !matches!(verb, "add" | "delete" | "flush") || !OBJECTS.contains(&object) {
            return Err(ctx.reject(n, raw, format!("\"{verb} {object}\" is not an allowed command")));
        }
        if words.get(2) != Some(&fam.name()) || words.get(3) != Some(&TABLE) {
            return Err(ctx.reject(n, raw, format!("every command must name table {} {TABLE}", fam.name())));
        }
        if object == "table" && verb == "delete" {
            return Err(ctx.reject(n, raw, "deleting the table is the host's job (--cleanup)"));
        }
        if object == "chain" && line.contains(" policy ") && !line.contains("policy accept") {
            return Err(ctx.reject(n, raw, "base chains keep policy accept"));
        }
        if object == "rule" {
            check_rule(ctx, n, raw, words, fam)?;
        }
        if object == "element" && verb == "add" {
            let set = words.get(4).copied().unwrap_or("");
            if is_endpoint_map(set) {
                check_endpoint_elements(ctx, n, raw)?;
            }
        }
    }
    Ok(())
}

fn check_rule(ctx: &Context, n: usize, raw: &str, words: &[&str], fam: Fam) -> Result<(), Rejected> {
    if let Some(bad) = words.iter().find(|w| FORBIDDEN.contains(w)) {
        return Err(ctx.reject(n, raw, format!("statement {bad:?} is not allowed")));
    }
    if words.contains(&"masquerade") && words.contains(&"to") {
        return Err(ctx.reject(n, raw, "masquerade to a port range is not allowed"));
    }
    let Some(at) = words.iter().position(|w| *w == "dnat") else { return Ok(()) };
    if words.get(at + 1) != Some(&fam.name()) || words.get(at + 2) != Some(&"to") {
        return Err(ctx.reject(n, raw, format!("dnat must read \"dnat {} to ...\"", fam.name())));
    }
    // Through an endpoint map: `... map @<endpoint map>` ends the rule.
    if let (Some(&"map"), Some(target)) = (words.get(words.len().wrapping_sub(2)), words.last()) {
        let name = target.trim_start_matches('@');
        if target.starts_with('@') && is_endpoint_map(name) {
            return Ok(());
        }
        return Err(ctx.reject(n, raw, format!("dnat through {target}, which is not an endpoint map")));
    }
    let dest = words.get(at + 3).copied().unwrap_or("");
    check_endpoint(ctx, n, raw, dest)
}

fn check_endpoint(ctx: &Context, n: usize, raw: &str, dest: &str) -> Result<(), Rejected> {
    match kpx_rules::model::split_host_port(dest) {
        Some(ep) if ctx.endpoints.contains(&ep) => Ok(()),
        Some(_) => Err(ctx.reject(n, raw, format!("DNAT destination {dest} is not an endpoint of any service"))),
        None => Err(ctx.reject(n, raw, format!("DNAT destination {dest:?} is not ADDRESS:PORT"))),
    }
}

/// `add element ... <map> { key : ip . port, ... }`: every value an endpoint.
fn check_endpoint_elements(ctx: &Context, n: usize, raw: &str) -> Result<(), Rejected> {
    let (Some(open), Some(close)) = (raw.find('{'), raw.rfind('}')) else {
        return Err(ctx.reject(n, raw, "elements must be in braces"));
    };
    for element in raw[open + 1..close].split(',') {
        // " : " separates key and value (IPv6 addresses hold colons).
        let Some((_, value)) = element.split_once(" : ") else {
            return Err(ctx.reject(n, raw, format!("endpoint map element {:?} has no value", element.trim())));
        };
        let parts: Vec<&str> = value.split(" . ").map(str::trim).collect();
        let ep = match parts.as_slice() {
            [ip, port] => ip.parse::<IpAddr>().ok().zip(port.parse::<u16>().ok()),
            _ => None,
        };
        match ep {
            Some(ep) if ctx.endpoints.contains(&ep) => {}
            _ => {
                return Err(ctx.reject(
                    n,
                    raw,
                    format!("endpoint map value {:?} is not an endpoint of any service", value.trim()),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        Context {
            plugin: "nft".into(),
            endpoints: [("10.1.0.1".parse().unwrap(), 8080)].into_iter().collect(),
            existing_chains: Default::default(),
        }
    }

    #[test]
    fn accepts_kpx_transactions() {
        let ok = "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
                  flush table ip kube-proxy\n\
                  add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority dstnat ; }\n\
                  add rule ip kube-proxy select-internal dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @internal-tcp-2\n\
                  add rule ip kube-proxy endpoint-X meta l4proto tcp dnat ip to 10.1.0.1:8080\n\
                  add element ip kube-proxy internal-tcp-2 { 172.30.0.1 . tcp . 80 . 0 : 10.1.0.1 . 8080, 172.30.0.1 . tcp . 80 . 1 : 10.1.0.1 . 8080 }\n\
                  delete element ip kube-proxy internal-tcp-2 { 172.30.0.1 . tcp . 80 . 0 }\n";
        check_nftables(ok, IpFamily::V4, &ctx()).unwrap();
    }

    #[test]
    fn refuses_foreign_tables_and_destinations() {
        let cases = [
            ("add rule ip filter input drop", "must name table"),
            ("add rule ip6 kube-proxy x drop", "must name table"),
            ("flush ruleset", "not an allowed command"),
            ("delete table ip kube-proxy", "host's job"),
            ("add chain ip kube-proxy in { type filter hook input priority 0 ; policy drop ; }", "policy accept"),
            ("add rule ip kube-proxy x dnat ip to 192.0.2.66:80", "not an endpoint"),
            ("add rule ip kube-proxy x dnat ip to ip daddr map @mine", "not an endpoint map"),
            ("add rule ip kube-proxy x redirect to :8080", "\"redirect\""),
            (
                "add element ip kube-proxy internal-tcp-1 { 172.30.0.1 . tcp . 80 . 0 : 192.0.2.66 . 80 }",
                "not an endpoint",
            ),
        ];
        for (line, reason) in cases {
            let err = check_nftables(line, IpFamily::V4, &ctx()).expect_err(line);
            assert!(err.reason.contains(reason), "{line}: {err}");
        }
    }
}
