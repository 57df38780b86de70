//! One netlink socket of the ipvs dataplane (generic netlink for IPVS,
//! rtnetlink for kube-ipvs0): a request out, its replies back, the
//! kernel's errors as they are.

use std::os::fd::AsFd;

use netlink_packet_core::{ErrorBuffer, NetlinkBuffer};
use netlink_sys::Socket;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `struct nlmsghdr`.
pub const HEADER: usize = 16;
const REPLY_TIMEOUT_SECS: i64 = 30;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The kernel has no such generic-netlink family (for IPVS: no ip_vs).
    #[error("the kernel has no {0} generic netlink family")]
    NoFamily(String),
    #[error("netlink: {0}")]
    Socket(String),
    /// The kernel refused a request.
    #[error("the kernel refused {op}: {} (errno {errno})", std::io::Error::from_raw_os_error(*errno))]
    Refused { op: String, errno: i32 },
    /// A dump the kernel interrupted (its table changed): ask again.
    #[error("netlink: {0} was interrupted by a change")]
    Interrupted(String),
    #[error("netlink: unreadable reply: {0}")]
    Protocol(String),
}

/// One message: the netlink header (`nlmsghdr`, port id 0) and `body`.
pub fn encode(msg_type: u16, flags: u16, seq: u32, body: &[&[u8]]) -> Vec<u8> {
    let len = HEADER + body.iter().map(|b| b.len()).sum::<usize>();
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&msg_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    body.iter().for_each(|b| buf.extend_from_slice(b));
    buf
}

pub struct Channel {
    socket: Socket,
    seq: u32,
}

impl Channel {
    /// A socket of a netlink `protocol`, bound, with a reply timeout.
    pub fn open(protocol: isize) -> Result<Channel, Error> {
        let err = |what: &str, e: std::io::Error| Error::Socket(format!("{what}: {e}"));
        let mut socket = Socket::new(protocol).map_err(|e| err("socket", e))?;
        socket.bind_auto().map_err(|e| err("bind", e))?;
        let timeout = nix::sys::time::TimeVal::new(REPLY_TIMEOUT_SECS, 0);
        nix::sys::socket::setsockopt(&socket.as_fd(), nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| err("receive timeout", e.into()))?;
        Ok(Channel { socket, seq: std::process::id().wrapping_mul(7919) })
    }

    /// Sends one message (the netlink header, then `body`) and returns
    /// the payloads of its replies until the ack, the end of the dump, or
    /// (for a plain request, no ack and no dump) the first reply.
    pub fn exchange(&mut self, msg_type: u16, flags: u16, body: &[&[u8]], op: &str) -> Result<Vec<Vec<u8>>, Error> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let buf = encode(msg_type, flags, seq, body);
        self.socket.send(&buf, 0).map_err(|e| Error::Socket(format!("send ({op}): {e}")))?;
        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            let mut rbuf: Vec<u8> = Vec::with_capacity(1 << 16);
            let n = self.socket.recv(&mut rbuf, 0).map_err(|e| Error::Socket(format!("receive ({op}): {e}")))?;
            let mut at = 0;
            while at + HEADER <= n.min(rbuf.len()) {
                let msg = NetlinkBuffer::new_checked(&rbuf[at..]).map_err(|e| Error::Protocol(e.to_string()))?;
                let mlen = msg.length() as usize;
                if mlen < HEADER {
                    return Err(Error::Protocol("a message shorter than its header".into()));
                }
                at += (mlen + 3) & !3;
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
                    NLMSG_DONE if interrupted => return Err(Error::Interrupted(op.to_string())),
                    NLMSG_DONE => {
                        // A dump that failed part-way says so here.
                        let code = msg.payload().get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        return match code {
                            Some(c) if c < 0 => Err(Error::Refused { op: op.to_string(), errno: -c }),
                            _ => Ok(out),
                        };
                    }
                    _ => {
                        out.push(msg.payload().to_vec());
                        if flags & (NLM_F_ACK | NLM_F_DUMP) == 0 {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }
}
