//! What kind of component a file holds, read from the `kpx:proxier`
//! interface it exports: what tells a component given to the wrong flag
//! (a scheduler given to `--extension`) from one that is broken.

use std::fmt;

/// A component's kind: the world it is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Scheduler,
    Backend,
    Extension,
}

impl Kind {
    /// The kind whose interface `export` names (`kpx:proxier/backend@0.3.0`:
    /// a backend), whatever its version; None for any other export.
    pub fn of_export(export: &str) -> Option<Kind> {
        let interface = export.split_once('@').map_or(export, |(interface, _)| interface);
        match interface {
            "kpx:proxier/scheduler" => Some(Kind::Scheduler),
            "kpx:proxier/backend" => Some(Kind::Backend),
            "kpx:proxier/extension" => Some(Kind::Extension),
            _ => None,
        }
    }

    /// Whether a component with these exports may be loaded as `expected`:
    /// Err(the kind it is) when it exports another kind's interface and
    /// not this one's. Ok when it exports this kind's interface, or none
    /// kpx knows (linking then says what it lacks).
    pub fn check<'a>(expected: Kind, exports: impl IntoIterator<Item = &'a str>) -> Result<(), Kind> {
        let mut found = None;
        for kind in exports.into_iter().filter_map(Kind::of_export) {
            if kind == expected {
                return Ok(());
            }
            found = found.or(Some(kind));
        }
        match found {
            Some(kind) => Err(kind),
            None => Ok(()),
        }
    }

    /// The flag that gives kpx components of this kind.
    pub fn flag(self) -> &'static str {
        match self {
            Kind::Backend => "--backend-plugin",
            Kind::Scheduler => "--scheduler-plugin",
            Kind::Extension => "--extension",
        }
    }

    /// "a scheduler", "a backend", "an extension".
    pub fn with_article(self) -> &'static str {
        match self {
            Kind::Scheduler => "a scheduler",
            Kind::Backend => "a backend",
            Kind::Extension => "an extension",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Scheduler => "scheduler",
            Kind::Backend => "backend",
            Kind::Extension => "extension",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_is_the_kpx_interface_exported_whatever_its_version() {
        assert_eq!(Kind::of_export("kpx:proxier/scheduler@0.2.0"), Some(Kind::Scheduler));
        assert_eq!(Kind::of_export("kpx:proxier/backend@0.3.0"), Some(Kind::Backend));
        assert_eq!(Kind::of_export("kpx:proxier/backend@0.2.0"), Some(Kind::Backend));
        assert_eq!(Kind::of_export("kpx:proxier/extension@0.2.0"), Some(Kind::Extension));
        assert_eq!(Kind::of_export("kpx:proxier/extension"), Some(Kind::Extension));
        for other in ["kpx:proxier/types@0.2.0", "kpx:proxier/log@0.2.0", "wasi:cli/run@0.2.0", "backend", ""] {
            assert_eq!(Kind::of_export(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_component_of_another_kind_is_told_apart_from_one_that_exports_nothing_known() {
        let scheduler = ["kpx:proxier/types@0.2.0", "kpx:proxier/scheduler@0.2.0"];
        assert_eq!(Kind::check(Kind::Scheduler, scheduler), Ok(()));
        assert_eq!(Kind::check(Kind::Extension, scheduler), Err(Kind::Scheduler));
        assert_eq!(Kind::check(Kind::Backend, scheduler), Err(Kind::Scheduler));
        assert_eq!(Kind::check(Kind::Scheduler, ["kpx:proxier/backend@0.3.0"]), Err(Kind::Backend));
        assert_eq!(Kind::check(Kind::Backend, ["kpx:proxier/extension@0.2.0"]), Err(Kind::Extension));
        // Exporting the expected interface beside another: linking decides.
        assert_eq!(Kind::check(Kind::Backend, ["kpx:proxier/scheduler@0.2.0", "kpx:proxier/backend@0.2.0"]), Ok(()));
        // Nothing kpx knows: not called another kind (linking says what is missing).
        assert_eq!(Kind::check(Kind::Extension, ["wasi:cli/run@0.2.0"]), Ok(()));
        assert_eq!(Kind::check(Kind::Extension, Vec::<&str>::new()), Ok(()));
    }

    #[test]
    fn kinds_are_named_with_their_article() {
        let said: Vec<String> = [Kind::Scheduler, Kind::Backend, Kind::Extension]
            .iter()
            .map(|k| format!("{} / {k}", k.with_article()))
            .collect();
        assert_eq!(said, ["a scheduler / scheduler", "a backend / backend", "an extension / extension"]);
    }
}
