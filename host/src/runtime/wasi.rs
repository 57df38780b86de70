//! Deny-all WASI for components built for wasm32-wasip2 by other
//! toolchains, whose standard libraries import WASI 0.2 whether or not the
//! plugin uses it.
//!
//! kpx's own components import nothing but `kpx:proxier`, and get a linker
//! with nothing else. A component that imports `wasi:*` interfaces gets, on
//! a copy of that linker, a definition for each function it imports:
//!
//! - the environment, the arguments and the preopened directories are
//!   empty, and there is no working directory: opening a file fails as it
//!   would in an empty sandbox;
//! - the random interfaces answer from a generator seeded the same way in
//!   every instance, so that a state replayed into a fresh instance renders
//!   the same rules (hash maps need a seed; nothing in a proxy plugin needs
//!   a secret);
//! - every other function — clocks, sockets, name lookup, files, streams
//!   (stdout and stderr included), polling, exit — traps with a message
//!   naming it. A trap poisons the instance, which the host replaces, as for
//!   any other trap.
//!
//! Only WASI 0.2 functions get answers; other versions of the same
//! interfaces trap. Imports outside `wasi:` and `kpx:proxier` are still
//! refused when the component is linked.

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceType, Val};
use wasmtime::{Engine, StoreContextMut};

use super::PluginState;

/// The most random bytes one call may ask for.
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The seed of every instance's random numbers.
pub const RANDOM_SEED: u64 = 0x6b70_785f_7761_7369;

/// Whether `component` imports any WASI interface.
pub fn imports_wasi(engine: &Engine, component: &Component) -> bool {
    component.component_type().imports(engine).any(|(name, _)| name.starts_with("wasi:"))
}

/// Defines every WASI function `component` imports, as the module's
/// documentation says, on `linker`.
pub fn deny_all(linker: &mut Linker<PluginState>, engine: &Engine, component: &Component) -> wasmtime::Result<()> {
    for (name, item) in component.component_type().imports(engine) {
        if !name.starts_with("wasi:") {
            continue;
        }
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            wasmtime::bail!("imports `{name}`, which is not a WASI interface kpx knows");
        };
        let (interface, version) = name.split_once('@').unwrap_or((name, ""));
        let answered = version.starts_with("0.2.");
        let mut defining = linker.instance(name)?;
        for (export, item) in instance.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) => {
                    let answer = if answered { answer(interface, export) } else { None };
                    let full = format!("{name}#{export}");
                    match answer {
                        Some(answer) => defining.func_new(export, move |store, _, params, results| {
                            answer(store, params, results).map_err(|e| wasmtime::format_err!("{full}: {e}"))
                        })?,
                        None => defining.func_new(export, move |_, _, _, _| {
                            wasmtime::bail!(
                                "the plugin called {full}: kpx plugins get no clocks, files, sockets or output \
                                 (deny-all WASI; log through kpx:proxier/log)"
                            )
                        })?,
                    }
                }
                ComponentItem::Resource(_) => defining.resource(export, ResourceType::host::<()>(), |_, _| Ok(()))?,
                _ => {}
            }
        }
    }
    Ok(())
}

type Answer = fn(StoreContextMut<'_, PluginState>, &[Val], &mut [Val]) -> wasmtime::Result<()>;

/// The WASI 0.2 functions that answer instead of trapping.
fn answer(interface: &str, function: &str) -> Option<Answer> {
    let answer: Answer = match (interface, function) {
        ("wasi:cli/environment", "get-environment" | "get-arguments")
        | ("wasi:filesystem/preopens", "get-directories") => |_, _, results| set(results, Val::List(Vec::new())),
        ("wasi:cli/environment", "initial-cwd") => |_, _, results| set(results, Val::Option(None)),
        ("wasi:random/random", "get-random-u64") | ("wasi:random/insecure", "get-insecure-random-u64") => {
            |mut store, _, results| set(results, Val::U64(store.data_mut().next_random()))
        }
        ("wasi:random/random", "get-random-bytes") | ("wasi:random/insecure", "get-insecure-random-bytes") => {
            |mut store, params, results| {
                let len = match params {
                    [Val::U64(len)] => *len,
                    _ => wasmtime::bail!("unexpected parameters {params:?}"),
                };
                if len > MAX_RANDOM_BYTES {
                    wasmtime::bail!("asked for {len} random bytes (at most {MAX_RANDOM_BYTES})");
                }
                let state = store.data_mut();
                let bytes = (0..len).map(|_| Val::U8(state.next_random() as u8)).collect();
                set(results, Val::List(bytes))
            }
        }
        ("wasi:random/insecure-seed", "insecure-seed") => |mut store, _, results| {
            let state = store.data_mut();
            let seed = Val::Tuple(vec![Val::U64(state.next_random()), Val::U64(state.next_random())]);
            set(results, seed)
        },
        _ => return None,
    };
    Some(answer)
}

fn set(results: &mut [Val], value: Val) -> wasmtime::Result<()> {
    match results {
        [slot] => {
            *slot = value;
            Ok(())
        }
        _ => wasmtime::bail!("expected one result, the import has {}", results.len()),
    }
}

/// splitmix64: the instance's next random number from `state`.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
