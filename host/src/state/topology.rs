//! Which endpoints each kind of traffic may use, decided once in the host
//! for every mode (upstream's CategorizeEndpoints).

use kpx_rules::model::Endpoint;

/// (cluster, local) index sets. Cluster traffic uses the ready endpoints,
/// or, when none is ready, the serving terminating ones (KEP-1669). Local
/// traffic uses the local ready endpoints, with the same fallback.
pub fn categorize(endpoints: &[Endpoint]) -> (Vec<u32>, Vec<u32>) {
    let pick = |f: &dyn Fn(&Endpoint) -> bool| -> Vec<u32> {
        endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| f(e))
            .map(|(i, _)| i as u32)
            .collect()
    };
    let fallback = |e: &Endpoint| e.conditions.serving && e.conditions.terminating;
    let mut cluster = pick(&|e| e.conditions.ready);
    if cluster.is_empty() {
        cluster = pick(&fallback);
    }
    let mut local = pick(&|e| e.conditions.ready && e.conditions.is_local);
    if local.is_empty() {
        local = pick(&|e| fallback(e) && e.conditions.is_local);
    }
    (cluster, local)
}
