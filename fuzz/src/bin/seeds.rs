//! Writes the seed inputs of every target into fuzz/corpus/<target>/
//! (`cargo run -p kpx-fuzz --bin kpx-fuzz-seeds`): real inputs of each
//! kind, from the repository's manifests and config files and from the
//! built-in generators' rules for the fuzz lab's state. libFuzzer grows
//! the corpus from them; `cargo xtask fuzz` keeps it minimal.

use std::path::{Path, PathBuf};

use kpx::kernel::iptables::frame::frame as iptables_frame;
use kpx::kernel::iptables::render::payload;
use kpx::kernel::nftables::encode;
use kpx_fuzz::{Lab, words_to_bytes};
use kpx_rules::model::IpFamily;
use kpx_rules::ops::iptables::words::encode as encode_words;
use kpx_rules::ops::nftables::{Op, decode_elements};

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = root.parent().expect("the repository");
    let corpus = root.join("corpus");
    let mut seeds: Vec<(&str, String, Vec<u8>)> = Vec::new();
    for dir in ["tests/cases", "deploy"] {
        for entry in std::fs::read_dir(repo.join(dir))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
                seeds.push(("manifests", name, std::fs::read(&path)?));
            }
        }
    }
    seeds.push(("config", "kubeadm".into(), std::fs::read(repo.join("tests/kubeadm-config.conf"))?));
    seeds.push((
        "config",
        "kpx-section".into(),
        b"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nclusterCIDR: 10.244.0.0/16,fd00::/56\nkpx:\n  schedulerPlugins: [\"mine=/etc/kpx/s.wasm\"]\n  extensions: [\"ratelimit=/etc/kpx/r.wasm,default=5\"]\n".to_vec(),
    ));
    seeds.push(("api_objects", "service-and-slice".into(), API_OBJECTS.to_vec()));
    for family in [IpFamily::V4, IpFamily::V6] {
        let lab = Lab::of(family);
        let tag = format!("{family:?}").to_lowercase();
        let words = encode_words(family, &lab.iptables).expect("the generator's rules encode");
        let mut whole = vec![1u8];
        whole.extend(words_to_bytes(&words));
        seeds.push(("iptables_words", format!("generator-{tag}"), whole));
        let (text, _) = payload(&iptables_frame(&lab.iptables_settings), &lab.iptables, &[], lab.dialect(), None);
        seeds.push(("iptables_save", format!("generator-{tag}"), text.into_bytes()));
        let mut datagram = Vec::new();
        let mut sets = std::collections::HashMap::new();
        for op in &lab.nftables.ops {
            let msgs = match op {
                Op::AddRule(r) => vec![encode::add_rule(family, lab.masquerade_mark(), r).expect("encodes")],
                Op::AddSet(d) => {
                    sets.insert(d.name.clone(), d.clone());
                    vec![encode::add_set(family, d, 1, None, None)]
                }
                Op::AddChain(c) => vec![encode::add_chain(c)],
                // A set's elements right after it, as a dump gives them.
                Op::AddElements(e) => {
                    let Some(decl) = sets.get(e.set.name()) else { continue };
                    let elements = decode_elements(decl, family, e).expect("the generator's elements decode");
                    let mut set = encode::add_set(family, decl, 1, None, None);
                    push_message(&mut datagram, set.msg_type, &std::mem::take(&mut set.attrs.buf));
                    encode::elements(e.set.name(), decl.interval, &elements, true)
                }
                _ => continue,
            };
            for msg in msgs {
                push_message(&mut datagram, msg.msg_type, &msg.attrs.buf);
            }
        }
        seeds.push(("netlink", format!("generator-{tag}"), datagram));
    }
    for (i, bytes) in [&b""[..], &[0], &[1], &[0, 3, 0, 0, 0, 0]].into_iter().enumerate() {
        seeds.push(("nftables_ops", format!("start-{i}"), bytes.to_vec()));
        seeds.push(("iptables_words", format!("start-{i}"), bytes.to_vec()));
    }
    for (target, name, bytes) in seeds {
        let dir: PathBuf = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    eprintln!("seeds written under {}", corpus.display());
    Ok(())
}

/// A netlink message as the kernel sends it: header, nfgenmsg, attributes.
fn push_message(out: &mut Vec<u8>, msg_type: u16, attrs: &[u8]) {
    let len = 16 + 4 + attrs.len();
    out.extend((len as u32).to_ne_bytes());
    out.extend(((10u16 << 8) | msg_type).to_ne_bytes());
    out.extend(2u16.to_ne_bytes());
    out.extend(1u32.to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    out.extend([2, 0, 0, 0]);
    out.extend(attrs);
    out.resize(out.len().next_multiple_of(4), 0);
}

const API_OBJECTS: &[u8] = br#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"ns","resourceVersion":"5"},"spec":{"type":"NodePort","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],"ipFamilies":["IPv4"],"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080,"nodePort":30080}],"sessionAffinity":"ClientIP","externalTrafficPolicy":"Local","healthCheckNodePort":30000}}
{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-abc","namespace":"ns","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","endpoints":[{"addresses":["10.244.1.5"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"node","zone":"a","hints":{"forZones":[{"name":"a"}]}}],"ports":[{"name":"http","port":8080,"protocol":"TCP"}]}
"#;
