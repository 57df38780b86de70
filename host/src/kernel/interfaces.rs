//! The node's own interface addresses (for --nodeport-addresses).

use std::net::IpAddr;

use super::{Exec, Result};

/// Addresses on this node's interfaces, from `ip -o addr show`.
pub fn local_addresses(exec: &dyn Exec) -> Result<Vec<IpAddr>> {
    let out = exec.run("ip", &["-o", "addr", "show"], None)?;
    Ok(parse(&out))
}

fn parse(text: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        while let Some(word) = words.next() {
            if word == "inet" || word == "inet6" {
                let addr = words.next().and_then(|a| a.split('/').next()).and_then(|a| a.parse::<IpAddr>().ok());
                out.extend(addr);
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_ip_o_addr() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n\
                    2: eth0    inet 192.168.0.2/24 brd 192.168.0.255 scope global eth0\\       valid_lft forever\n\
                    2: eth0    inet6 fd00::2/64 scope global \\       valid_lft forever\n";
        let got: Vec<String> = super::parse(text).iter().map(|a| a.to_string()).collect();
        assert_eq!(got, ["127.0.0.1", "192.168.0.2", "fd00::2"]);
    }
}
