//! The sysctls kpx owns, written under /proc/sys of the namespace kpx runs in.

use std::path::{Path, PathBuf};

use super::{Error, Result};

/// Where sysctls live (a different root in tests).
#[derive(Debug, Clone)]
pub struct Sysctl {
    root: PathBuf,
}

impl Default for Sysctl {
    fn default() -> Self {
        Sysctl { root: PathBuf::from("/proc/sys") }
    }
}

impl Sysctl {
    pub fn with_root(root: impl Into<PathBuf>) -> Sysctl {
        Sysctl { root: root.into() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name.replace('.', "/"))
    }

    pub fn get(&self, name: &str) -> Result<String> {
        let path = self.path(name);
        std::fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(|e| io_err(&path, e))
    }

    /// Sets a value, writing only when it differs.
    pub fn set(&self, name: &str, value: &str) -> Result<()> {
        if self.get(name).ok().as_deref() == Some(value) {
            return Ok(());
        }
        let path = self.path(name);
        std::fs::write(&path, value).map_err(|e| io_err(&path, e))?;
        tracing::info!(sysctl = name, value, "set sysctl");
        Ok(())
    }
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Spawn { program: format!("sysctl {}", path.display()), source }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sets_only_when_different() {
        let dir = std::env::temp_dir().join(format!("kpx-sysctl-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("net/ipv4/conf/all")).unwrap();
        std::fs::write(dir.join("net/ipv4/conf/all/route_localnet"), "0\n").unwrap();
        let s = super::Sysctl::with_root(&dir);
        s.set("net.ipv4.conf.all.route_localnet", "1").unwrap();
        assert_eq!(s.get("net.ipv4.conf.all.route_localnet").unwrap(), "1");
        assert!(s.get("net.ipv4.nope").is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
