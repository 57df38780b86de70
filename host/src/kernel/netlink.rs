//! Netlink, the one stack under every kernel read and write kpx makes
//! without a tool: one [`Socket`] (a request or a batch out, the replies
//! addressed to it back), one receive loop ([`Socket::receive_until`])
//! with its sequence checks, acks and errors, one [`Error`] carrying the
//! kernel's errno, one [`HEADER`].
//!
//! Over it: [`nfnl`] (nfnetlink: nf_tables batches and dumps, ctnetlink,
//! nfacct), [`genl`] (generic netlink: IPVS), [`route`] (rtnetlink:
//! kube-ipvs0 in `ipvs/link.rs`, the node's addresses in
//! `interfaces.rs`), and [`nla`] (attributes, written and read back).
//!
//! Why one hand-written loop over netlink-sys (the socket) and
//! netlink-packet-core (its buffers and constants), and no other crate:
//! - no maintained crate sends nf_tables batches synchronously. A
//!   transaction is one gathered `sendmsg` (9 MB for a full sync at 10k
//!   Services) between BATCH_BEGIN and BATCH_END, acked on its last
//!   message only, refusals named by the kernel's extended-ack message,
//!   and replies to earlier batches skipped by their sequence numbers
//!   ([`nfnl::Nfnl::transact`]);
//! - `rtnetlink` and `netlink-proto` are async (tokio): they would put a
//!   runtime under the sync thread and hide the acks the reliability
//!   notes rely on;
//! - `neli` is a second stack, with its own socket and message types: it
//!   would replace this one, not remove a copy;
//! - `netlink-packet-generic` needs another netlink-packet-core than the
//!   one kpx builds with, and IPVS and nf_tables messages have no
//!   maintained crate at all.

pub mod genl;
pub mod nfnl;
pub mod nla;
pub mod route;

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use netlink_packet_core::{ErrorBuffer, NLM_F_ACK_TLVS, NetlinkBuffer};
pub use netlink_packet_core::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_DONE,
    NLMSG_ERROR,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

/// `struct nlmsghdr`: length, type, flags, sequence number, port id.
pub const HEADER: usize = 16;

/// How long the kernel may take to answer a request, a batch or a dump's
/// next part (a batch of 300k elements is answered in well under a second).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times a dump the kernel interrupts (its table changed under
/// it) is asked for.
const DUMP_ATTEMPTS: usize = 5;

/// Extended-ack attribute: the kernel's message.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// Error texts of an nfnetlink socket.
const NFNETLINK: &str = "nf_tables netlink";
/// Error texts of the other sockets.
const NETLINK: &str = "netlink";

/// Why netlink failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The socket itself failed (no such netlink protocol? no reply in
    /// time?): the caller opens another; a sync is retried in full.
    /// `stack` says which netlink, as error texts name it.
    #[error("{stack}: {reason}")]
    Socket { stack: &'static str, reason: String },
    /// The kernel refused an operation (of an nf_tables batch: nothing of
    /// the batch was applied), with its errno and extended-ack message.
    #[error("the kernel refused {op}: {}{}", errno_text(*errno), message.as_ref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Refused { op: String, errno: i32, message: Option<String> },
    /// A dump the kernel interrupted (its table changed): ask again.
    #[error("netlink: {0} was interrupted by a change")]
    Interrupted(String),
    /// The kernel has no such generic-netlink family (for IPVS: no ip_vs).
    #[error("the kernel has no {0} generic netlink family")]
    NoFamily(String),
    /// A reply kpx cannot read.
    #[error("{stack}: unreadable reply: {reason}")]
    Protocol { stack: &'static str, reason: String },
}

impl Error {
    /// The kernel's errno, when it refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// The kernel has no such object (ENOENT; knftables' `IsNotFound`).
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(nix::libc::ENOENT)
    }

    /// The object exists already (EEXIST; knftables' `IsAlreadyExists`).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(nix::libc::EEXIST)
    }

    /// A reply kpx cannot read, for `reason`.
    pub fn protocol(reason: String) -> Error {
        Error::Protocol { stack: NETLINK, reason }
    }
}

fn errno_text(errno: i32) -> String {
    format!("{} (errno {errno})", std::io::Error::from_raw_os_error(errno))
}

/// Appends a netlink header (port id 0) for a message of `len` bytes,
/// this header included.
pub fn push_header(buf: &mut Vec<u8>, msg_type: u16, flags: u16, seq: u32, len: usize) {
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&msg_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
}

/// One message: the netlink header, then `body`'s parts.
pub fn encode(msg_type: u16, flags: u16, seq: u32, body: &[&[u8]]) -> Vec<u8> {
    let len = HEADER + body.iter().map(|b| b.len()).sum::<usize>();
    let mut buf = Vec::with_capacity(len);
    push_header(&mut buf, msg_type, flags, seq, len);
    body.iter().for_each(|b| buf.extend_from_slice(b));
    buf
}

/// One reply message: (type, flags, seq, payload after the netlink header).
pub type Reply = (u16, u16, u32, Vec<u8>);

/// The messages of one datagram the kernel sent, in order: (type, flags,
/// sequence number, payload) each. A message whose length is shorter
/// than its header or runs past the datagram ends it with an error.
fn messages<'a>(buf: &'a [u8]) -> impl Iterator<Item = Result<(u16, u16, u32, &'a [u8]), String>> + 'a {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + HEADER > buf.len() {
            return None;
        }
        match NetlinkBuffer::new_checked(&buf[at..]) {
            Err(e) => {
                at = buf.len();
                Some(Err(e.to_string()))
            }
            Ok(msg) => {
                // At least a header: new_checked refuses a shorter length.
                at += (msg.length() as usize + 3) & !3;
                Some(Ok((msg.message_type(), msg.flags(), msg.sequence_number(), msg.payload())))
            }
        }
    })
}

/// [`Socket::receive_until`]'s split of a datagram, each payload copied
/// (the fuzz target reads datagrams through it).
pub fn split_replies(buf: &[u8]) -> Result<Vec<Reply>, Error> {
    messages(buf).map(|m| m.map(|(t, f, s, p)| (t, f, s, p.to_vec())).map_err(Error::protocol)).collect()
}

/// An NLMSG_ERROR payload: (code, extended-ack message). The socket caps
/// acks, so the failed request's header (16 bytes) precedes the TLVs.
pub fn parse_error(payload: &[u8], flags: u16) -> Result<(i32, Option<String>), Error> {
    error_of(payload, flags).map_err(Error::protocol)
}

/// [`parse_error`], its error the reason.
fn error_of(payload: &[u8], flags: u16) -> Result<(i32, Option<String>), String> {
    let err = ErrorBuffer::new_checked(payload).map_err(|e| e.to_string())?;
    let code = err.code().map_or(0, |c| c.get());
    let inner = err.payload();
    let message = (flags & NLM_F_ACK_TLVS != 0 && inner.len() > HEADER)
        .then(|| nla::attrs(&inner[HEADER..]).ok())
        .flatten()
        .and_then(|attrs| nla::find(&attrs, NLMSGERR_ATTR_MSG))
        .and_then(|a| a.string().ok())
        .filter(|s| !s.is_empty());
    Ok((code, message))
}

/// [`parse_error`] on a socket whose errors `stack` names.
fn read_error(payload: &[u8], flags: u16, stack: &'static str) -> Result<(i32, Option<String>), Error> {
    error_of(payload, flags).map_err(|reason| Error::Protocol { stack, reason })
}

/// A dump whose end carried an errno (it failed part-way) as refused.
pub fn check_end(errno: i32, op: &str) -> Result<(), Error> {
    match errno {
        0 => Ok(()),
        errno => Err(Error::Refused { op: op.to_string(), errno, message: None }),
    }
}

/// A netlink socket of one protocol, bound, with a reply timeout.
pub struct Socket {
    socket: netlink_sys::Socket,
    /// The last sequence number given.
    seq: u32,
    /// The send buffer set for the largest send so far (0: the kernel's).
    sndbuf: usize,
    timeout: Duration,
    /// Which netlink, as error texts name it.
    stack: &'static str,
}

impl Socket {
    /// A socket of a netlink `protocol` (`netlink_sys::protocols`), bound,
    /// whose replies are waited for `timeout` at most.
    pub fn open(protocol: isize, timeout: Duration) -> Result<Socket, Error> {
        let stack = if protocol == NETLINK_NETFILTER { NFNETLINK } else { NETLINK };
        let err = |what: &str, e: std::io::Error| Error::Socket { stack, reason: format!("{what}: {e}") };
        let mut socket = netlink_sys::Socket::new(protocol).map_err(|e| err("socket", e))?;
        socket.bind_auto().map_err(|e| err("bind", e))?;
        // A reply that never comes must not stall the sync thread.
        // Microseconds kept, and never zero: a zero timeout would mean
        // waiting for ever.
        let timeout_us = timeout.as_micros().max(1);
        let timeval = nix::sys::time::TimeVal::new(
            (timeout_us / 1_000_000) as nix::libc::time_t,
            (timeout_us % 1_000_000) as nix::libc::suseconds_t,
        );
        nix::sys::socket::setsockopt(&socket.as_fd(), nix::sys::socket::sockopt::ReceiveTimeout, &timeval)
            .map_err(|e| err("receive timeout", e.into()))?;
        Ok(Socket { socket, seq: std::process::id().wrapping_mul(1000), sndbuf: 0, timeout, stack })
    }

    /// Errors with the kernel's message (extended acks), each carrying the
    /// failed request's header only, not all of it (capped acks).
    pub fn extended_acks(&mut self) -> Result<(), Error> {
        self.socket.set_ext_ack(true).map_err(|e| self.fail(format!("extended acks: {e}")))?;
        self.socket.set_cap_ack(true).map_err(|e| self.fail(format!("capped acks: {e}")))
    }

    /// A receive buffer of `bytes`, past the system's limit (as root; a
    /// best effort).
    pub fn force_receive_buffer(&mut self, bytes: usize) {
        let _ = nix::sys::socket::setsockopt(&self.socket.as_fd(), nix::sys::socket::sockopt::RcvBufForce, &bytes);
    }

    /// Which netlink, as error texts name it.
    pub fn stack(&self) -> &'static str {
        self.stack
    }

    /// The next sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// The last sequence number given.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    fn fail(&self, reason: String) -> Error {
        Error::Socket { stack: self.stack, reason }
    }

    /// Messages in one send, their parts gathered by the kernel (it reads
    /// an nf_tables batch from one message): the send buffer grows to
    /// take them.
    pub fn send(&mut self, parts: &[&[u8]]) -> Result<(), Error> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.ensure_sndbuf(len)?;
        let iov: Vec<std::io::IoSlice> = parts.iter().map(|p| std::io::IoSlice::new(p)).collect();
        let sent = nix::sys::socket::sendmsg::<()>(
            self.socket.as_raw_fd(),
            &iov,
            &[],
            nix::sys::socket::MsgFlags::empty(),
            None,
        )
        .map_err(|e| self.fail(format!("send: {e}")))?;
        if sent != len {
            return Err(self.fail(format!("sent {sent} of {len} bytes")));
        }
        Ok(())
    }

    fn ensure_sndbuf(&mut self, len: usize) -> Result<(), Error> {
        let want = len + (64 << 10);
        if want <= self.sndbuf {
            return Ok(());
        }
        // The kernel takes a batch in one send, up to the socket's buffer.
        nix::sys::socket::setsockopt(&self.socket.as_fd(), nix::sys::socket::sockopt::SndBufForce, &want)
            .or_else(|_| nix::sys::socket::setsockopt(&self.socket.as_fd(), nix::sys::socket::sockopt::SndBuf, &want))
            .map_err(|e| self.fail(format!("send buffer of {want} bytes: {e}")))?;
        self.sndbuf = want;
        Ok(())
    }

    /// The receive loop: reads datagrams and hands `on` each of their
    /// messages in order, as (type, flags, sequence number, payload),
    /// until `on` returns a value or an error. Replies to other requests
    /// (late ones, to a request given up on) are `on`'s to skip. No reply
    /// within the socket's timeout is an error.
    pub fn receive_until<T>(
        &mut self,
        mut on: impl FnMut(u16, u16, u32, &[u8]) -> Result<Option<T>, Error>,
    ) -> Result<T, Error> {
        let (stack, secs) = (self.stack, self.timeout.as_secs());
        loop {
            let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
            let n = self.socket.recv(&mut buf, 0).map_err(|e| match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    Error::Socket { stack, reason: format!("no reply from the kernel within {secs} s") }
                }
                _ => Error::Socket { stack, reason: format!("receive: {e}") },
            })?;
            for m in messages(&buf[..n.min(buf.len())]) {
                let (msg_type, flags, seq, payload) = m.map_err(|reason| Error::Protocol { stack, reason })?;
                if let Some(value) = on(msg_type, flags, seq, payload)? {
                    return Ok(value);
                }
            }
        }
    }

    /// Sends one request (the netlink header, then `body`'s parts) and
    /// reads its replies: `each` gets the type and payload of every one
    /// but the ack, an error and the dump's end, until the kernel acks
    /// the request, ends its dump, refuses it ([`Error::Refused`], named
    /// `op`), or (a request that asks for neither an ack nor a dump)
    /// answers once. A dump the kernel marks interrupted (its table
    /// changed under it) is read to its end, then [`Error::Interrupted`].
    /// An error of `each` ends the wait as an unreadable reply. Returns
    /// the errno the dump's end carried (it failed part-way), else 0.
    pub fn request(
        &mut self,
        msg_type: u16,
        flags: u16,
        body: &[&[u8]],
        op: &str,
        mut each: impl FnMut(u16, &[u8]) -> std::result::Result<(), String>,
    ) -> Result<i32, Error> {
        let seq = self.next_seq();
        let buf = encode(msg_type, flags, seq, body);
        self.socket.send(&buf, 0).map_err(|e| self.fail(format!("send ({op}): {e}")))?;
        let ends = flags & (NLM_F_ACK | NLM_F_DUMP) != 0;
        let stack = self.stack;
        let mut interrupted = false;
        self.receive_until(|reply_type, reply_flags, reply_seq, payload| {
            if reply_seq != seq {
                return Ok(None);
            }
            interrupted |= reply_flags & NLM_F_DUMP_INTR != 0;
            match reply_type {
                NLMSG_ERROR => {
                    let (code, message) = read_error(payload, reply_flags, stack)?;
                    if code != 0 {
                        Err(Error::Refused { op: op.to_string(), errno: code.wrapping_neg(), message })
                    } else if interrupted {
                        Err(Error::Interrupted(op.to_string()))
                    } else {
                        Ok(Some(0))
                    }
                }
                NLMSG_DONE if interrupted => Err(Error::Interrupted(op.to_string())),
                NLMSG_DONE => {
                    // A dump that failed part-way says so here.
                    let code = payload.get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                    Ok(Some(if code < 0 { code.wrapping_neg() } else { 0 }))
                }
                // The rest of an interrupted dump is read, not kept.
                _ if interrupted => Ok(None),
                _ => {
                    each(reply_type, payload).map_err(|reason| Error::Protocol { stack, reason })?;
                    Ok((!ends).then_some(0))
                }
            }
        })
    }

    /// A dump ([`Socket::request`], NLM_F_DUMP in `flags`), asked for again
    /// while the kernel interrupts it, five times at most: `each` fills a
    /// fresh `T` each time. With the errno the dump's end carried (0: none).
    pub fn dump<T: Default>(
        &mut self,
        msg_type: u16,
        flags: u16,
        body: &[&[u8]],
        op: &str,
        mut each: impl FnMut(&mut T, u16, &[u8]) -> std::result::Result<(), String>,
    ) -> Result<(T, i32), Error> {
        for _ in 0..DUMP_ATTEMPTS {
            let mut out = T::default();
            match self.request(msg_type, flags, body, op, |t, payload| each(&mut out, t, payload)) {
                Ok(errno) => return Ok((out, errno)),
                Err(Error::Interrupted(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Protocol { stack: self.stack, reason: format!("{op}: the table kept changing during five dumps") })
    }

    /// One request ([`Socket::request`]) and its replies' payloads; a dump
    /// that failed part-way is refused.
    pub fn exchange(&mut self, msg_type: u16, flags: u16, body: &[&[u8]], op: &str) -> Result<Vec<Vec<u8>>, Error> {
        let mut out = Vec::new();
        let errno = self.request(msg_type, flags, body, op, |_, payload| {
            out.push(payload.to_vec());
            Ok(())
        })?;
        check_end(errno, op)?;
        Ok(out)
    }
}
