//! Generic netlink: resolves a family by name, sends commands and waits
//! for their acknowledgement, and reads dumps (over [`Socket`]). IPVS is
//! the family kpx speaks.

use netlink_sys::protocols::NETLINK_GENERIC;

use super::nla::{Writer, attrs, find};
use super::{Error, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, REPLY_TIMEOUT, Socket, check_end};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// `struct genlmsghdr`.
const GENL_HEADER: usize = 4;

pub struct Genl {
    socket: Socket,
    family: u16,
    version: u8,
}

impl Genl {
    /// A socket for the family `name` (speaking `version`).
    pub fn open(name: &str, version: u8) -> Result<Genl, Error> {
        let socket = Socket::open(NETLINK_GENERIC, REPLY_TIMEOUT)?;
        let mut genl = Genl { socket, family: GENL_ID_CTRL, version: 1 };
        let mut w = Writer::new();
        w.str(CTRL_ATTR_FAMILY_NAME, name);
        let replies = match genl.exchange(CTRL_CMD_GETFAMILY, NLM_F_REQUEST, &w, "the family lookup") {
            Err(Error::Refused { errno: nix::libc::ENOENT, .. }) => return Err(Error::NoFamily(name.to_string())),
            other => other?,
        };
        let id = replies
            .iter()
            .find_map(|p| attrs(p).ok().and_then(|a| find(&a, CTRL_ATTR_FAMILY_ID)))
            .and_then(|a| a.value.get(..2).map(|b| u16::from_ne_bytes([b[0], b[1]])))
            .ok_or_else(|| Error::protocol(format!("no id for family {name}")))?;
        genl.family = id;
        genl.version = version;
        Ok(genl)
    }

    /// Sends one command and waits for its acknowledgement.
    pub fn request(&mut self, cmd: u8, attrs: &Writer, op: &str) -> Result<(), Error> {
        self.exchange(cmd, NLM_F_REQUEST | NLM_F_ACK, attrs, op).map(drop)
    }

    /// Dumps: the attributes of every reply. Asked again when interrupted.
    pub fn dump(&mut self, cmd: u8, attrs: &Writer, op: &str) -> Result<Vec<Vec<u8>>, Error> {
        let header = [cmd, self.version, 0, 0];
        let body: [&[u8]; 2] = [&header, &attrs.buf];
        let (replies, errno) =
            self.socket.dump(self.family, NLM_F_REQUEST | NLM_F_DUMP, &body, op, |out: &mut Vec<Vec<u8>>, _, p| {
                if let Some(a) = p.get(GENL_HEADER..) {
                    out.push(a.to_vec());
                }
                Ok(())
            })?;
        check_end(errno, op)?;
        Ok(replies)
    }

    /// One command; the replies' attributes (after the genetlink header).
    fn exchange(&mut self, cmd: u8, flags: u16, attrs: &Writer, op: &str) -> Result<Vec<Vec<u8>>, Error> {
        let header = [cmd, self.version, 0, 0];
        let replies = self.socket.exchange(self.family, flags, &[&header, &attrs.buf], op)?;
        Ok(replies.into_iter().filter(|p| p.len() >= GENL_HEADER).map(|p| p[GENL_HEADER..].to_vec()).collect())
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
        assert_eq!(
            super::super::encode(GENL_ID_CTRL, NLM_F_REQUEST, 7, &[&[CTRL_CMD_GETFAMILY, 1, 0, 0], &w.buf]),
            want
        );
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
