//! `memcmp` for WebAssembly guests, eight bytes at a time.
//!
//! The Rust toolchain's own `memcmp` for wasm32 (compiler_builtins, linked
//! weakly, so this strong definition replaces it in every plugin built on
//! the SDK) compares one byte per loop iteration. Generators compare keys
//! all the time (service keys in ordered maps, element keys in the
//! nftables registry): in the nftables generator's reset at 10k Services
//! a fifth of the time went there. [`compare`] takes a word of eight
//! bytes per step and finds the first differing byte from the XOR of the
//! words, read little-endian (so the lowest differing byte is the
//! first). It returns what C's `memcmp` returns: the difference of the
//! first differing bytes as unsigned values, or 0.
//!
//! The symbols are the SDK's: a plugin that also links C code with its
//! own strong `memcmp`, or two incompatible versions of the SDK, fails to
//! link with a duplicate symbol.

/// C's `memcmp` over two equally long slices.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
pub fn compare(a: &[u8], b: &[u8]) -> i32 {
    debug_assert_eq!(a.len(), b.len());
    let (mut words_a, mut words_b) = (a.chunks_exact(8), b.chunks_exact(8));
    for (x, y) in words_a.by_ref().zip(words_b.by_ref()) {
        let (x, y) = (u64::from_le_bytes(x.try_into().unwrap()), u64::from_le_bytes(y.try_into().unwrap()));
        if x != y {
            // The lowest differing byte, taken from the words themselves.
            let shift = (x ^ y).trailing_zeros() & !7;
            return i32::from((x >> shift) as u8) - i32::from((y >> shift) as u8);
        }
    }
    for (x, y) in words_a.remainder().iter().zip(words_b.remainder()) {
        if x != y {
            return i32::from(*x) - i32::from(*y);
        }
    }
    0
}

/// # Safety
///
/// `a` and `b` must be valid for reads of `n` initialized bytes, `n` at
/// most `isize::MAX`, as C's `memcmp` requires.
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    if n == 0 {
        return 0;
    }
    // SAFETY: the caller's promise: both are readable for n > 0 bytes.
    unsafe { compare(core::slice::from_raw_parts(a, n), core::slice::from_raw_parts(b, n)) }
}

/// What LLVM calls when only equality matters.
///
/// # Safety
///
/// As [`memcmp`].
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's promise, passed on.
    unsafe { memcmp(a, b, n) }
}

#[cfg(test)]
mod tests {
    use super::compare;

    fn sign(x: i32) -> std::cmp::Ordering {
        x.cmp(&0)
    }

    #[test]
    fn orders_as_unsigned_bytes_at_every_position_and_length() {
        for len in 0..40usize {
            let base: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            assert_eq!(compare(&base, &base), 0);
            for at in 0..len {
                for (x, y) in [(0u8, 0xff_u8), (0x7f, 0x80), (0x80, 0x7f), (1, 0), (0xff, 0xfe)] {
                    let (mut a, mut b) = (base.clone(), base.clone());
                    a[at] = x;
                    b[at] = y;
                    // A later difference must not matter.
                    if at + 1 < len {
                        a[len - 1] = 0;
                        b[len - 1] = 0xff;
                    }
                    let got = compare(&a, &b);
                    assert_eq!(sign(got), a.cmp(&b), "len {len} at {at}: {x:#x} vs {y:#x}");
                    if x != y {
                        assert_eq!(got, i32::from(x) - i32::from(y));
                    }
                }
            }
        }
    }
}
