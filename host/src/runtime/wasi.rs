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
//!   every instance of a process (drawn once at start: a state replayed
//!   into a fresh instance renders the same rules, and another process's
//!   hash seeds cannot be known in advance), at most 4 KiB per call;
//! - these answers are defined with their exact WASI types (a component
//!   that declares them otherwise does not link) and are paid from the
//!   calling instance's fuel, so the host's work for them is bounded like
//!   the plugin's own;
//! - every other function — clocks, sockets, name lookup, files, streams
//!   (stdout and stderr included), polling, exit — traps with a message
//!   naming it. A trap poisons the instance, which the host replaces, as for
//!   any other trap.
//!
//! Only WASI 0.2 functions get answers; other versions of the same
//! interfaces trap. Imports outside `wasi:` and `kpx:proxier` are still
//! refused when the component is linked.

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, LinkerInstance, Resource, ResourceType};
use wasmtime::{Engine, StoreContextMut};

use super::PluginState;

/// The most random bytes one call may ask for (a hash map's seed is 16).
const MAX_RANDOM_BYTES: u64 = 4096;

/// What the process's seed is drawn from (and the seed in unit tests).
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
                    if answered && answer(&mut defining, interface, export)? {
                        continue;
                    }
                    let full = format!("{name}#{export}");
                    defining.func_new(export, move |_, _, _, _| {
                        wasmtime::bail!(
                            "the plugin called {full}: kpx plugins get no clocks, files, sockets or output \
                             (deny-all WASI; log through kpx:proxier/log)"
                        )
                    })?;
                }
                ComponentItem::Resource(_) => defining.resource(export, ResourceType::host::<()>(), |_, _| Ok(()))?,
                _ => {}
            }
        }
    }
    Ok(())
}

/// Fuel a call into the deny-all WASI costs, before its bytes.
const CALL_FUEL: u64 = 1_000;

/// Takes `fuel` from the calling instance's budget (the host's work for
/// the guest is paid like the guest's own): a trap when it runs out.
fn charge(store: &mut StoreContextMut<'_, PluginState>, fuel: u64) -> wasmtime::Result<()> {
    let left = store.get_fuel()?;
    if left < fuel {
        store.set_fuel(0)?;
        wasmtime::bail!("ran out of fuel in a WASI call");
    }
    store.set_fuel(left - fuel)
}

fn random_bytes(mut store: StoreContextMut<'_, PluginState>, len: u64) -> wasmtime::Result<(Vec<u8>,)> {
    if len > MAX_RANDOM_BYTES {
        wasmtime::bail!("asked for {len} random bytes (at most {MAX_RANDOM_BYTES} per call)");
    }
    charge(&mut store, CALL_FUEL + 16 * len)?;
    let state = store.data_mut();
    Ok(((0..len).map(|_| state.next_random() as u8).collect(),))
}

fn random_u64(mut store: StoreContextMut<'_, PluginState>) -> wasmtime::Result<(u64,)> {
    charge(&mut store, CALL_FUEL)?;
    Ok((store.data_mut().next_random(),))
}

/// Defines `function` of `interface` (WASI 0.2) if it is one that answers
/// rather than traps, with its exact type: a component that declares it
/// otherwise fails to link. True when defined.
fn answer(defining: &mut LinkerInstance<'_, PluginState>, interface: &str, function: &str) -> wasmtime::Result<bool> {
    type Store<'a> = StoreContextMut<'a, PluginState>;
    match (interface, function) {
        ("wasi:cli/environment", "get-environment") => defining.func_wrap(function, |mut s: Store<'_>, (): ()| {
            charge(&mut s, CALL_FUEL).map(|()| (Vec::<(String, String)>::new(),))
        })?,
        ("wasi:cli/environment", "get-arguments") => defining.func_wrap(function, |mut s: Store<'_>, (): ()| {
            charge(&mut s, CALL_FUEL).map(|()| (Vec::<String>::new(),))
        })?,
        ("wasi:cli/environment", "initial-cwd") => defining
            .func_wrap(function, |mut s: Store<'_>, (): ()| charge(&mut s, CALL_FUEL).map(|()| (None::<String>,)))?,
        ("wasi:filesystem/preopens", "get-directories") => defining
            .func_wrap(function, |mut s: Store<'_>, (): ()| {
                charge(&mut s, CALL_FUEL).map(|()| (Vec::<(Resource<()>, String)>::new(),))
            })?,
        ("wasi:random/random", "get-random-u64") | ("wasi:random/insecure", "get-insecure-random-u64") => {
            defining.func_wrap(function, |s: Store<'_>, (): ()| random_u64(s))?
        }
        ("wasi:random/random", "get-random-bytes") | ("wasi:random/insecure", "get-insecure-random-bytes") => {
            defining.func_wrap(function, |s: Store<'_>, (len,): (u64,)| random_bytes(s, len))?
        }
        ("wasi:random/insecure-seed", "insecure-seed") => {
            defining.func_wrap(function, |mut s: Store<'_>, (): ()| {
                charge(&mut s, CALL_FUEL)?;
                let state = s.data_mut();
                Ok(((state.next_random(), state.next_random()),))
            })?
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// splitmix64: the instance's next random number from `state`.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
