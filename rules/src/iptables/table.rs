//! One table of an iptables-restore payload, written in the order
//! iptables-restore wants: `*table`, chain declarations, rules, deletions,
//! `COMMIT`.

#[derive(Debug)]
pub struct Table {
    name: &'static str,
    chains: String,
    rules: String,
    deletes: String,
}

impl Table {
    pub fn new(name: &'static str) -> Table {
        Table { name, chains: String::new(), rules: String::new(), deletes: String::new() }
    }

    /// Declare (create, or flush when it exists) a chain.
    pub fn chain(&mut self, chain: &str) {
        self.chains.push(':');
        self.chains.push_str(chain);
        self.chains.push_str(" - [0:0]\n");
    }

    /// Append one rule line (`-A CHAIN ...`).
    pub fn rule(&mut self, line: &str) {
        self.rules.push_str(line);
        self.rules.push('\n');
    }

    /// Flush and delete a chain nothing jumps to any more.
    pub fn delete_chain(&mut self, chain: &str) {
        self.chain(chain);
        self.deletes.push_str("-X ");
        self.deletes.push_str(chain);
        self.deletes.push('\n');
    }

    pub fn finish(self) -> String {
        let mut out = String::with_capacity(self.chains.len() + self.rules.len() + self.deletes.len() + 32);
        out.push('*');
        out.push_str(self.name);
        out.push('\n');
        out.push_str(&self.chains);
        out.push_str(&self.rules);
        out.push_str(&self.deletes);
        out.push_str("COMMIT\n");
        out
    }
}
