//! The nf_tables netlink socket: one batch per transaction (all or
//! nothing, as the kernel commits it), and dumps for reading objects
//! back. Errors are the kernel's own errno, with its extended-ack message
//! and the operation that failed.

use std::os::fd::{AsFd, AsRawFd};

use netlink_packet_core::{ErrorBuffer, NetlinkBuffer};
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use super::sys::*;
use crate::kernel::netlink::nla::Writer;

/// Why netlink failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The socket itself failed (no netfilter netlink?): retried in full.
    #[error("nf_tables netlink: {0}")]
    Socket(String),
    /// The kernel refused an operation; nothing of the batch was applied.
    #[error("the kernel refused {op}: {}{}", errno_text(*errno), message.as_ref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Refused { op: String, errno: i32, message: Option<String> },
    /// A reply kpx cannot read.
    #[error("nf_tables netlink: unreadable reply: {0}")]
    Protocol(String),
}

impl Error {
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn errno_text(errno: i32) -> String {
    format!("{} (errno {errno})", std::io::Error::from_raw_os_error(errno))
}

/// How long the kernel may take to answer a batch or a dump's next part
/// (a batch of 300k elements is answered in well under a second).
pub const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

pub const ENOENT: i32 = 2;
pub const EEXIST: i32 = 17;
pub const EBUSY: i32 = 16;

/// One nf_tables message: its type, flags and attributes.
#[derive(Debug, Clone)]
pub struct Message {
    pub msg_type: u16,
    pub flags: u16,
    pub attrs: Writer,
    /// What it does, for error messages ("add element to service-ips").
    pub what: String,
}

/// The smallest part a batch adds when its last one is full.
const PART: usize = 1 << 20;

/// A transaction's messages in wire form, each written as it is pushed
/// (a full sync at 10k Services is 9 MB: held once, not as messages and
/// again as the batch), in parts that one send takes together: a batch
/// appended to another keeps its buffer. The batch's begin and end,
/// sequence numbers, the family and the last message's ack are set when
/// it is sent.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The messages, in order, in one or more buffers.
    parts: Vec<Vec<u8>>,
    /// What each message does, for error messages.
    whats: Vec<String>,
    /// The parts' bytes.
    len: usize,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::new()
    }
}

impl Batch {
    pub fn new() -> Batch {
        Batch { parts: vec![Vec::new()], whats: Vec::new(), len: 0 }
    }

    pub fn push(&mut self, m: Message) {
        // A full part is not grown (a reallocation holds the old buffer
        // and the new one at once, and copies): the next message starts a
        // part of its own, an eighth of the batch so far or 1 MiB, so that
        // a batch of 256 MiB is about 50 parts, far below the kernel's
        // 1024 per send.
        let need = HEADER + NFGENMSG + m.attrs.buf.len();
        let last = self.parts.last().expect("a batch has a part");
        if last.capacity() - last.len() < need {
            let size = need.max(PART).max(self.bytes() / 8);
            if last.is_empty() {
                self.parts.pop();
            }
            self.parts.push(Vec::with_capacity(size));
        }
        let buf = self.parts.last_mut().expect("a batch has a part");
        self.len += need;
        let msg_type = (NFNL_SUBSYS_NFTABLES << 8) | m.msg_type;
        push_message(buf, msg_type, NLM_F_REQUEST | m.flags, 0, 0, 0, &m.attrs.buf);
        self.whats.push(m.what);
    }

    /// `other`'s messages after these, its buffer kept as it is.
    pub fn append(&mut self, other: Batch) {
        self.len += other.len;
        self.parts.extend(other.parts);
        self.whats.extend(other.whats);
        // Pushes go to a part of their own, after the appended one.
        self.parts.push(Vec::new());
    }

    /// The number of messages.
    pub fn len(&self) -> usize {
        self.whats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.whats.is_empty()
    }

    /// The messages' bytes (headers included, the batch's begin and end
    /// left out).
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// What each message does, in order.
    pub fn whats(&self) -> &[String] {
        &self.whats
    }
}

impl Extend<Message> for Batch {
    fn extend<I: IntoIterator<Item = Message>>(&mut self, messages: I) {
        for m in messages {
            self.push(m);
        }
    }
}

impl FromIterator<Message> for Batch {
    fn from_iter<I: IntoIterator<Item = Message>>(messages: I) -> Batch {
        let mut batch = Batch::new();
        batch.extend(messages);
        batch
    }
}

const HEADER: usize = 16;
const NFGENMSG: usize = 4;

fn push_message(buf: &mut Vec<u8>, msg_type: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) {
    let len = (HEADER + NFGENMSG + attrs.len()) as u32;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&msg_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(family);
    buf.push(0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    buf.extend_from_slice(attrs);
}

/// One reply message: (type, flags, seq, payload after the netlink header).
pub type Reply = (u16, u16, u32, Vec<u8>);

pub struct Netlink {
    socket: Socket,
    seq: u32,
    sndbuf: usize,
}

impl Netlink {
    pub fn open() -> Result<Netlink, Error> {
        let err = |what: &str, e: std::io::Error| Error::Socket(format!("{what}: {e}"));
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(|e| err("socket", e))?;
        socket.bind_auto().map_err(|e| err("bind", e))?;
        socket.set_ext_ack(true).map_err(|e| err("extended acks", e))?;
        // Errors carry the failed request's header only, not all of it.
        socket.set_cap_ack(true).map_err(|e| err("capped acks", e))?;
        // Replies to a failed batch can be many; as root, make room.
        let _ = nix::sys::socket::setsockopt(&socket.as_fd(), nix::sys::socket::sockopt::RcvBufForce, &(8 << 20));
        // A reply that never comes must not stall the sync thread.
        let timeout = nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0);
        nix::sys::socket::setsockopt(&socket.as_fd(), nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| err("receive timeout", e.into()))?;
        Ok(Netlink { socket, seq: std::process::id().wrapping_mul(1000), sndbuf: 0 })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends the batch; the kernel applies all or none.
    pub fn transact(&mut self, family: u8, batch: &mut Batch) -> Result<(), Error> {
        self.transact_to(NFNL_SUBSYS_NFTABLES, family, batch)
    }

    /// [`Netlink::transact`] for a netfilter subsystem (tests name one
    /// the kernel does not have).
    fn transact_to(&mut self, subsystem: u16, family: u8, batch: &mut Batch) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        let begin = self.next_seq();
        let first = self.seq.wrapping_add(1);
        // The batch is numbered in place, each message (the last one
        // acked), between a begin and an end of its own.
        let count = batch.whats.len();
        let mut index = 0;
        for part in &mut batch.parts {
            let mut at = 0;
            while at < part.len() {
                let len = u32::from_ne_bytes(part[at..at + 4].try_into().expect("4 bytes")) as usize;
                let header = &mut part[at..at + HEADER + NFGENMSG];
                let seq = self.next_seq();
                header[8..12].copy_from_slice(&seq.to_ne_bytes());
                header[16] = family;
                index += 1;
                // Only the last is acked (one sent before, and grown
                // since, loses its old last's ack).
                let flags = u16::from_ne_bytes([header[6], header[7]]) & !NLM_F_ACK;
                let flags = if index == count { flags | NLM_F_ACK } else { flags };
                header[6..8].copy_from_slice(&flags.to_ne_bytes());
                at += len;
            }
        }
        let last = self.seq;
        let end = self.next_seq();
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        push_message(&mut head, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, begin, 0, subsystem, &[]);
        push_message(&mut tail, NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, subsystem, &[]);
        let parts: Vec<&[u8]> = std::iter::once(head.as_slice())
            .chain(batch.parts.iter().map(Vec::as_slice).filter(|p| !p.is_empty()))
            .chain(std::iter::once(tail.as_slice()))
            .collect();
        self.send(&parts)?;
        let messages = &batch.whats;
        // The kernel answers every failed message, then acks the last one;
        // a batch it refuses as a whole (unknown subsystem, stale
        // generation, no memory for its replies) gets one error, addressed
        // to the batch's begin or end, and no ack of the last message.
        let mut failure: Option<Error> = None;
        loop {
            for (msg_type, flags, seq, payload) in self.recv()? {
                // Replies to earlier batches (their sequence numbers come
                // before this one's) are not this batch's.
                if msg_type != NLMSG_ERROR || seq.wrapping_sub(begin) > end.wrapping_sub(begin) {
                    continue;
                }
                let (code, message) = parse_error(&payload, flags)?;
                if (seq == begin || seq == end) && code != 0 {
                    return Err(Error::Refused { op: "the batch".into(), errno: -code, message });
                }
                let index = seq.wrapping_sub(first) as usize;
                if code != 0 && failure.is_none() {
                    let op = messages.get(index).cloned().unwrap_or_else(|| format!("message {seq}"));
                    failure = Some(Error::Refused { op, errno: -code, message });
                }
                if seq == last {
                    return match failure {
                        Some(e) => Err(e),
                        None => Ok(()),
                    };
                }
            }
        }
    }

    /// One whole batch in one send (the kernel reads a batch from one
    /// message), its parts gathered by the kernel.
    fn send(&mut self, parts: &[&[u8]]) -> Result<(), Error> {
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
        .map_err(|e| Error::Socket(format!("send: {e}")))?;
        if sent != len {
            return Err(Error::Socket(format!("sent {sent} of {len} bytes")));
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
            .map_err(|e| Error::Socket(format!("send buffer of {want} bytes: {e}")))?;
        self.sndbuf = want;
        Ok(())
    }

    fn recv(&mut self) -> Result<Vec<Reply>, Error> {
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        let n = self.socket.recv(&mut buf, 0).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                Error::Socket(format!("no reply from the kernel within {} s", REPLY_TIMEOUT.as_secs()))
            }
            _ => Error::Socket(format!("receive: {e}")),
        })?;
        split_replies(&buf[..n.min(buf.len())])
    }

    /// Dumps objects of one kind (`GETTABLE`, `GETCHAIN`, ...): each reply's
    /// attributes, after the nfgenmsg header. Retried when the ruleset
    /// changed during the dump.
    pub fn dump(&mut self, msg_type: u16, family: u8, attrs: &Writer) -> Result<Vec<Vec<u8>>, Error> {
        self.dump_from(NFNL_SUBSYS_NFTABLES, msg_type, family, attrs)
    }

    /// [`Netlink::dump`] from another netfilter subsystem (ctnetlink).
    pub fn dump_from(
        &mut self,
        subsystem: u16,
        msg_type: u16,
        family: u8,
        attrs: &Writer,
    ) -> Result<Vec<Vec<u8>>, Error> {
        'attempt: for _ in 0..5 {
            let seq = self.next_seq();
            let mut buf = Vec::new();
            let t = (subsystem << 8) | msg_type;
            push_message(&mut buf, t, NLM_F_REQUEST | NLM_F_DUMP | NLM_F_ACK, seq, family, 0, &attrs.buf);
            self.socket.send(&buf, 0).map_err(|e| Error::Socket(format!("send: {e}")))?;
            let mut out = Vec::new();
            loop {
                for (t, flags, s, payload) in self.recv()? {
                    if s != seq {
                        continue;
                    }
                    if flags & NLM_F_DUMP_INTR != 0 {
                        // Drain the rest of this dump, then start again.
                        self.drain(seq)?;
                        continue 'attempt;
                    }
                    match t {
                        NLMSG_DONE => return Ok(out),
                        NLMSG_ERROR => {
                            let (code, message) = parse_error(&payload, flags)?;
                            if code != 0 {
                                return Err(Error::Refused { op: "a dump".into(), errno: -code, message });
                            }
                        }
                        _ if payload.len() >= NFGENMSG => out.push(payload[NFGENMSG..].to_vec()),
                        _ => {}
                    }
                }
            }
        }
        Err(Error::Protocol("the ruleset kept changing during five dumps".into()))
    }

    /// Sends one request per entry of `attrs` (a subsystem that takes no
    /// batches: ctnetlink), as few sends as the socket's buffer allows,
    /// each acknowledged. An error whose errno is in `tolerated` (say,
    /// ENOENT for an entry already gone) is not one; the first other is
    /// returned once every request was answered.
    pub fn requests(
        &mut self,
        subsystem: u16,
        msg_type: u16,
        family: u8,
        attrs: &[Writer],
        tolerated: &[i32],
    ) -> Result<(), Error> {
        const CHUNK: usize = 256 << 10;
        let t = (subsystem << 8) | msg_type;
        let mut failure = None;
        let mut at = 0;
        while at < attrs.len() {
            let (first, mut buf) = (self.seq.wrapping_add(1), Vec::new());
            while at < attrs.len() && buf.len() < CHUNK {
                let seq = self.next_seq();
                push_message(&mut buf, t, NLM_F_REQUEST | NLM_F_ACK, seq, family, 0, &attrs[at].buf);
                at += 1;
            }
            let last = self.seq;
            self.send(&[&buf])?;
            let mut answered = 0;
            let expected = last.wrapping_sub(first) as usize + 1;
            while answered < expected {
                for (msg_type, flags, seq, payload) in self.recv()? {
                    if msg_type != NLMSG_ERROR || seq.wrapping_sub(first) > last.wrapping_sub(first) {
                        continue;
                    }
                    answered += 1;
                    let (code, message) = parse_error(&payload, flags)?;
                    if code != 0 && !tolerated.contains(&-code) && failure.is_none() {
                        failure = Some(Error::Refused { op: format!("request {seq}"), errno: -code, message });
                    }
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    fn drain(&mut self, seq: u32) -> Result<(), Error> {
        loop {
            for (t, _, s, _) in self.recv()? {
                if s == seq && (t == NLMSG_DONE || t == NLMSG_ERROR) {
                    return Ok(());
                }
            }
        }
    }
}

/// The messages of one datagram the kernel sent: (type, flags, sequence
/// number, payload) each. A message whose length is shorter than its
/// header or runs past the datagram is an error.
pub fn split_replies(buf: &[u8]) -> Result<Vec<Reply>, Error> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + HEADER <= buf.len() {
        let msg = NetlinkBuffer::new_checked(&buf[at..]).map_err(|e| Error::Protocol(e.to_string()))?;
        let len = msg.length() as usize;
        if len < HEADER {
            break;
        }
        out.push((msg.message_type(), msg.flags(), msg.sequence_number(), msg.payload().to_vec()));
        at += (len + 3) & !3;
    }
    Ok(out)
}

/// The reply carries extended-ack attributes after the request's header.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// Extended-ack attribute: the kernel's message.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// An NLMSG_ERROR payload: (code, extended-ack message). The socket caps
/// acks, so the failed request's header (16 bytes) precedes the TLVs.
pub fn parse_error(payload: &[u8], flags: u16) -> Result<(i32, Option<String>), Error> {
    let err = ErrorBuffer::new_checked(payload).map_err(|e| Error::Protocol(e.to_string()))?;
    let code = err.code().map_or(0, |c| c.get());
    let inner = err.payload();
    let message = (flags & NLM_F_ACK_TLVS != 0 && inner.len() > HEADER)
        .then(|| crate::kernel::netlink::nla::attrs(&inner[HEADER..]).ok())
        .flatten()
        .and_then(|attrs| crate::kernel::netlink::nla::find(&attrs, NLMSGERR_ATTR_MSG))
        .and_then(|a| a.string().ok())
        .filter(|s| !s.is_empty());
    Ok((code, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch the kernel refuses as a whole is answered once, at its
    /// begin message, and never at its last: the wait ends there, with
    /// the kernel's errno (it used to wait for the last message forever).
    /// A message refused in the middle of a batch is named by what it
    /// does, nothing of the batch is applied, and a batch sent again is
    /// numbered again (its sequence numbers are set at each send).
    #[test]
    fn a_refused_message_is_named_and_nothing_of_its_batch_applies() {
        use super::super::encode::{add_chain_in, add_table_in};
        let mut lab = match kpx_netlab::Lab::new() {
            Ok(lab) => lab,
            Err(kpx_netlab::Error::Unavailable(why)) => return eprintln!("skipped: {why}"),
            Err(e) => panic!("{e}"),
        };
        let ns = lab.add("nlb").unwrap();
        let tables = |nl: &mut Netlink| -> Vec<String> {
            let dumped = nl.dump(NFT_MSG_GETTABLE, NFPROTO_IPV4, &Writer::new()).unwrap();
            dumped
                .iter()
                .filter_map(|t| {
                    let attrs = crate::kernel::netlink::nla::attrs(t).ok()?;
                    crate::kernel::netlink::nla::find(&attrs, NFTA_TABLE_NAME)?.string().ok()
                })
                .collect()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = ns.enter(move || {
            std::thread::spawn(move || {
                let mut nl = Netlink::open().unwrap();
                let mut bad = Batch::from_iter([
                    add_table_in("kpx-t", "t"),
                    add_chain_in("kpx-t", "a"),
                    add_chain_in("kpx-nope", "b"),
                    add_chain_in("kpx-t", "c"),
                ]);
                let refused = nl.transact(NFPROTO_IPV4, &mut bad);
                let after_refusal = tables(&mut nl);
                let mut good = Batch::from_iter([add_table_in("kpx-t", "t"), add_chain_in("kpx-t", "a")]);
                let first = nl.transact(NFPROTO_IPV4, &mut good);
                let again = nl.transact(NFPROTO_IPV4, &mut good);
                let _ = tx.send((refused, after_refusal, first, again, tables(&mut nl)));
            });
        });
        let (refused, after_refusal, first, again, tables) =
            rx.recv_timeout(std::time::Duration::from_secs(10)).expect("answered within 10 s");
        match refused {
            Err(Error::Refused { op, errno, .. }) => assert_eq!((op.as_str(), errno), ("add chain b", ENOENT)),
            other => panic!("{other:?}"),
        }
        assert!(!after_refusal.contains(&"kpx-t".to_string()), "{after_refusal:?}");
        assert_eq!((first, again), (Ok(()), Ok(())));
        assert!(tables.contains(&"kpx-t".to_string()), "{tables:?}");
    }

    /// A batch of several parts (more than 1 MiB of messages) is sent whole,
    /// numbered across its parts: every message applies, and a refused one
    /// in a later part is named.
    #[test]
    fn a_batch_of_several_parts_applies_whole() {
        use super::super::encode::{add_chain_in, add_table_in};
        let mut lab = match kpx_netlab::Lab::new() {
            Ok(lab) => lab,
            Err(kpx_netlab::Error::Unavailable(why)) => return eprintln!("skipped: {why}"),
            Err(e) => panic!("{e}"),
        };
        let ns = lab.add("nlp").unwrap();
        let name = |i: usize| format!("c{i:05}-{}", "x".repeat(180));
        let chains = 8000;
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = ns.enter(move || {
            std::thread::spawn(move || {
                let mut nl = Netlink::open().unwrap();
                let mut bad = Batch::from_iter([add_table_in("kpx-t", "t")]);
                for i in 0..chains {
                    bad.push(add_chain_in("kpx-t", &name(i)));
                }
                bad.push(add_chain_in("kpx-nope", "late"));
                let bad_parts = bad.parts.iter().filter(|p| !p.is_empty()).count();
                let refused = nl.transact(NFPROTO_IPV4, &mut bad);
                let mut good = Batch::from_iter([add_table_in("kpx-t", "t")]);
                for i in 0..chains {
                    good.push(add_chain_in("kpx-t", &name(i)));
                }
                let (parts, bytes) = (good.parts.iter().filter(|p| !p.is_empty()).count(), good.bytes());
                let applied = nl.transact(NFPROTO_IPV4, &mut good);
                let dumped = nl.dump(NFT_MSG_GETCHAIN, NFPROTO_IPV4, &Writer::new()).unwrap();
                let _ = tx.send((bad_parts, refused, parts, bytes, applied, dumped.len()));
            });
        });
        let (bad_parts, refused, parts, bytes, applied, dumped) =
            rx.recv_timeout(std::time::Duration::from_secs(30)).expect("answered within 30 s");
        assert!(bad_parts > 1 && parts > 1 && bytes > PART, "{bad_parts} and {parts} parts, {bytes} bytes");
        match refused {
            Err(Error::Refused { op, errno, .. }) => assert_eq!((op.as_str(), errno), ("add chain late", ENOENT)),
            other => panic!("{other:?}"),
        }
        assert_eq!(applied, Ok(()));
        assert_eq!(dumped, chains);
    }

    #[test]
    fn a_batch_refused_whole_ends_the_wait() {
        let mut lab = match kpx_netlab::Lab::new() {
            Ok(lab) => lab,
            Err(kpx_netlab::Error::Unavailable(why)) => return eprintln!("skipped: {why}"),
            Err(e) => panic!("{e}"),
        };
        let ns = lab.add("nl").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = ns.enter(move || {
            std::thread::spawn(move || {
                let mut nl = Netlink::open().unwrap();
                let mut attrs = Writer::new();
                attrs.str(NFTA_TABLE_NAME, "kpx-never");
                let add = Message { msg_type: NFT_MSG_NEWTABLE, flags: NLM_F_CREATE, attrs, what: "add table".into() };
                // No netfilter subsystem has id 99.
                let _ = tx.send(nl.transact_to(99, 2, &mut Batch::from_iter([add])));
            });
        });
        let result = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the batch is answered within 10 s");
        match result {
            Err(Error::Refused { op, errno, .. }) => {
                assert_eq!(op, "the batch");
                assert!(errno > 0, "{errno}");
            }
            other => panic!("{other:?}"),
        }
    }
}
