//! Golden tests: manifests under tests/golden/iptables/<case>.yaml go
//! through the state and the real (WASM) iptables plugin; the full render
//! for each family must equal <case>.rules. `KPX_BLESS=1` rewrites them.

use std::path::Path;

use kpx::runtime::{Limits, Runtime, builtin};
use kpx::source::Event;
use kpx::source::manifests::parse_documents;
use kpx::state::State;
use kpx::validate::{Context, check_iptables};
use kpx_rules::model::{Cidr, IpFamily, LocalTraffic, Settings};

fn render_case(yaml: &str) -> String {
    let (objects, errors) = parse_documents(yaml);
    assert!(errors.is_empty(), "{errors:?}");
    let mut state = State::new("node-a");
    for object in objects {
        state.apply(Event::Apply(object));
    }
    state.apply(Event::Synced);
    let runtime = Runtime::new(Limits::default(), Some(crate::support::plugin_cache().into())).unwrap();
    let plugin = runtime.load_backend("iptables", builtin::get("iptables").unwrap()).unwrap();
    let mut out = String::new();
    for (family, cidr) in [(IpFamily::V4, "10.244.0.0/16"), (IpFamily::V6, "fd00:10:244::/56")] {
        let mut settings = Settings::new(family, "iptables");
        settings.local_traffic = LocalTraffic::Cidrs(vec![cidr.parse::<Cidr>().unwrap()]);
        let ports: Vec<_> = state.service_names().flat_map(|n| state.service_ports(family, n)).collect();
        let mut instance = plugin.instantiate(&settings).unwrap();
        instance.reset(&state.node(family), &state.cluster(family), &ports).unwrap();
        let text = instance.render(true, 0).unwrap().text().to_string();
        let ctx = Context {
            plugin: "iptables".into(),
            endpoints: ports.iter().flat_map(|p| p.endpoints.iter().map(|e| (e.ip, e.port))).collect(),
            existing_chains: Default::default(),
        };
        check_iptables(&text, &ctx).unwrap_or_else(|e| panic!("golden output fails validation: {e}"));
        out.push_str(&format!("# {family}\n{text}"));
    }
    out
}

#[test]
fn iptables_golden_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/iptables");
    let mut cases: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    cases.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    cases.sort();
    assert!(cases.len() >= 4, "golden cases missing in {}", dir.display());
    let bless = std::env::var_os("KPX_BLESS").is_some();
    let mut failures = Vec::new();
    for case in cases {
        let got = render_case(&std::fs::read_to_string(&case).unwrap());
        let expected_path = case.with_extension("rules");
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != expected {
            let first = got.lines().zip(expected.lines()).position(|(a, b)| a != b);
            failures.push(format!(
                "{}: differs (first differing line {:?}); run with KPX_BLESS=1 to accept\n--- got ---\n{got}",
                expected_path.display(),
                first.map(|i| i + 1)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
