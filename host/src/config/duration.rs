//! Go's `time.ParseDuration` for the durations kube-proxy's flags take.

use std::time::Duration;

/// Parses "300ms", "1.5h", "2h45m", "0". Negative durations are refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s.starts_with('-') {
        return Err("must not be negative".into());
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("expected a number at {rest:?}"));
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| format!("bad number {:?}", &rest[..num_len]))?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err("missing unit (ns, us, ms, s, m, h)".into()),
            other => return Err(format!("unknown unit {other:?}")),
        };
        rest = &rest[unit_len..];
        total += value * seconds;
    }
    Ok(Duration::from_secs_f64(total))
}

/// Go's `time.Duration.String()`: "0s", "150ms", "1.5s", "30s", "15m0s",
/// "24h0m0s".
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let frac = |value: u128, unit: u128| -> String {
        let (whole, rest) = (value / unit, value % unit);
        if rest == 0 {
            return whole.to_string();
        }
        let digits = unit.to_string().len() - 1;
        let text = format!("{whole}.{rest:0digits$}");
        text.trim_end_matches('0').to_string()
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", frac(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", frac(nanos, 1_000_000));
    }
    let secs = frac(nanos % 60_000_000_000, 1_000_000_000);
    let minutes = nanos / 60_000_000_000;
    match (minutes / 60, minutes % 60) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_as_go_does() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(150), "150ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(900), "15m0s"),
            (Duration::from_secs(86_400), "24h0m0s"),
            (Duration::from_secs(3_725), "1h2m5s"),
        ] {
            assert_eq!(format_duration(d), text);
            if d > Duration::ZERO {
                assert_eq!(parse_duration(text).unwrap(), d);
            }
        }
    }

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("2h22m").unwrap(), Duration::from_secs(2 * 3600 + 22 * 60));
        assert_eq!(parse_duration("150ms").unwrap(), Duration::from_millis(150));
        assert_eq!(parse_duration("1.5m").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1y").is_err());
    }
}
