//! The contract version a component was built against, read from its
//! `kpx:proxier-version` custom section before anything is compiled.

/// Contract versions this host can run.
pub const SUPPORTED: &[&str] = &[super::wit::since_v0_1_0::VERSION];

/// The custom section kpx-sdk's export macro writes.
pub const SECTION: &str = "kpx:proxier-version";

/// `Ok(None)` when the component has no marker.
pub fn read_contract_version(bytes: &[u8]) -> Result<Option<String>, String> {
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a WebAssembly component: {e}"))?;
        if let wasmparser::Payload::CustomSection(section) = payload
            && section.name() == SECTION
        {
            let text = std::str::from_utf8(section.data()).map_err(|_| format!("{SECTION} is not UTF-8"))?;
            return Ok(Some(text.trim().to_string()));
        }
    }
    Ok(None)
}
