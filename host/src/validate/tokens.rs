//! Splitting an iptables-restore rule line into arguments, honouring the
//! double quotes iptables-restore understands.

/// The arguments of a line, or `None` when a quote is not closed.
pub fn split(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut has_token = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                has_token = true;
            }
            '\\' if in_quotes => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            c if c.is_whitespace() && !in_quotes => {
                if has_token {
                    out.push(std::mem::take(&mut current));
                    has_token = false;
                }
            }
            c => {
                current.push(c);
                has_token = true;
            }
        }
    }
    if in_quotes {
        return None;
    }
    if has_token {
        out.push(current);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn splits_quoted_comments() {
        assert_eq!(
            super::split(r#"-A X -m comment --comment "a b" -j Y"#).unwrap(),
            ["-A", "X", "-m", "comment", "--comment", "a b", "-j", "Y"]
        );
        assert!(super::split(r#"-A X --comment "open"#).is_none());
        assert_eq!(super::split(r#"--comment """#).unwrap(), ["--comment", ""]);
    }
}
