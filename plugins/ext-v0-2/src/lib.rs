//! A test-only extension component built for kpx:proxier 0.2.0 with
//! `kpx_sdk::export_extension_v0_2!`, so that kpx's support of 0.2.0
//! extensions stays tested. Its parameter `do=` picks what it returns:
//! - `count` (the default): a counter `seen` on every port, before dispatch;
//! - `accept`: an accept rule on every port, which 0.2.0 cannot say: the
//!   SDK fails the render, naming it.
//!
//! 0.2.0 has no `check-parameters`: kpx never asks it, so an unknown
//! `do=` fails at render instead.
#![forbid(unsafe_code)]

use kpx_sdk::Settings;
use kpx_sdk::extension::{Action, Attachment, Extension, Rule, State};

struct Old {
    what: String,
}

impl Extension for Old {
    fn new(_: Settings, parameters: Vec<(String, String)>) -> Self {
        let what = parameters.iter().find(|(k, _)| k == "do").map_or("count", |(_, v)| v.as_str()).to_string();
        Old { what }
    }

    fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String> {
        let action = match self.what.as_str() {
            "count" => Action::Continue,
            "accept" => Action::Accept,
            other => return Err(format!("unknown do={other}")),
        };
        Ok(state
            .ports
            .keys()
            .map(|key| Rule {
                attachment: Attachment::BeforeDispatch,
                service: key.clone(),
                source: None,
                over_rate: None,
                counter: Some("seen".into()),
                action,
            })
            .collect())
    }
}

kpx_sdk::export_extension_v0_2!(Old);
