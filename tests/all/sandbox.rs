//! A hostile backend (plugins/hostile) traps, loops, exhausts memory,
//! floods output and asks for foreign rules; the kernel's rules and the
//! traffic stay as they were, and kpx recovers when the state is sane.

use std::time::Duration;

use crate::support::*;

fn hostile_wasm() -> String {
    format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"))
}

fn hostile_service(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: tcp, port: 80, protocol: TCP}}]\n"
    )
}

#[test]
fn hostile_plugin_never_changes_the_kernel() {
    let Some(lab) = lab_or_skip(2, "hostile_plugin_never_changes_the_kernel") else {
        return;
    };
    let (dir, manifests) = run_dirs("sandbox");
    let (be1, be2) = (&lab.backends[0].ip, &lab.backends[1].ip);
    write_web(&manifests, &[be1]);
    let plugin = hostile_wasm();
    let args = kpx_args(
        &manifests,
        &[
            "--backend-plugin",
            &plugin,
            "--plugin-fuel",
            "300000000",
            "--plugin-memory-limit-mib",
            "128",
            "--plugin-max-output-mib",
            "8",
            "--iptables-min-sync-period",
            "100ms",
        ],
    );
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "no sync:\n{}", kpx.log());
    assert_eq!(servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 5).keys().collect::<Vec<_>>(), ["be1"]);
    let good_rules = kernel_rules(&lab);

    let cases = [
        ("hostile-trap", "trapped"),
        ("hostile-loop", "ran out of fuel"),
        ("hostile-memory", "trapped"),
        ("hostile-huge", "more than the limit"),
        ("hostile-foreign", "is not a KUBE- chain"),
        ("hostile-dnat", "is not an endpoint"),
    ];
    for (i, (name, symptom)) in cases.iter().enumerate() {
        let file = manifests.join(format!("{name}.yaml"));
        let before = kpx.log().matches(symptom).count();
        write_manifest(&file, &hostile_service(name, &format!("10.96.1.{}", i + 1)));
        // Also change a real endpoint: it must not reach the kernel while the plugin misbehaves.
        write_web(&manifests, &[be2]);
        assert!(
            kpx.wait_for_log(symptom, before + 1, Duration::from_secs(15)),
            "{name}: expected {symptom:?} in the log:\n{}",
            kpx.log()
        );
        assert!(kpx.is_running(), "{name} brought kpx down:\n{}", kpx.log());
        assert_eq!(kernel_rules(&lab), good_rules, "{name} changed the kernel's rules");
        let seen = servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 5);
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["be1"], "{name}: traffic changed");
        // Sane again: the real endpoint back first, then the hostile
        // Service gone, so no sync in between can program anything else.
        write_web(&manifests, &[be1]);
        std::fs::remove_file(&file).unwrap();
        let synced = kpx.log().matches("synced rules family=IPv4").count();
        assert!(
            kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(15)),
            "{name}: no recovery:\n{}",
            kpx.log()
        );
        let t0 = std::time::Instant::now();
        while kernel_rules(&lab) != good_rules && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(kernel_rules(&lab), good_rules, "{name}: rules after recovery");
    }
    // After recovery, a real change reaches the kernel again.
    write_web(&manifests, &[be2]);
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 3).keys().collect::<Vec<_>>() == ["be2"] {
            return;
        }
    }
    panic!("changes no longer apply after the hostile episodes:\n{}", kpx.log());
}
