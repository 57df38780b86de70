//! nfnetlink: nf_tables batches (all or nothing, as the kernel commits
//! them) and dumps for reading objects back, and the requests of the
//! subsystems that take no batches (ctnetlink, nfacct), over one
//! [`Socket`]. Errors are the kernel's own errno, with its extended-ack
//! message and the operation that failed.

use netlink_sys::protocols::NETLINK_NETFILTER;

use super::nla::Writer;
use super::{
    Error, HEADER, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_ERROR, REPLY_TIMEOUT, Socket, push_header, read_error,
};

/// nf_tables' subsystem (linux/netfilter/nfnetlink.h).
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;

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

/// `struct nfgenmsg`: family, version, resource id.
const NFGENMSG: usize = 4;

fn push_message(buf: &mut Vec<u8>, msg_type: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) {
    push_header(buf, msg_type, flags, seq, HEADER + NFGENMSG + attrs.len());
    buf.push(family);
    buf.push(0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    buf.extend_from_slice(attrs);
}

/// A netfilter netlink socket (nf_tables, ctnetlink, nfacct).
pub struct Nfnl {
    socket: Socket,
}

impl Nfnl {
    pub fn open() -> Result<Nfnl, Error> {
        let mut socket = Socket::open(NETLINK_NETFILTER, REPLY_TIMEOUT)?;
        socket.extended_acks()?;
        // Replies to a failed batch can be many; as root, make room.
        socket.force_receive_buffer(8 << 20);
        Ok(Nfnl { socket })
    }

    /// Sends the batch; the kernel applies all or none.
    pub fn transact(&mut self, family: u8, batch: &mut Batch) -> Result<(), Error> {
        self.transact_to(NFNL_SUBSYS_NFTABLES, family, batch)
    }

    /// [`Nfnl::transact`] for a netfilter subsystem (tests name one
    /// the kernel does not have).
    fn transact_to(&mut self, subsystem: u16, family: u8, batch: &mut Batch) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        let socket = &mut self.socket;
        let begin = socket.next_seq();
        let first = socket.seq().wrapping_add(1);
        // The batch is numbered in place, each message (the last one
        // acked), between a begin and an end of its own.
        let count = batch.whats.len();
        let mut index = 0;
        for part in &mut batch.parts {
            let mut at = 0;
            while at < part.len() {
                let len = u32::from_ne_bytes(part[at..at + 4].try_into().expect("4 bytes")) as usize;
                let header = &mut part[at..at + HEADER + NFGENMSG];
                let seq = socket.next_seq();
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
        let last = socket.seq();
        let end = socket.next_seq();
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        push_message(&mut head, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, begin, 0, subsystem, &[]);
        push_message(&mut tail, NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, subsystem, &[]);
        let parts: Vec<&[u8]> = std::iter::once(head.as_slice())
            .chain(batch.parts.iter().map(Vec::as_slice).filter(|p| !p.is_empty()))
            .chain(std::iter::once(tail.as_slice()))
            .collect();
        socket.send(&parts)?;
        let messages = &batch.whats;
        let stack = socket.stack();
        // The kernel answers every failed message, then acks the last one;
        // a batch it refuses as a whole (unknown subsystem, stale
        // generation, no memory for its replies) gets one error, addressed
        // to the batch's begin or end, and no ack of the last message.
        let mut failure: Option<Error> = None;
        socket.receive_until(|msg_type, flags, seq, payload| {
            // Replies to earlier batches (their sequence numbers come
            // before this one's) are not this batch's.
            if msg_type != NLMSG_ERROR || seq.wrapping_sub(begin) > end.wrapping_sub(begin) {
                return Ok(None);
            }
            let (code, message) = read_error(payload, flags, stack)?;
            if (seq == begin || seq == end) && code != 0 {
                return Err(Error::Refused { op: "the batch".into(), errno: -code, message });
            }
            let index = seq.wrapping_sub(first) as usize;
            if code != 0 && failure.is_none() {
                let op = messages.get(index).cloned().unwrap_or_else(|| format!("message {seq}"));
                failure = Some(Error::Refused { op, errno: -code, message });
            }
            if seq == last {
                return match failure.take() {
                    Some(e) => Err(e),
                    None => Ok(Some(())),
                };
            }
            Ok(None)
        })
    }

    /// Dumps objects of one kind (`GETTABLE`, `GETCHAIN`, ...): each reply's
    /// attributes, after the nfgenmsg header. Asked again when the ruleset
    /// changed during the dump.
    pub fn dump(&mut self, msg_type: u16, family: u8, attrs: &Writer) -> Result<Vec<Vec<u8>>, Error> {
        self.dump_from(NFNL_SUBSYS_NFTABLES, msg_type, family, attrs)
    }

    /// [`Nfnl::dump`] from another netfilter subsystem (ctnetlink).
    pub fn dump_from(
        &mut self,
        subsystem: u16,
        msg_type: u16,
        family: u8,
        attrs: &Writer,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let nfgenmsg = [family, 0, 0, 0];
        let flags = NLM_F_REQUEST | NLM_F_DUMP | NLM_F_ACK;
        let body: [&[u8]; 2] = [&nfgenmsg, &attrs.buf];
        // The errno a dump's end may carry is not read here: such a dump
        // reads as what it returned.
        let (out, _) = self.socket.dump(
            (subsystem << 8) | msg_type,
            flags,
            &body,
            "a dump",
            |out: &mut Vec<Vec<u8>>, _, payload| {
                if let Some(after) = payload.get(NFGENMSG..) {
                    out.push(after.to_vec());
                }
                Ok(())
            },
        )?;
        Ok(out)
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
        let stack = self.socket.stack();
        let mut failure = None;
        let mut at = 0;
        while at < attrs.len() {
            let (first, mut buf) = (self.socket.seq().wrapping_add(1), Vec::new());
            while at < attrs.len() && buf.len() < CHUNK {
                let seq = self.socket.next_seq();
                push_message(&mut buf, t, NLM_F_REQUEST | NLM_F_ACK, seq, family, 0, &attrs[at].buf);
                at += 1;
            }
            let last = self.socket.seq();
            self.socket.send(&[&buf])?;
            let mut answered = 0;
            let expected = last.wrapping_sub(first) as usize + 1;
            self.socket.receive_until(|msg_type, flags, seq, payload| {
                if msg_type != NLMSG_ERROR || seq.wrapping_sub(first) > last.wrapping_sub(first) {
                    return Ok(None);
                }
                answered += 1;
                let (code, message) = read_error(payload, flags, stack)?;
                if code != 0 && !tolerated.contains(&-code) && failure.is_none() {
                    failure = Some(Error::Refused { op: format!("request {seq}"), errno: -code, message });
                }
                Ok((answered == expected).then_some(()))
            })?;
        }
        failure.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::NLM_F_CREATE;
    use crate::kernel::netlink::nla;
    use crate::kernel::nftables::encode::{add_chain_in, add_table_in};
    use crate::kernel::nftables::sys::{
        NFPROTO_IPV4, NFT_MSG_GETCHAIN, NFT_MSG_GETTABLE, NFT_MSG_NEWTABLE, NFTA_TABLE_NAME,
    };
    use nix::libc::ENOENT;

    /// A batch the kernel refuses as a whole is answered once, at its
    /// begin message, and never at its last: the wait ends there, with
    /// the kernel's errno (it used to wait for the last message forever).
    /// A message refused in the middle of a batch is named by what it
    /// does, nothing of the batch is applied, and a batch sent again is
    /// numbered again (its sequence numbers are set at each send).
    #[test]
    fn a_refused_message_is_named_and_nothing_of_its_batch_applies() {
        let mut lab = match kpx_netlab::Lab::new() {
            Ok(lab) => lab,
            Err(kpx_netlab::Error::Unavailable(why)) => return eprintln!("skipped: {why}"),
            Err(e) => panic!("{e}"),
        };
        let ns = lab.add("nlb").unwrap();
        let tables = |nl: &mut Nfnl| -> Vec<String> {
            let dumped = nl.dump(NFT_MSG_GETTABLE, NFPROTO_IPV4, &Writer::new()).unwrap();
            dumped
                .iter()
                .filter_map(|t| {
                    let attrs = nla::attrs(t).ok()?;
                    nla::find(&attrs, NFTA_TABLE_NAME)?.string().ok()
                })
                .collect()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = ns.enter(move || {
            std::thread::spawn(move || {
                let mut nl = Nfnl::open().unwrap();
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
                let mut nl = Nfnl::open().unwrap();
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
                let mut nl = Nfnl::open().unwrap();
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
