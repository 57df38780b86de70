//! Confinement rules for iptables-restore payloads.
//!
//! - only the tables kube-proxy uses (nat, filter, mangle);
//! - only `*table`, `:CHAIN`, `-A`, `-X` and `COMMIT` lines;
//! - only KUBE- chains are declared, flushed, appended to or deleted, and a
//!   chain is appended to only after this payload declared (flushed) it;
//! - jumps go to an allowed target or to a KUBE- chain that exists;
//! - only match modules kube-proxy uses;
//! - every DNAT destination is an endpoint of the state.

use std::collections::BTreeSet;

use super::{Context, Rejected};
use kpx_rules::iptables::split_args;

const TABLES: &[&str] = &["nat", "filter", "mangle"];
const TARGETS: &[&str] = &["DNAT", "MASQUERADE", "MARK", "RETURN", "ACCEPT", "DROP", "REJECT", "HMARK"];
const MODULES: &[&str] = &[
    "comment",
    "tcp",
    "udp",
    "sctp",
    "statistic",
    "recent",
    "mark",
    "conntrack",
    "addrtype",
    "set",
    "nfacct",
    "multiport",
    "physdev",
];
const OWN_PREFIX: &str = "KUBE-";

struct TableState {
    name: String,
    declared: BTreeSet<String>,
    deleted: BTreeSet<String>,
}

/// Checks a payload; the first violation refuses it whole.
pub fn check_iptables(payload: &str, ctx: &Context) -> Result<(), Rejected> {
    let mut table: Option<TableState> = None;
    let mut seen_tables = BTreeSet::new();
    for (i, raw) in payload.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            check_table_start(ctx, n, raw, name, &table, &mut seen_tables)?;
            table = Some(TableState { name: name.to_string(), declared: BTreeSet::new(), deleted: BTreeSet::new() });
            continue;
        }
        let Some(current) = table.as_mut() else {
            return Err(ctx.reject(n, raw, "line outside a *table section"));
        };
        if line == "COMMIT" {
            table = None;
        } else if let Some(decl) = line.strip_prefix(':') {
            check_declaration(ctx, n, raw, decl, current)?;
        } else {
            let args = split_args(line).ok_or_else(|| ctx.reject(n, raw, "unbalanced quotes"))?;
            match args.first().map(String::as_str) {
                Some("-A") => check_append(ctx, n, raw, &args, current)?,
                Some("-X") => check_delete(ctx, n, raw, &args, current)?,
                Some(cmd) => {
                    return Err(ctx.reject(n, raw, format!("command {cmd} is not allowed (only -A and -X)")));
                }
                None => {}
            }
        }
    }
    if let Some(open) = table {
        return Err(ctx.reject(payload.lines().count(), "", format!("table {} is not committed", open.name)));
    }
    Ok(())
}

fn check_table_start(
    ctx: &Context,
    n: usize,
    raw: &str,
    name: &str,
    open: &Option<TableState>,
    seen: &mut BTreeSet<String>,
) -> Result<(), Rejected> {
    if let Some(open) = open {
        return Err(ctx.reject(n, raw, format!("table {} is not committed before the next", open.name)));
    }
    if !TABLES.contains(&name) {
        return Err(ctx.reject(n, raw, format!("table {name:?} is not one kube-proxy uses")));
    }
    if !seen.insert(name.to_string()) {
        return Err(ctx.reject(n, raw, format!("table {name} appears twice")));
    }
    Ok(())
}

fn check_own_chain(ctx: &Context, n: usize, raw: &str, chain: &str) -> Result<(), Rejected> {
    let valid_name = chain.len() <= 28 && chain.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !chain.starts_with(OWN_PREFIX) || !valid_name {
        return Err(ctx.reject(n, raw, format!("chain {chain:?} is not a {OWN_PREFIX} chain")));
    }
    Ok(())
}

fn check_declaration(ctx: &Context, n: usize, raw: &str, decl: &str, table: &mut TableState) -> Result<(), Rejected> {
    let mut parts = decl.split_whitespace();
    let chain = parts.next().unwrap_or("");
    check_own_chain(ctx, n, raw, chain)?;
    if parts.next() != Some("-") {
        return Err(ctx.reject(n, raw, "a KUBE- chain has no policy: use \"-\""));
    }
    table.declared.insert(chain.to_string());
    Ok(())
}

fn check_delete(ctx: &Context, n: usize, raw: &str, args: &[String], table: &mut TableState) -> Result<(), Rejected> {
    let chain = args.get(1).map(String::as_str).unwrap_or("");
    check_own_chain(ctx, n, raw, chain)?;
    if args.len() != 2 {
        return Err(ctx.reject(n, raw, "-X takes exactly one chain"));
    }
    if !table.declared.contains(chain) {
        return Err(ctx.reject(n, raw, "a chain is deleted only after it is declared (flushed) in the same payload"));
    }
    table.deleted.insert(chain.to_string());
    Ok(())
}

fn check_append(ctx: &Context, n: usize, raw: &str, args: &[String], table: &TableState) -> Result<(), Rejected> {
    let chain = args.get(1).map(String::as_str).unwrap_or("");
    check_own_chain(ctx, n, raw, chain)?;
    if !table.declared.contains(chain) {
        return Err(ctx.reject(
            n,
            raw,
            format!("rules go only to chains this payload declares; {chain} is not declared"),
        ));
    }
    let mut target: Option<&str> = None;
    let mut i = 2;
    while i < args.len() {
        let arg = args[i].as_str();
        let value = args.get(i + 1).map(String::as_str);
        match arg {
            "-j" | "--jump" | "-g" | "--goto" => {
                let to = value.ok_or_else(|| ctx.reject(n, raw, format!("{arg} without a target")))?;
                if target.replace(to).is_some() {
                    return Err(ctx.reject(n, raw, "more than one target"));
                }
                check_target(ctx, n, raw, to, table)?;
                i += 2;
            }
            "-m" | "--match" => {
                let module = value.ok_or_else(|| ctx.reject(n, raw, "-m without a module"))?;
                if !MODULES.contains(&module) {
                    return Err(ctx.reject(n, raw, format!("match module {module:?} is not allowed")));
                }
                i += 2;
            }
            "--to-destination" => {
                let dest = value.ok_or_else(|| ctx.reject(n, raw, "--to-destination without a value"))?;
                if target != Some("DNAT") {
                    return Err(ctx.reject(n, raw, "--to-destination outside a DNAT target"));
                }
                check_dnat_destination(ctx, n, raw, dest)?;
                i += 2;
            }
            "--to-source" | "--to-ports" | "--to" => {
                return Err(ctx.reject(n, raw, format!("{arg} is not allowed")));
            }
            _ => i += 1,
        }
    }
    if target == Some("DNAT") && !args.iter().any(|a| a == "--to-destination") {
        return Err(ctx.reject(n, raw, "DNAT without --to-destination"));
    }
    Ok(())
}

fn check_target(ctx: &Context, n: usize, raw: &str, to: &str, table: &TableState) -> Result<(), Rejected> {
    if TARGETS.contains(&to) {
        if to == "DNAT" && table.name != "nat" {
            return Err(ctx.reject(n, raw, "DNAT outside the nat table"));
        }
        return Ok(());
    }
    if !to.starts_with(OWN_PREFIX) {
        return Err(ctx.reject(n, raw, format!("target {to:?} is not allowed")));
    }
    let exists =
        table.declared.contains(to) || ctx.existing_chains.get(&table.name).is_some_and(|chains| chains.contains(to));
    if !exists || table.deleted.contains(to) {
        return Err(ctx.reject(n, raw, format!("jump to chain {to}, which neither exists nor is declared")));
    }
    Ok(())
}

fn check_dnat_destination(ctx: &Context, n: usize, raw: &str, dest: &str) -> Result<(), Rejected> {
    let Some(endpoint) = kpx_rules::model::split_host_port(dest) else {
        return Err(ctx.reject(n, raw, format!("DNAT destination {dest:?} is not ADDRESS:PORT")));
    };
    if !ctx.endpoints.contains(&endpoint) {
        return Err(ctx.reject(n, raw, format!("DNAT destination {dest} is not an endpoint of any service")));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
