//! Netlink attributes (nf_tables, rtnetlink, generic netlink): a writer that appends them to a message, and a
//! reader (netlink-packet-core's buffers) that walks them back.

use netlink_packet_core::{NlaBuffer, NlasIterator};

/// The attribute type's nested flag.
pub const NLA_F_NESTED: u16 = 0x8000;
/// The attribute type without its flags.
pub const NLA_TYPE_MASK: u16 = 0x3fff;

/// Appends attributes (type-length-value, 4-byte aligned).
#[derive(Debug, Default, Clone)]
pub struct Writer {
    pub buf: Vec<u8>,
    /// An attribute did not fit netlink's 16-bit length: the attributes
    /// are not to be sent (the writer does not panic on what a plugin's
    /// unchecked output can make of it).
    pub oversized: bool,
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

impl Writer {
    pub fn new() -> Writer {
        Writer { buf: Vec::new(), oversized: false }
    }

    pub fn bytes(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let Ok(len) = u16::try_from(4 + value.len()) else {
            self.oversized = true;
            return self;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        pad(&mut self.buf);
        self
    }

    pub fn u32_be(&mut self, kind: u16, v: u32) -> &mut Self {
        self.bytes(kind, &v.to_be_bytes())
    }

    pub fn u64_be(&mut self, kind: u16, v: u64) -> &mut Self {
        self.bytes(kind, &v.to_be_bytes())
    }

    /// Host order (generic netlink's integers).
    pub fn u16_ne(&mut self, kind: u16, v: u16) -> &mut Self {
        self.bytes(kind, &v.to_ne_bytes())
    }

    /// Host order (generic netlink's integers).
    pub fn u32_ne(&mut self, kind: u16, v: u32) -> &mut Self {
        self.bytes(kind, &v.to_ne_bytes())
    }

    /// A NUL-terminated string.
    pub fn str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.bytes(kind, &v)
    }

    /// A nested attribute whose contents `f` writes.
    pub fn nested(&mut self, kind: u16, f: impl FnOnce(&mut Writer)) -> &mut Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0, 0, 0]);
        let mut inner = Writer { buf: std::mem::take(&mut self.buf), oversized: self.oversized };
        f(&mut inner);
        self.buf = inner.buf;
        self.oversized = inner.oversized;
        let Ok(len) = u16::try_from(self.buf.len() - start) else {
            self.oversized = true;
            return self;
        };
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }
}

/// One attribute read back.
#[derive(Debug, Clone, Copy)]
pub struct Attr<'a> {
    pub kind: u16,
    pub value: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn u32_be(&self) -> Result<u32, String> {
        let b: [u8; 4] = self.value.try_into().map_err(|_| format!("attribute {} is not 4 bytes", self.kind))?;
        Ok(u32::from_be_bytes(b))
    }

    pub fn u64_be(&self) -> Result<u64, String> {
        let b: [u8; 8] = self.value.try_into().map_err(|_| format!("attribute {} is not 8 bytes", self.kind))?;
        Ok(u64::from_be_bytes(b))
    }

    /// A NUL-terminated string (the NUL and anything after it left out).
    pub fn string(&self) -> Result<String, String> {
        let end = self.value.iter().position(|b| *b == 0).unwrap_or(self.value.len());
        String::from_utf8(self.value[..end].to_vec()).map_err(|_| format!("attribute {} is not UTF-8", self.kind))
    }

    pub fn nested(&self) -> Result<Vec<Attr<'a>>, String> {
        attrs(self.value)
    }
}

/// The attributes in `buf`.
pub fn attrs(buf: &[u8]) -> Result<Vec<Attr<'_>>, String> {
    let mut out = Vec::new();
    for nla in NlasIterator::new(buf) {
        let nla: NlaBuffer<&[u8]> = nla.map_err(|e| format!("malformed attribute: {e}"))?;
        let kind = nla.kind() & NLA_TYPE_MASK;
        let len = nla.value_length();
        let value = &nla.into_inner()[4..4 + len];
        out.push(Attr { kind, value });
    }
    Ok(out)
}

/// The first attribute of a kind.
pub fn find<'a>(attrs: &[Attr<'a>], kind: u16) -> Option<Attr<'a>> {
    attrs.iter().find(|a| a.kind == kind).copied()
}

/// The first attribute of a kind, or an error naming what lacks it.
pub fn need<'a>(attrs: &[Attr<'a>], kind: u16, what: &str) -> Result<Attr<'a>, String> {
    find(attrs, kind).ok_or_else(|| format!("{what} has no attribute {kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attribute past netlink's 16-bit length marks the writer instead
    /// of panicking (a plugin's unchecked output reaches the encoder).
    #[test]
    fn an_attribute_over_64_kib_marks_the_writer() {
        let mut w = Writer::new();
        w.str(1, "ok");
        assert!(!w.oversized);
        w.bytes(2, &vec![0; 70_000]);
        assert!(w.oversized);
        let mut n = Writer::new();
        n.nested(3, |w| {
            for _ in 0..20 {
                w.bytes(1, &[0; 4000]);
            }
        });
        assert!(n.oversized, "a nested attribute of 80 KB");
    }

    #[test]
    fn nested_attributes_round_trip() {
        let mut w = Writer::new();
        w.str(1, "kube-proxy").nested(4, |w| {
            w.u32_be(1, 0).u32_be(2, (-100i32) as u32);
        });
        let top = attrs(&w.buf).unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].string().unwrap(), "kube-proxy");
        let hook = top[1].nested().unwrap();
        assert_eq!(hook[1].u32_be().unwrap() as i32, -100);
    }
}
