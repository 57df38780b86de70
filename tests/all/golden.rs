//! Golden tests: manifests under tests/golden/iptables/<case>.yaml go
//! through the state, the real (WASM) iptables plugin, the host's
//! confinement check and renderer; the payload for each family must equal
//! <case>.rules (a change detector: upstream's own lines are checked in
//! host/src/kernel/iptables/tests.rs). `KPX_BLESS=1` rewrites them.

use std::path::Path;

use kpx::kernel::iptables::{dialect, frame::frame, render::payload};
use kpx::runtime::{Limits, Runtime, builtin};
use kpx::source::Event;
use kpx::source::manifests::parse_documents;
use kpx::state::State;
use kpx::validate::Scope;
use kpx_rules::model::{Cidr, IpFamily, LocalTraffic, ProxyMode, Settings};
use kpx_rules::ops::Ruleset;

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
        let mut settings = Settings::new(family, ProxyMode::Iptables);
        settings.local_traffic = LocalTraffic::Cidrs(vec![cidr.parse::<Cidr>().unwrap()]);
        let ports: Vec<_> = state.service_names().flat_map(|n| state.service_ports(family, n)).collect();
        let mut instance = plugin.instantiate(&settings).unwrap();
        instance.reset(&state.node(family), &state.cluster(family), &ports).unwrap();
        let Ruleset::Iptables(rs) = instance.render(true, 0).unwrap() else { panic!("not iptables") };
        let mut scope = Scope::default();
        for p in &ports {
            scope.count(family, p, true);
        }
        let ctx = kpx::validate::iptables::Context {
            plugin: "iptables",
            dialect: dialect(&settings),
            scope: &scope,
            model: &Default::default(),
            full: true,
        };
        kpx::validate::iptables::check(&ctx, &rs).unwrap_or_else(|e| panic!("golden output fails validation: {e}"));
        let (text, _) = payload(&frame(&settings), &rs, &[], dialect(&settings), None);
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
