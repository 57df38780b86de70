//! nftables mode's hairpin masquerade (the host's `masquerading` chain)
//! touches Service traffic only: an endpoint on a node address that talks
//! to itself through a Service is masqueraded, and the same address
//! talking to itself on any other port is not (the red team's finding: the
//! `hairpin` set alone matched every connection from such an address to
//! itself).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use kpx::kernel::nftables::{NftablesDataplane, NftablesKernel};
use kpx::validate::Scope;
use kpx_netlab::Lab;
use kpx_rules::backend::Backend;
use kpx_rules::model::{Cluster, Endpoint, IpFamily, Node, Protocol, ProxyMode, ServicePort, Settings};
use kpx_rules::nftables::NftablesProxier;

/// The source address a listener on `listen` sees for a connection to `to`
/// made from `from`.
fn seen(listen: SocketAddr, from: SocketAddr, to: SocketAddr) -> std::io::Result<String> {
    let l = TcpListener::bind(listen)?;
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&from.into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(2))?;
    let _client: TcpStream = socket.into();
    let (_, peer) = l.accept()?;
    Ok(peer.ip().to_string())
}

#[test]
fn hairpin_masquerade_is_for_service_traffic_only() {
    let mut lab = match Lab::new() {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("SKIPPED: hairpin_masquerade_is_for_service_traffic_only: {e}");
            return;
        }
    };
    let ns = lab.add("hairpin").expect("a namespace");
    // Two node addresses; the second is also a host-network endpoint.
    for (a, b, addr) in [("v0", "v0p", "10.77.0.1/24"), ("v1", "v1p", "10.77.1.1/24")] {
        ns.ip(&["link", "add", a, "type", "veth", "peer", "name", b]).unwrap();
        ns.ip(&["addr", "add", addr, "dev", a]).unwrap();
        ns.ip(&["link", "set", a, "up"]).unwrap();
        ns.ip(&["link", "set", b, "up"]).unwrap();
    }
    ns.ip(&["route", "add", "10.96.0.0/16", "dev", "v0"]).unwrap();

    let family = IpFamily::V4;
    let settings = Settings::new(family, ProxyMode::Nftables);
    let mut web = ServicePort::new("ns", "web", "", Protocol::Tcp, 80)
        .with_cluster_endpoints(vec![Endpoint::ready("10.77.1.1".parse().unwrap(), 8080)]);
    web.cluster_ip = Some("10.96.0.10".parse().unwrap());
    let mut scope = Scope::default();
    scope.count(family, &web, true);
    let mut generator = NftablesProxier::new(settings.clone());
    generator.reset(Node::default(), Cluster::default(), vec![web]);
    let kpx_rules::ops::Ruleset::Nftables(tx) = generator.render(true).unwrap() else { panic!("nftables ops") };

    let (direct, through_service) = ns
        .enter(move || {
            let mut dataplane = NftablesDataplane::new(NftablesKernel::new(family));
            dataplane.sync("nftables", &settings, &Cluster::default(), &tx, true, &scope).expect("sync");
            let from = "10.77.1.1:0".parse().unwrap();
            let direct = seen("10.77.1.1:9999".parse().unwrap(), from, "10.77.1.1:9999".parse().unwrap());
            let service = seen("10.77.1.1:8080".parse().unwrap(), from, "10.96.0.10:80".parse().unwrap());
            (direct, service)
        })
        .expect("enter the namespace");
    let (direct, through_service) = (direct.expect("direct connection"), through_service.expect("via the Service"));
    eprintln!("10.77.1.1 -> 10.77.1.1:9999 seen from {direct}; via 10.96.0.10:80 seen from {through_service}");
    assert_eq!(direct, "10.77.1.1", "not Service traffic, yet masqueraded");
    assert_ne!(through_service, "10.77.1.1", "hairpin through the Service must be masqueraded");
}
