//! A generic-netlink socket: resolves a family by name, sends requests
//! and waits for their acknowledgement, and reads dumps.

use std::os::fd::AsFd;

use netlink_packet_core::{ErrorBuffer, NetlinkBuffer};
use netlink_sys::{Socket, protocols::NETLINK_GENERIC};

use crate::kernel::nla::{Writer, attrs, find};

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const HEADER: usize = 16;
const GENL_HEADER: usize = 4;
const REPLY_TIMEOUT_SECS: i64 = 30;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The kernel has no such generic-netlink family (for IPVS: no ip_vs).
    #[error("the kernel has no {0} generic netlink family")]
    NoFamily(String),
    #[error("generic netlink: {0}")]
    Socket(String),
    /// The kernel refused a request.
    #[error("the kernel refused {op}: {} (errno {errno})", std::io::Error::from_raw_os_error(*errno))]
    Refused { op: String, errno: i32 },
    #[error("generic netlink: unreadable reply: {0}")]
    Protocol(String),
}

/// One generic-netlink message: netlink header, genetlink header, attributes.
pub fn message(family: u16, flags: u16, seq: u32, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    let len = (HEADER + GENL_HEADER + attrs.len()) as u32;
    let mut buf = Vec::with_capacity(len as usize);
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&family.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[cmd, version, 0, 0]);
    buf.extend_from_slice(attrs);
    buf
}

pub struct Genl {
    socket: Socket,
    seq: u32,
    family: u16,
    version: u8,
}

impl Genl {
    /// A socket for the family `name` (speaking `version`).
    pub fn open(name: &str, version: u8) -> Result<Genl, Error> {
        let err = |what: &str, e: std::io::Error| Error::Socket(format!("{what}: {e}"));
        let mut socket = Socket::new(NETLINK_GENERIC).map_err(|e| err("socket", e))?;
        socket.bind_auto().map_err(|e| err("bind", e))?;
        let timeout = nix::sys::time::TimeVal::new(REPLY_TIMEOUT_SECS, 0);
        nix::sys::socket::setsockopt(&socket.as_fd(), nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| err("receive timeout", e.into()))?;
        let mut genl = Genl { socket, seq: std::process::id().wrapping_mul(7919), family: GENL_ID_CTRL, version: 1 };
        let mut w = Writer::new();
        w.str(CTRL_ATTR_FAMILY_NAME, name);
        let replies = match genl.exchange(CTRL_CMD_GETFAMILY, NLM_F_REQUEST, &w, "the family lookup") {
            Err(Error::Refused { errno: 2, .. }) => return Err(Error::NoFamily(name.to_string())),
            other => other?,
        };
        let id = replies
            .iter()
            .find_map(|p| attrs(p).ok().and_then(|a| find(&a, CTRL_ATTR_FAMILY_ID)))
            .and_then(|a| a.value.get(..2).map(|b| u16::from_ne_bytes([b[0], b[1]])))
            .ok_or_else(|| Error::Protocol(format!("no id for family {name}")))?;
        genl.family = id;
        genl.version = version;
        Ok(genl)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends one command and waits for its acknowledgement.
    pub fn request(&mut self, cmd: u8, attrs: &Writer, op: &str) -> Result<(), Error> {
        self.exchange(cmd, NLM_F_REQUEST | NLM_F_ACK, attrs, op).map(drop)
    }

    /// Dumps: the attributes of every reply. Restarted when interrupted.
    pub fn dump(&mut self, cmd: u8, attrs: &Writer, op: &str) -> Result<Vec<Vec<u8>>, Error> {
        for _ in 0..5 {
            match self.exchange(cmd, NLM_F_REQUEST | NLM_F_DUMP, attrs, op) {
                Err(Error::Protocol(m)) if m == "interrupted" => continue,
                other => return other,
            }
        }
        Err(Error::Protocol(format!("{op}: the table kept changing during five dumps")))
    }

    /// Sends a message and collects the payloads (after the genetlink
    /// header) of its replies until the ack, the end of the dump, or (for
    /// a plain request without ack) the first reply.
    fn exchange(&mut self, cmd: u8, flags: u16, attrs: &Writer, op: &str) -> Result<Vec<Vec<u8>>, Error> {
        let seq = self.next_seq();
        let buf = message(self.family, flags, seq, cmd, self.version, &attrs.buf);
        self.socket.send(&buf, 0).map_err(|e| Error::Socket(format!("send: {e}")))?;
        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            let mut rbuf: Vec<u8> = Vec::with_capacity(1 << 16);
            let n = self.socket.recv(&mut rbuf, 0).map_err(|e| Error::Socket(format!("receive ({op}): {e}")))?;
            let mut at = 0;
            while at + HEADER <= n.min(rbuf.len()) {
                let msg = NetlinkBuffer::new_checked(&rbuf[at..]).map_err(|e| Error::Protocol(e.to_string()))?;
                let len = msg.length() as usize;
                if len < HEADER {
                    return Err(Error::Protocol("a message shorter than its header".into()));
                }
                at += (len + 3) & !3;
                if msg.sequence_number() != seq {
                    continue;
                }
                interrupted |= msg.flags() & NLM_F_DUMP_INTR != 0;
                match msg.message_type() {
                    NLMSG_ERROR => {
                        let e = ErrorBuffer::new_checked(msg.payload()).map_err(|e| Error::Protocol(e.to_string()))?;
                        return match e.code() {
                            Some(code) => Err(Error::Refused { op: op.to_string(), errno: -code.get() }),
                            None => Ok(out),
                        };
                    }
                    NLMSG_DONE if interrupted => return Err(Error::Protocol("interrupted".into())),
                    NLMSG_DONE => {
                        // A dump that failed part-way says so here.
                        let code = msg.payload().get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        return match code {
                            Some(c) if c < 0 => Err(Error::Refused { op: op.to_string(), errno: -c }),
                            _ => Ok(out),
                        };
                    }
                    _ => {
                        let payload = msg.payload();
                        if payload.len() >= GENL_HEADER {
                            out.push(payload[GENL_HEADER..].to_vec());
                        }
                        if flags & (NLM_F_ACK | NLM_F_DUMP) == 0 {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_lookup_bytes() {
        let mut w = Writer::new();
        w.str(CTRL_ATTR_FAMILY_NAME, "IPVS");
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            32, 0, 0, 0,        // length: 16 + 4 + 12
            0x10, 0,            // GENL_ID_CTRL
            1, 0,               // NLM_F_REQUEST
            7, 0, 0, 0,         // seq
            0, 0, 0, 0,         // port id
            3, 1, 0, 0,         // CTRL_CMD_GETFAMILY, version 1
            9, 0, 2, 0, b'I', b'P', b'V', b'S', 0, 0, 0, 0, // CTRL_ATTR_FAMILY_NAME "IPVS\0"
        ];
        assert_eq!(message(GENL_ID_CTRL, NLM_F_REQUEST, 7, CTRL_CMD_GETFAMILY, 1, &w.buf), want);
    }

    /// The control family answers; a family that does not exist is
    /// reported as such (this kernel has no ip_vs: IPVS is one).
    #[test]
    fn resolves_families_and_reports_missing_ones() {
        assert!(Genl::open("nlctrl", 2).is_ok());
        match Genl::open("kpx-nofamily", 1) {
            Err(Error::NoFamily(name)) => assert_eq!(name, "kpx-nofamily"),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
