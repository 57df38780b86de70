//! The contract version a component was built against, read from its
//! `kpx:proxier-version` custom section before anything is compiled.

/// Contract versions this host can run.
pub const SUPPORTED: &[&str] =
    &[super::wit::since_v0_2_0::VERSION, super::wit::since_v0_3_0::VERSION, super::wit::since_v0_4_0::VERSION];

/// Why a version kpx once had is refused ("" for others).
pub fn why_not(found: &str) -> &'static str {
    match found {
        "0.1.0" => {
            " (0.1.0 was a development version that was never released: its plugins returned kernel text, which \
             kpx no longer accepts; rebuild the plugin with kpx-sdk, which builds 0.3.0 backends that return typed rules)"
        }
        _ => "",
    }
}

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
