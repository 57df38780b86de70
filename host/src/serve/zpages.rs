//! `/flagz` and `/statusz`, as Kubernetes components serve them
//! (component-base's zpages, KEP-4827 and KEP-4828; the `ComponentFlagz`
//! and `ComponentStatusz` gates, beta and on since v1.36; kube-proxy
//! serves them beside /metrics). Text for people by default, with
//! upstream's warning and a delimiter picked at random once, so that
//! nothing parses it; the versioned JSON (`config.k8s.io/v1beta1` or
//! `v1alpha1`, `Flagz` / `Statusz`), or the same as YAML (v1.36), when
//! asked for by media type parameters; 406 for anything else (a bare
//! `application/json` included), as upstream.

use std::time::SystemTime;

use super::http::Answer;

/// The component's name on both pages.
const COMPONENT: &str = "kube-proxy";

const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";

/// component-base's delimiters; one is picked per process.
const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];

/// The versions of the JSON pages, newest first (v1alpha1 deprecated).
const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];

/// What the pages show.
#[derive(Debug, Clone)]
pub struct Zpages {
    /// Every flag with its value as given, or its default (name, value).
    flags: Vec<(String, String)>,
    started: SystemTime,
    delimiter: &'static str,
    version: String,
    /// The metrics server's paths.
    paths: Vec<&'static str>,
}

/// How a request asked for a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Text,
    /// The versioned object of this version, as JSON (`yaml: false`) or
    /// YAML (v1.36: "Enabled YAML support for /statusz and /flagz").
    Object {
        version: &'static str,
        yaml: bool,
    },
}

impl Zpages {
    pub fn new(flags: Vec<(String, String)>, version: &str, paths: Vec<&'static str>) -> Zpages {
        use std::hash::BuildHasher;
        let pick = std::collections::hash_map::RandomState::new().hash_one(std::process::id()) as usize;
        let mut flags = flags;
        flags.sort();
        Zpages {
            flags,
            started: SystemTime::now(),
            delimiter: DELIMITERS[pick % DELIMITERS.len()],
            version: version.to_string(),
            paths,
        }
    }

    /// `/flagz`.
    pub fn flagz(&self, accept: Option<&str>) -> Answer {
        match negotiate(accept, "Flagz") {
            Some(Format::Text) => {
                let mut out = header("flags");
                out.push_str("The values given on the command line, or their defaults: not the configuration in effect, which /configz shows.\n\n");
                for (name, value) in &self.flags {
                    out.push_str(&format!("{name}{}{value}\n", self.delimiter));
                }
                Answer::text(200, out)
            }
            Some(Format::Object { version, yaml }) => {
                let flags: serde_json::Map<String, serde_json::Value> =
                    self.flags.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
                object(
                    version,
                    yaml,
                    serde_json::json!({
                        "kind": "Flagz",
                        "apiVersion": format!("config.k8s.io/{version}"),
                        "metadata": {"name": COMPONENT},
                        "flags": flags,
                    }),
                )
            }
            None => not_acceptable("Flagz"),
        }
    }

    /// `/statusz`.
    pub fn statusz(&self, accept: Option<&str>, now: SystemTime) -> Answer {
        let up = now.duration_since(self.started).unwrap_or_default().as_secs();
        match negotiate(accept, "Statusz") {
            Some(Format::Text) => {
                let d = self.delimiter;
                let mut out = header("statusz");
                out.push_str(&format!("Started{d} {}\n", unix_date(self.started)));
                out.push_str(&format!("Up{d} {} hr {:02} min {:02} sec\n", up / 3600, up % 3600 / 60, up % 60));
                out.push_str(&format!("Binary version{d} {}\n", self.version));
                out.push_str(&format!("Emulation version{d} \n"));
                out.push_str(&format!("Paths{d} {}\n", self.paths.join(" ")));
                Answer::text(200, out)
            }
            Some(Format::Object { version, yaml }) => object(
                version,
                yaml,
                serde_json::json!({
                    "kind": "Statusz",
                    "apiVersion": format!("config.k8s.io/{version}"),
                    "metadata": {"name": COMPONENT},
                    "startTime": super::health::rfc3339(Some(self.started)),
                    "uptimeSeconds": up,
                    "binaryVersion": self.version,
                    "emulationVersion": "",
                    "paths": self.paths,
                }),
            ),
            None => not_acceptable("Statusz"),
        }
    }
}

fn header(what: &str) -> String {
    format!("\n{COMPONENT} {what}\n{WARNING}\n\n")
}

fn object(version: &'static str, yaml: bool, body: serde_json::Value) -> Answer {
    let mut a = match yaml {
        false => Answer::json(200, body.to_string()),
        true => {
            let text = serde_saphyr::to_string(&body).expect("a JSON value is YAML");
            Answer { content_type: "application/yaml", ..Answer::text(200, text) }
        }
    };
    if version != VERSIONS[0] {
        a.headers.push(("Warning", format!("299 - \"config.k8s.io/{version} is deprecated; use {}\"", VERSIONS[0])));
    }
    a
}

fn not_acceptable(kind: &str) -> Answer {
    Answer::text(
        406,
        format!(
            "only text/plain, or application/json or application/yaml with ;v={};g=config.k8s.io;as={kind}, are served\n",
            VERSIONS.join("|")
        ),
    )
}

/// Longest `Accept` read; a longer one is refused (406) unread, so that
/// no client makes the servers' thread parse megabytes.
const MAX_ACCEPT: usize = 8192;

/// The media range of `Accept` the page answers, as Kubernetes' negotiation
/// picks it: the highest `q` first (`q=0` refuses), then the earliest;
/// text for none, `text/plain`, `text/*` or `*/*`; the versioned object
/// only with its version, group and kind as parameters, as JSON
/// (`application/json`, `application/*`) or YAML (`application/yaml`).
fn negotiate(accept: Option<&str>, kind: &str) -> Option<Format> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else { return Some(Format::Text) };
    if accept.len() > MAX_ACCEPT {
        return None;
    }
    let mut best: Option<(f32, Format)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let params: Vec<(String, &str)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"')))
            .collect();
        let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        let q = param("q").map_or(Some(1.0), |q| q.parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)));
        let Some(q) = q.filter(|q| *q > 0.0) else { continue };
        let format = match media.as_str() {
            "text/plain" | "text/*" | "*/*" => Some(Format::Text),
            "application/json" | "application/yaml" | "application/*" => {
                let version = VERSIONS.iter().find(|v| param("v") == Some(**v));
                version
                    .filter(|_| param("g") == Some("config.k8s.io") && param("as") == Some(kind))
                    .map(|v| Format::Object { version: v, yaml: media == "application/yaml" })
            }
            _ => None,
        };
        if let Some(f) = format
            && best.as_ref().is_none_or(|(b, _)| q > *b)
        {
            best = Some((q, f));
        }
    }
    best.map(|(_, f)| f)
}

/// Go's `time.UnixDate` in UTC: `Mon Jan _2 15:04:05 UTC 2006`.
fn unix_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    // The date from RFC 3339's form, the weekday from the days since
    // 1970-01-01 (a Thursday).
    let rfc = super::health::rfc3339(Some(t));
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
    let (y, m, d) = (&rfc[0..4], &rfc[5..7], &rfc[8..10]);
    let month = MONTHS[m.parse::<usize>().unwrap_or(1) - 1];
    let day: u32 = d.parse().unwrap_or(1);
    format!("{} {month} {day:>2} {} UTC {y}", DAYS[(secs / 86_400 % 7) as usize], &rfc[11..19])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pages() -> Zpages {
        let flags = vec![("v".to_string(), "2".to_string()), ("bind-address".to_string(), "0.0.0.0".to_string())];
        Zpages::new(flags, "v0.1.0", vec!["/configz", "/flagz", "/metrics", "/statusz"])
    }

    #[test]
    fn text_by_default_with_upstreams_warning() {
        let z = pages();
        let a = z.flagz(None);
        assert_eq!((a.status, a.content_type), (200, "text/plain; charset=utf-8"));
        let d = z.delimiter;
        assert!(a.body.starts_with(&format!("\nkube-proxy flags\n{WARNING}\n\n")), "{}", a.body);
        assert!(a.body.ends_with(&format!("bind-address{d}0.0.0.0\nv{d}2\n")), "sorted: {}", a.body);
        for accept in ["text/plain", "*/*", "application/xml, text/*"] {
            assert_eq!(z.flagz(Some(accept)).status, 200, "{accept}");
        }
        let started = z.started;
        let s = z.statusz(None, started + Duration::from_secs(3725));
        assert!(s.body.contains(&format!("Up{d} 1 hr 02 min 05 sec\n")), "{}", s.body);
        assert!(s.body.contains(&format!("Paths{d} /configz /flagz /metrics /statusz\n")), "{}", s.body);
    }

    #[test]
    fn versioned_json_only_when_asked_by_its_parameters() {
        let z = pages();
        let a = z.flagz(Some("application/json;v=v1beta1;g=config.k8s.io;as=Flagz"));
        assert_eq!(a.status, 200);
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(v["kind"], "Flagz");
        assert_eq!(v["apiVersion"], "config.k8s.io/v1beta1");
        assert_eq!(v["flags"]["bind-address"], "0.0.0.0");
        let old = z.statusz(Some("application/json;v=v1alpha1;g=config.k8s.io;as=Statusz"), SystemTime::now());
        assert!(old.headers.iter().any(|(k, v)| *k == "Warning" && v.contains("deprecated")), "{old:?}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&old.body).unwrap()["kind"], "Statusz");
        for refused in ["application/json", "application/json;v=v1beta1;g=config.k8s.io;as=Statusz", "application/xml"]
        {
            assert_eq!(z.flagz(Some(refused)).status, 406, "{refused}");
        }
        assert_eq!(z.flagz(Some("application/json;v=v9;g=config.k8s.io;as=Flagz, */*")).status, 200, "falls to text");
        // The same objects as YAML.
        let y = z.statusz(Some("application/yaml;v=v1beta1;g=config.k8s.io;as=Statusz"), SystemTime::now());
        assert_eq!((y.status, y.content_type), (200, "application/yaml"));
        let v: serde_json::Value = serde_saphyr::from_str(&y.body).unwrap();
        assert_eq!((v["kind"].as_str(), v["apiVersion"].as_str()), (Some("Statusz"), Some("config.k8s.io/v1beta1")));
        assert_eq!(z.flagz(Some("application/yaml")).status, 406, "YAML too only with its parameters");
        // q-values: 0 refuses, the highest wins; application/* is JSON.
        let json = |a: &Answer| a.status == 200 && a.content_type == "application/json";
        let p = "v=v1beta1;g=config.k8s.io;as=Flagz";
        assert!(json(&z.flagz(Some(&format!("text/plain;q=0, application/json;{p}")))));
        assert!(json(&z.flagz(Some(&format!("text/plain;q=0.5, application/json;{p};q=0.9")))));
        assert!(
            !json(&z.flagz(Some(&format!("text/plain, application/json;{p};q=0.9")))),
            "text at q=1 beats JSON at q=0.9"
        );
        assert_eq!(z.flagz(Some(&format!("application/json;{p};q=0"))).status, 406);
        assert!(json(&z.flagz(Some(&format!("application/*;{p}")))));
        // An over-long Accept is refused unread.
        assert_eq!(z.flagz(Some(&",".repeat(MAX_ACCEPT + 1))).status, 406);
    }

    #[test]
    fn unix_date_as_go_prints_it() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_655_363);
        assert_eq!(unix_date(t), "Mon Dec  7 14:56:03 UTC 2026");
        assert_eq!(unix_date(SystemTime::UNIX_EPOCH), "Thu Jan  1 00:00:00 UTC 1970");
    }
}
