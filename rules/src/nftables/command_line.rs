//! One command of an `nft -f` transaction, as the validator and the tracer
//! both read them: one per line, blank lines and `#` comments skipped.

/// A command line: its 1-based number, the text as written, and its words.
pub struct CommandLine<'a> {
    pub number: usize,
    pub raw: &'a str,
    /// Never empty.
    pub words: Vec<&'a str>,
}

impl<'a> CommandLine<'a> {
    /// `add`, `delete`, `flush`, ...
    pub fn verb(&self) -> &'a str {
        self.words[0]
    }

    /// `table`, `chain`, `map`, `element`, ...; empty when missing.
    pub fn object(&self) -> &'a str {
        self.words.get(1).copied().unwrap_or("")
    }
}

/// The commands of a transaction, in order.
pub fn command_lines(text: &str) -> impl Iterator<Item = CommandLine<'_>> {
    text.lines().enumerate().filter_map(|(i, raw)| {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        Some(CommandLine { number: i + 1, raw, words: line.split_whitespace().collect() })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_lines_as_written_and_skips_blanks_and_comments() {
        let text = "# header\nadd table ip kube-proxy\n\n  flush chain ip kube-proxy x  \nadd";
        let got: Vec<_> = command_lines(text).map(|c| (c.number, c.verb(), c.object(), c.words.len())).collect();
        assert_eq!(got, [(2, "add", "table", 4), (4, "flush", "chain", 5), (5, "add", "", 1)]);
    }
}
